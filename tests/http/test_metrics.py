"""GET /metrics speaks the Prometheus text format; /health and /v1/cache/stats report the engine."""

from __future__ import annotations

import aiohttp

from hybridcache.http.metrics import ServerMetrics
from tests.http.conftest import MODEL, LiveServer
from tests.http.prometheus_text import parse_metrics, sample

HELLO = [{"role": "user", "content": "Hi"}]


def value(samples: dict, name: str, **labels: str) -> float:
    return sample(samples, f"hybridcache:{name}", model_name=MODEL, **labels)


async def get(live: LiveServer, path: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(live.root + path) as reply:
        return reply.status, await reply.text()


async def test_metrics_carry_the_engine_figures_and_the_http_latencies(live: LiveServer):
    live.engine.extra_stats = {"prefix_cache_eviction_events": {"device": 3, "host": 1},
                               "prefix_cache_hit_tokens": {"device": 24, "host": 0},
                               "prefix_cache_query_tokens": 40, "host_tier_bytes": {"kv_live": 4096},
                               "requests_waiting": 2}
    client = live.openai()
    for _ in range(2):
        await client.chat.completions.create(model=MODEL, messages=HELLO, max_tokens=5)
    status, text = await get(live, "/metrics")
    samples = parse_metrics(text)
    assert status == 200
    assert value(samples, "prefix_cache_hit_tokens_total", source="device") == 24
    assert value(samples, "prefix_cache_hit_tokens_total", source="host") == 0
    assert value(samples, "prefix_cache_query_tokens_total") == 40
    assert value(samples, "prefix_cache_eviction_events_total", tier="device") == 3
    assert value(samples, "host_tier_bytes", kind="kv_live") == 4096
    assert value(samples, "host_tier_bytes", kind="snapshot_images") == 0
    assert value(samples, "requests_running") == 0
    assert value(samples, "requests_waiting") == 2
    assert value(samples, "http_requests_finished_total", finish_reason="length") == 2
    assert value(samples, "time_to_first_token_seconds_count") == 2
    assert value(samples, "inter_token_latency_seconds_count") == 8
    assert value(samples, "time_to_first_token_seconds_bucket", le="+Inf") == 2


async def test_refusals_are_counted_by_status(live: LiveServer):
    async with aiohttp.ClientSession() as session:
        await session.post(live.root + "/v1/chat/completions", data=b"{")
    samples = parse_metrics((await get(live, "/metrics"))[1])
    assert value(samples, "http_request_errors_total", status="400") == 1


def test_missing_engine_stats_read_as_zero_and_labels_are_escaped():
    metrics = ServerMetrics(lambda: {"prefix_cache_eviction_events": {"host": 7}}, 'odd"name')
    samples = parse_metrics(metrics.render().decode())
    name = 'odd\\"name'  # as escaped in the text format
    evictions = "hybridcache:prefix_cache_eviction_events_total"
    assert sample(samples, evictions, model_name=name, tier="host") == 7
    assert sample(samples, "hybridcache:requests_running", model_name=name) == 0


def test_each_app_has_its_own_registry():
    first, second = ServerMetrics(dict, "a"), ServerMetrics(dict, "a")
    first.record_error(400)
    assert 'status="400"' in first.render().decode()
    assert 'status="400"' not in second.render().decode()


async def test_health_and_cache_stats(live: LiveServer):
    live.engine.extra_stats = {"host_tier_bytes": {"kv": 1}}
    status, text = await get(live, "/health")
    assert (status, text) == (200, '{"status": "ok"}')
    async with aiohttp.ClientSession() as session, session.get(live.root + "/v1/cache/stats") as reply:
        stats = await reply.json()
    assert stats == {"requests_running": 0, "requests_waiting": 0, "host_tier_bytes": {"kv": 1}}
    live.engine.extra_stats = {"stopping": True}
    assert (await get(live, "/health"))[0] == 503
