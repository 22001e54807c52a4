"""Server metrics in the Prometheus text format (``GET /metrics``).

Two sources:

- measured here, per request, by the handlers (`ServerMetrics`): prefix-cache queries and hits in prompt
  tokens (from each request's admission accounting, so they equal what clients see as cached tokens),
  reused tokens by source (device / host), finished requests by reason, prompt and generated tokens,
  request errors by status, and the time-to-first-token and inter-token-latency histograms;
- read from ``engine.stats()`` at scrape time (missing keys read as 0; a nested dict or flat
  ``name_label`` keys both work):

  ========================  ==========================================================
  ``requests_running``      requests holding a lane
  ``requests_waiting``      requests queued for admission
  ``evictions``             {tier: count}, tiers ``device`` and ``host`` (cumulative)
  ``host_tier_bytes``       {kind: bytes}, kinds ``kv`` and ``snapshot`` (current)
  ``host_tier_capacity_bytes``  the host tier's size
  ``journal_write_errors``  failed writes of the event journal (cumulative; 0 without --event-log)
  ========================  ==========================================================

`ServerMetrics` mutates only itself (one per app, on the event loop); rendering is pure.
"""

from __future__ import annotations

import bisect
import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

from hybridcache.core.api import RequestAccounting

PREFIX = "hybridcache:"
TTFT_BUCKETS_S = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
                  10.0, 20.0, 40.0, 80.0)
ITL_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.015, 0.02, 0.025, 0.03, 0.04, 0.05, 0.075, 0.1, 0.15, 0.2,
                 0.3, 0.4, 0.5, 0.75, 1.0, 2.5)
CACHE_SOURCES = ("device", "host")
EVICTION_TIERS = ("device", "host")
HOST_BYTE_KINDS = ("kv", "snapshot")


class Histogram:
    """Cumulative-bucket histogram of seconds. `observe` mutates."""

    def __init__(self, bounds: Sequence[float]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)  # the last slot is +Inf
        self.total = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += 1
        self.total += value

    @property
    def count(self) -> int:
        return sum(self.counts)

    def lines(self, name: str) -> list[str]:
        """The `_bucket`, `_sum` and `_count` sample lines. Pure."""
        lines, running = [], 0
        for bound, count in zip((*self.bounds, math.inf), self.counts):
            running += count
            lines.append(f'{name}_bucket{{le="{_number(bound)}"}} {running}')
        lines.append(f"{name}_sum {_number(self.total)}")
        lines.append(f"{name}_count {running}")
        return lines


class ServerMetrics:
    """Counters and histograms the handlers feed. Mutates itself; used from the event loop only."""

    def __init__(self) -> None:
        self.prefix_queries_tokens = 0
        self.prefix_hit_tokens = 0
        self.prefix_hit_requests = 0
        self.cached_tokens_by_source: Counter[str] = Counter()
        self.prompt_tokens = 0
        self.generation_tokens = 0
        self.finished_by_reason: Counter[str] = Counter()
        self.errors_by_status: Counter[int] = Counter()
        self.ttft = Histogram(TTFT_BUCKETS_S)
        self.itl = Histogram(ITL_BUCKETS_S)

    def record_admission(self, accounting: RequestAccounting) -> None:
        """Count one admitted request's prompt and reuse."""
        self.prefix_queries_tokens += accounting.prompt_tokens
        self.prompt_tokens += accounting.prompt_tokens
        if accounting.reuse_tokens > 0:
            self.prefix_hit_tokens += accounting.reuse_tokens
            self.prefix_hit_requests += 1
            self.cached_tokens_by_source[accounting.source] += accounting.reuse_tokens

    def record_finish(self, reason: str, output_tokens: int) -> None:
        self.finished_by_reason[reason] += 1
        self.generation_tokens += output_tokens

    def record_error(self, status: int) -> None:
        self.errors_by_status[status] += 1

    def observe_ttft(self, seconds: float) -> None:
        self.ttft.observe(seconds)

    def observe_itl(self, seconds: float) -> None:
        self.itl.observe(seconds)


def render_prometheus(metrics: ServerMetrics, engine_stats: Mapping[str, object], model_name: str) -> str:
    """The Prometheus text exposition of `metrics` and `engine_stats`. Pure."""
    model = f'model_name="{_escape(model_name)}"'
    out: list[str] = []
    _family(out, "prefix_cache_queries_total", "counter", "Prompt tokens looked up in the prefix cache.",
            [(model, metrics.prefix_queries_tokens)])
    _family(out, "prefix_cache_hits_total", "counter", "Prompt tokens reused from the prefix cache.",
            [(model, metrics.prefix_hit_tokens)])
    _family(out, "prefix_cache_hit_requests_total", "counter", "Requests that reused at least one token.",
            [(model, metrics.prefix_hit_requests)])
    _family(out, "prefix_cache_cached_tokens_total", "counter",
            "Reused prompt tokens by where they came from.",
            [(f'{model},source="{source}"', metrics.cached_tokens_by_source[source]) for source in
             _labels(CACHE_SOURCES, metrics.cached_tokens_by_source)])
    _family(out, "prefix_cache_evictions_total", "counter", "Cache evictions by tier (from the engine).",
            [(f'{model},tier="{tier}"', value) for tier, value in
             _labelled_stat(engine_stats, "evictions", EVICTION_TIERS)])
    _family(out, "host_tier_bytes", "gauge", "Host tier bytes in use by kind (from the engine).",
            [(f'{model},kind="{kind}"', value) for kind, value in
             _labelled_stat(engine_stats, "host_tier_bytes", HOST_BYTE_KINDS)])
    _family(out, "host_tier_capacity_bytes", "gauge", "Host tier size in bytes (from the engine).",
            [(model, _stat(engine_stats, "host_tier_capacity_bytes"))])
    _family(out, "journal_write_errors_total", "counter",
            "Failed writes of the event journal (--event-log); journaling stops at the first.",
            [(model, _stat(engine_stats, "journal_write_errors"))])
    _family(out, "num_requests_running", "gauge", "Requests holding a lane.",
            [(model, _stat(engine_stats, "requests_running"))])
    _family(out, "num_requests_waiting", "gauge", "Requests waiting for admission.",
            [(model, _stat(engine_stats, "requests_waiting"))])
    _family(out, "prompt_tokens_total", "counter", "Prompt tokens of admitted requests.",
            [(model, metrics.prompt_tokens)])
    _family(out, "generation_tokens_total", "counter", "Generated tokens.",
            [(model, metrics.generation_tokens)])
    _family(out, "request_success_total", "counter", "Finished requests by finish reason.",
            [(f'{model},finished_reason="{_escape(reason)}"', count)
             for reason, count in sorted(metrics.finished_by_reason.items())])
    _family(out, "request_errors_total", "counter", "Refused requests by HTTP status.",
            [(f'{model},status="{status}"', count)
             for status, count in sorted(metrics.errors_by_status.items())])
    _histogram(out, "time_to_first_token_seconds", "Time from request arrival to its first token.",
               metrics.ttft)
    _histogram(out, "inter_token_latency_seconds", "Time between consecutive token outputs.", metrics.itl)
    return "\n".join(out) + "\n"


def _family(out: list[str], name: str, kind: str, help_text: str,
            samples: Iterable[tuple[str, float | int]]) -> None:
    full = PREFIX + name
    out.append(f"# HELP {full} {help_text}")
    out.append(f"# TYPE {full} {kind}")
    out.extend(f"{full}{{{labels}}} {_number(value)}" for labels, value in samples)


def _histogram(out: list[str], name: str, help_text: str, histogram: Histogram) -> None:
    full = PREFIX + name
    out.append(f"# HELP {full} {help_text}")
    out.append(f"# TYPE {full} histogram")
    out.extend(histogram.lines(full))


def _labels(known: Sequence[str], counts: Mapping[str, int]) -> list[str]:
    return list(known) + sorted(label for label in counts if label not in known)


def _stat(stats: Mapping[str, object], name: str) -> float:
    return _as_number(stats.get(name, 0))


def _labelled_stat(stats: Mapping[str, object], name: str, known: Sequence[str]) -> list[tuple[str, float]]:
    """(label, value) pairs of a nested ``{name: {label: value}}`` or flat ``name_label`` stat."""
    nested = stats.get(name)
    if isinstance(nested, Mapping):
        labels = list(known) + sorted(str(label) for label in nested if label not in known)
        return [(_escape(label), _as_number(nested.get(label, 0))) for label in labels]
    return [(label, _as_number(stats.get(f"{name}_{label}", 0))) for label in known]


def _as_number(value: object) -> float:
    if isinstance(value, bool):
        return float(value)
    return float(value) if isinstance(value, int | float) else 0.0


def _number(value: float) -> str:
    if math.isinf(value):
        return "+Inf"
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
