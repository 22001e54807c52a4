"""GET /metrics speaks the Prometheus text format; /health and /v1/cache/stats report the engine."""

from __future__ import annotations

import re

import aiohttp

from hybridcache.http.metrics import Histogram, ServerMetrics, render_prometheus
from tests.http.conftest import MODEL, LiveServer

LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="(?:[^"\\\n]|\\.)*"'
SAMPLE = re.compile(rf'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(\{{(?P<labels>{LABEL}(,{LABEL})*)\}})? '
                    r'(?P<value>[-+]?(\d+(\.\d*)?(e[-+]?\d+)?|\+Inf|NaN))$')
COMMENT = re.compile(r"^# (HELP|TYPE) [a-zA-Z_:][a-zA-Z0-9_:]* .+$")
HELLO = [{"role": "user", "content": "Hi"}]


def parse_metrics(text: str) -> dict[str, float]:
    """Every line is a comment or a sample; returns {"name{labels}": value}. Fails on anything else."""
    samples = {}
    for line in text.strip().split("\n"):
        if line.startswith("#"):
            assert COMMENT.match(line), line
            continue
        found = SAMPLE.match(line)
        assert found, f"not a Prometheus sample: {line!r}"
        labels = found.group("labels")
        samples[found.group("name") + (f"{{{labels}}}" if labels else "")] = float(found.group("value"))
    return samples


def value(samples: dict[str, float], name: str, **labels: str) -> float:
    label_text = ",".join([f'model_name="{MODEL}"', *(f'{key}="{val}"' for key, val in labels.items())])
    return samples[f"hybridcache:{name}{{{label_text}}}"]


async def get(live: LiveServer, path: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(live.root + path) as reply:
        return reply.status, await reply.text()


async def test_metrics_count_cache_hits_latencies_and_engine_gauges(live: LiveServer):
    live.engine.reuse_override = 12
    live.engine.extra_stats = {"evictions": {"device": 3, "host": 1}, "host_tier_bytes": {"kv": 4096},
                               "requests_waiting": 2}
    client = live.openai()
    for _ in range(2):
        await client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=5)
    status, text = await get(live, "/metrics")
    samples = parse_metrics(text)
    assert status == 200
    prompt_tokens = live.engine.last.prompt.num_tokens
    assert value(samples, "prefix_cache_hits_total") == 24
    assert value(samples, "prefix_cache_queries_total") == 2 * prompt_tokens
    assert value(samples, "prefix_cache_cached_tokens_total", source="device") == 24
    assert value(samples, "prefix_cache_cached_tokens_total", source="host") == 0
    assert value(samples, "prefix_cache_evictions_total", tier="device") == 3
    assert value(samples, "host_tier_bytes", kind="kv") == 4096
    assert value(samples, "host_tier_bytes", kind="snapshot") == 0
    assert value(samples, "num_requests_running") == 0
    assert value(samples, "num_requests_waiting") == 2
    assert value(samples, "generation_tokens_total") == 10
    assert value(samples, "request_success_total", finished_reason="length") == 2
    assert samples["hybridcache:time_to_first_token_seconds_count"] == 2
    assert samples["hybridcache:inter_token_latency_seconds_count"] == 8
    assert samples['hybridcache:time_to_first_token_seconds_bucket{le="+Inf"}'] == 2


async def test_refusals_are_counted_by_status(live: LiveServer):
    async with aiohttp.ClientSession() as session:
        await session.post(live.root + "/v1/chat/completions", data=b"{")
    samples = parse_metrics((await get(live, "/metrics"))[1])
    assert value(samples, "request_errors_total", status="400") == 1


def test_histogram_buckets_are_cumulative():
    histogram = Histogram((0.1, 1.0))
    for seconds in (0.05, 0.5, 0.5, 3.0):
        histogram.observe(seconds)
    lines = histogram.lines("x")
    assert lines[:3] == ['x_bucket{le="0.1"} 1', 'x_bucket{le="1"} 3', 'x_bucket{le="+Inf"} 4']
    assert lines[-1] == "x_count 4"


def test_missing_engine_stats_read_as_zero_and_flat_keys_work():
    text = render_prometheus(ServerMetrics(), {"evictions_host": 7}, 'odd"name')
    samples = parse_metrics(text)
    assert samples['hybridcache:prefix_cache_evictions_total{model_name="odd\\"name",tier="host"}'] == 7
    assert samples['hybridcache:num_requests_running{model_name="odd\\"name"}'] == 0


async def test_health_and_cache_stats(live: LiveServer):
    live.engine.extra_stats = {"host_tier_bytes": {"kv": 1}}
    status, text = await get(live, "/health")
    assert (status, text) == (200, '{"status": "ok"}')
    async with aiohttp.ClientSession() as session, session.get(live.root + "/v1/cache/stats") as reply:
        stats = await reply.json()
    assert stats == {"requests_running": 0, "requests_waiting": 0, "host_tier_bytes": {"kv": 1}}
    live.engine.extra_stats = {"stopping": True}
    assert (await get(live, "/health"))[0] == 503
