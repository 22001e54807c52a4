"""/health and /metrics report a failed event journal without taking the replica out of rotation."""

from __future__ import annotations

from tests.http.conftest import LiveServer
from tests.http.test_metrics import get, parse_metrics, value

JOURNAL_FAILED = {"journal_write_errors": 1, "journal_error": "event journal /x/events.log: disk full"}


async def test_health_is_ok_and_the_counter_zero_while_the_journal_works(live: LiveServer):
    live.engine.extra_stats = {"journal_write_errors": 0, "journal_error": None}
    status, body = await get(live, "/health")
    assert (status, body) == (200, '{"status": "ok"}')
    _, text = await get(live, "/metrics")
    assert value(parse_metrics(text), "journal_write_errors_total") == 0


async def test_a_failed_journal_degrades_health_but_keeps_200_and_counts_in_metrics(live: LiveServer):
    live.engine.extra_stats = dict(JOURNAL_FAILED)
    status, body = await get(live, "/health")
    assert status == 200
    assert '"status": "degraded"' in body and "disk full" in body
    _, text = await get(live, "/metrics")
    assert value(parse_metrics(text), "journal_write_errors_total") == 1


async def test_stopping_wins_over_degraded(live: LiveServer):
    live.engine.extra_stats = {**JOURNAL_FAILED, "stopping": True}
    status, _ = await get(live, "/health")
    assert status == 503


async def test_a_cache_directory_that_stopped_writing_degrades_health_too(live: LiveServer):
    live.engine.extra_stats = {"cache_dir_error": "cache directory: [Errno 28] No space left on device"}
    status, body = await get(live, "/health")
    assert status == 200
    assert '"status": "degraded"' in body and "No space left" in body
