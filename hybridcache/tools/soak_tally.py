"""The soak bench's bookkeeping: requests by outcome, and the verdict against the issue's Done-when.

Outcomes (one per request the clients made):
- `ok`: a well-formed request answered 200 with a complete body (a stream ended properly);
- `expected_4xx`: a deliberately bad request refused with a 4xx (other than 429);
- `rate_limited`: 429 (the waiting cap; clients back off);
- `cancelled`: the client gave up while the prompt was being prefilled (or queued);
- `disconnected`: the client dropped the connection mid-decode (a stream closed, or a blocking request
  abandoned);
- `unexpected_5xx`: any 5xx, or an error frame of a server kind inside a stream;
- `unexpected_4xx`: a well-formed request refused with a 4xx other than 429 (or an error frame of a
  client kind inside its stream);
- `bad_input_accepted`: a deliberately bad request answered 2xx;
- `transport_error`: the connection failed, timed out, or the body could not be read or parsed;
- `wrong_reply`: a repeated greedy request whose reply differs from the first time (cache reuse is
  exact, so the cached path must give the cold path's tokens).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

OUTCOMES = (
    "ok", "expected_4xx", "rate_limited", "cancelled", "disconnected", "unexpected_5xx", "unexpected_4xx",
    "bad_input_accepted", "transport_error", "wrong_reply",
)
FAILURES = ("unexpected_5xx", "unexpected_4xx", "bad_input_accepted", "transport_error", "wrong_reply")
EXAMPLES_KEPT = 5
# Figures that hold something a request owns: all 0 once every client stopped and transfers drained.
HELD_WHEN_BUSY = ("pinned_blocks", "pinned_snapshots", "cache_lanes", "lane_private_pages", "slots_active",
                  "slots_staging", "restores_in_flight", "host_writes_in_flight", "requests_running",
                  "requests_waiting")


@dataclass
class Tally:
    """Counts by outcome and by request kind, with the first few failures kept for the report.
    Mutated by the clients (one event loop, no locking needed)."""

    outcomes: Counter[str] = field(default_factory=Counter)
    kinds: Counter[str] = field(default_factory=Counter)
    examples: list[str] = field(default_factory=list)

    def count(self, kind: str, outcome: str, detail: str = "") -> None:
        """Record one request of `kind` that ended as `outcome` (one of OUTCOMES)."""
        assert outcome in OUTCOMES, outcome
        self.outcomes[outcome] += 1
        self.kinds[kind] += 1
        if outcome in FAILURES and len(self.examples) < EXAMPLES_KEPT:
            self.examples.append(f"{outcome} {kind}: {detail}"[:400])

    @property
    def total(self) -> int:
        return sum(self.outcomes.values())


@dataclass
class Verdict:
    """What the end of a soak found; `failures` names every Done-when condition that does not hold."""

    failures: list[str] = field(default_factory=list)

    def require(self, holds: bool, condition: str) -> None:
        if not holds:
            self.failures.append(condition)

    @property
    def passed(self) -> bool:
        return not self.failures


def judge(tally: Tally, rss_growth_percent: float, max_rss_growth_percent: float, integrity: dict,
          idle_stats: dict, lanes: int, served_after: bool) -> Verdict:
    """The Done-when of issue 18 §3, plus what the soak itself must see to mean anything. Pure."""
    verdict = Verdict()
    for outcome in FAILURES:
        verdict.require(tally.outcomes[outcome] == 0, f"{outcome} = {tally.outcomes[outcome]} (must be 0)")
    verdict.require(tally.outcomes["ok"] > 0, "no request succeeded")
    verdict.require(rss_growth_percent <= max_rss_growth_percent,
                    f"RSS grew {rss_growth_percent:.1f} % after warm-up "
                    f"(at most {max_rss_growth_percent:g} %)")
    verdict.require(integrity.get("clean") is True, f"integrity: {integrity.get('problem', integrity)}")
    for key in HELD_WHEN_BUSY:
        verdict.require(idle_stats.get(key) == 0, f"leak: {key} = {idle_stats.get(key)} when idle")
    verdict.require(idle_stats.get("worker_lanes_free") == lanes,
                    f"leak: {idle_stats.get('worker_lanes_free')} of {lanes} engine lanes free when idle")
    verdict.require(served_after, "the server did not serve a request after the soak")
    return verdict
