"""/metrics and /v1/cache/stats agree: after the same requests on a live server, every engine figure has
one name and one value in both (the Prometheus name adds `hybridcache:` and `_total` for counters), and
the cache figures add up to what the clients saw in `usage`."""

from __future__ import annotations

import time
from collections.abc import Iterator

import pytest

from hybridcache.http.engine_metrics import COUNTERS, GAUGES, PREFIX
from tests.http.prometheus_text import parse_metrics, sample
from tests.http.server_process import ServerProcess

# The loop-stall figures (core/loop_stall.py) keep moving while the server idles: a probe wake-up that
# comes late on a loaded machine may set a new longest stall between two reads.
STALL_PREFIX = "worker_stall"
MONOTONE_STALL_FIGURES = ("worker_stall_max_seconds", "worker_stalls_over_100ms")

PREAMBLE = "A shared preamble that several requests start with, long enough to span blocks. " * 6


@pytest.fixture
def server(micro_checkpoint) -> Iterator[ServerProcess]:
    process = ServerProcess("--model", str(micro_checkpoint), "--served-model-name", "micro")
    yield process
    process.stop()


def settled_stats(server: ServerProcess, timeout_s: float = 10.0) -> dict:
    """/v1/cache/stats once no request runs, no host write is in flight and no idle-time work is left."""
    deadline = time.monotonic() + timeout_s
    while True:
        _, stats = server.get("/v1/cache/stats")
        busy = ("requests_running", "host_writes_in_flight", "endpoint_refills_running")
        idle = not any(stats[name] for name in busy) and not stats["endpoint_refills_pending"]
        if idle or time.monotonic() > deadline:
            return stats
        time.sleep(0.05)


def test_metrics_and_cache_stats_report_the_same_figures_under_the_same_names(server: ServerProcess):
    usages = []
    for suffix in ("first question", "second question", "third question", "first question"):
        status, body = server.post(
            "/v1/completions", {"model": "micro", "prompt": PREAMBLE + suffix, "max_tokens": 4}
        )
        assert status == 200, body
        usages.append(body["usage"])
    stats = settled_stats(server)
    samples = parse_metrics(server.get_text("/metrics"))
    after = server.get("/v1/cache/stats")[1]
    steady = {key: value for key, value in after.items() if not key.startswith(STALL_PREFIX)}
    assert steady == {key: stats[key] for key in steady}, "the figures moved while the test read them"

    for figure, suffix in [*((f, "_total") for f in COUNTERS), *((f, "") for f in GAUGES)]:
        assert figure.key in stats, f"the engine no longer reports {figure.key}"
        name = PREFIX + figure.key + suffix
        reported = stats[figure.key]
        if figure.key.startswith(STALL_PREFIX):  # a longer stall may come between the reads
            value = sample(samples, name, model_name="micro")
            if figure.key in MONOTONE_STALL_FIGURES:
                assert reported <= value <= after[figure.key], figure.key
            else:  # CPU times of the stall that was longest when /metrics was read: may match neither read
                assert value >= 0.0 and reported >= 0.0, figure.key
        elif figure.label is None:
            assert sample(samples, name, model_name="micro") == reported, figure.key
        else:
            for label, value in reported.items():
                assert sample(samples, name, model_name="micro", **{figure.label: label}) == value

    cached = sum(usage["prompt_tokens_details"]["cached_tokens"] for usage in usages)
    assert cached > 0
    assert stats["prefix_cache_query_requests"] == len(usages)
    assert stats["prefix_cache_query_tokens"] == sum(usage["prompt_tokens"] for usage in usages)
    assert sum(stats["prefix_cache_hit_tokens"].values()) == cached
    reusing = sum(1 for usage in usages if usage["prompt_tokens_details"]["cached_tokens"] > 0)
    assert stats["prefix_cache_hit_requests"] == reusing
    assert stats["prefill_tokens"] == stats["prefix_cache_query_tokens"] - cached
