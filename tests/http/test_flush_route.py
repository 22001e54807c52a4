"""POST /flush_cache: the route routers call to empty a replica's prefix cache."""

from __future__ import annotations

import aiohttp

from tests.http.conftest import MODEL, LiveServer, StartServer


async def test_a_flush_forgets_what_was_cached(live: LiveServer):
    body = {"model": MODEL, "prompt": "x " * 300, "max_tokens": 2}
    async with aiohttp.ClientSession() as session:
        async with session.post(live.root + "/v1/completions", json=body) as first:
            assert first.status == 200
        async with session.post(live.root + "/flush_cache") as flushed:
            assert flushed.status == 200
            answer = await flushed.json()
        assert answer["flushed_subtrees"] > 0 and answer["requests_running"] == 0
        async with session.post(live.root + "/v1/completions", json=body) as again:
            usage = (await again.json())["usage"]
    assert usage.get("prompt_tokens_details", {}).get("cached_tokens", 0) == 0


async def test_a_flush_needs_the_key_and_a_stopping_engine_answers_503(start_server: StartServer):
    live = await start_server(api_keys=("k1",))
    async with aiohttp.ClientSession() as session:
        async with session.post(live.root + "/flush_cache") as anonymous:
            assert anonymous.status == 401
        async with session.post(live.root + "/flush_cache", headers={"Authorization": "Bearer k1"}) as keyed:
            assert keyed.status == 200
        live.engine.stopping = True
        async with session.post(live.root + "/flush_cache", headers={"Authorization": "Bearer k1"}) as late:
            assert late.status == 503
            assert (await late.json())["error"]["code"] == "unavailable"
