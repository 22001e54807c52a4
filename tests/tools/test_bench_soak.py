"""`hybridcache bench soak`: a few seconds of two clients against a tiny server pass every check, and the
verdict names each Done-when condition that fails."""

from __future__ import annotations

from pathlib import Path

from hybridcache.tools.bench_soak import SoakSettings, run_soak
from hybridcache.tools.soak_tally import HELD_WHEN_BUSY, Tally, judge

IDLE = {**dict.fromkeys(HELD_WHEN_BUSY, 0), "worker_lanes_free": 4}


async def test_a_short_soak_passes_and_reports_every_figure(tiny_checkpoint: Path, tmp_path: Path):
    lines: list[str] = []
    settings = SoakSettings(checkpoint=tiny_checkpoint, workdir=tmp_path, minutes=0.15, clients=2,
                            warmup_s=3.0, require_eviction=False, max_rss_growth_percent=50.0, seed=3)
    result = await run_soak(settings, report=lines.append)
    assert result.passed, "\n".join(lines)
    figures = result.figures
    assert figures["outcome_ok"] > 0 and figures["unexpected_5xx"] == 0
    assert figures["integrity"] == "clean"
    assert all(figures[key] == 0 for key in HELD_WHEN_BUSY)
    assert figures["worker_lanes_free"] == settings.lanes
    assert figures["rss_warmup_mib"] > 0 and figures["rss_end_mib"] > 0
    assert figures["worker_stall_max_seconds"] is not None
    assert figures["server_exit_code"] == 0
    assert lines[-1] == "verdict=pass"


def test_the_verdict_names_each_failed_condition():
    tally = Tally()
    tally.count("chat_turn", "ok")
    tally.count("chat_turn", "unexpected_5xx", "status 500")
    tally.count("repeat", "wrong_reply", "first 'a', now 'b'")
    leaked = {**IDLE, "pinned_blocks": 3, "worker_lanes_free": 3}
    verdict = judge(tally, rss_growth_percent=7.5, max_rss_growth_percent=5.0,
                    integrity={"clean": False, "problem": "node 4: active_refs 1"}, idle_stats=leaked,
                    lanes=4, served_after=False)
    assert not verdict.passed
    assert verdict.failures == [
        "unexpected_5xx = 1 (must be 0)",
        "wrong_reply = 1 (must be 0)",
        "RSS grew 7.5 % after warm-up (at most 5 %)",
        "integrity: node 4: active_refs 1",
        "leak: pinned_blocks = 3 when idle",
        "leak: 3 of 4 engine lanes free when idle",
        "the server did not serve a request after the soak",
    ]
    assert tally.examples == ["unexpected_5xx chat_turn: status 500",
                              "wrong_reply repeat: first 'a', now 'b'"]


def test_a_clean_run_passes():
    tally = Tally()
    tally.count("chat_turn", "ok")
    tally.count("bad:wrong_api_key", "expected_4xx")
    verdict = judge(tally, 1.0, 5.0, {"clean": True}, IDLE, lanes=4, served_after=True)
    assert verdict.passed and verdict.failures == []
