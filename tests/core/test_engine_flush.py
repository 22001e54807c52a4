"""A cache flush (`Engine.flush_cache`, behind POST /flush_cache): everything cached goes, a request
running meanwhile keeps its path and finishes with the cold run's tokens, and the cache stays sound."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from hybridcache.core.frontend import Frontend
from tests.core.engine_kit import filler_tokens, generate, start_engine


@pytest.fixture(scope="module")
def frontend(micro_checkpoint: Path) -> Frontend:
    return Frontend.from_dir(micro_checkpoint, 32768)


async def test_a_flush_empties_the_cache_and_the_next_request_starts_cold(micro_checkpoint: Path,
                                                                           frontend: Frontend):
    prompt = frontend.prepare_tokens(filler_tokens(700, seed=3))
    engine = await start_engine(micro_checkpoint, host_cache_mib=64)
    try:
        cold = await generate(engine, prompt, 8)
        assert (await generate(engine, prompt, 8)).accounting.reuse_tokens > 0
        assert await engine.flush_cache() >= 1
        index = engine.cache.index
        assert len(index.nodes) == 1 and not index.snapshots  # the root alone
        assert index.num_free_pages == index.geometry.num_pages
        engine.check_integrity()
        again = await generate(engine, prompt, 8)
        assert again.accounting.reuse_tokens == 0 and again.tokens == cold.tokens
        assert await engine.flush_cache() >= 1 and await engine.flush_cache() == 0
    finally:
        await engine.stop()


async def test_a_request_running_through_a_flush_keeps_its_path_and_its_tokens(micro_checkpoint: Path,
                                                                                 frontend: Frontend):
    shared = filler_tokens(640, seed=4)
    other = frontend.prepare_tokens(filler_tokens(500, seed=5))
    running_prompt = frontend.prepare_tokens(shared + filler_tokens(200, seed=6))
    engine = await start_engine(micro_checkpoint, host_cache_mib=64)
    try:
        cold = await generate(engine, running_prompt, 160)
        await generate(engine, other, 4)
        await generate(engine, frontend.prepare_tokens(shared), 4)  # the running request resumes here
        running = asyncio.create_task(generate(engine, running_prompt, 160))
        while engine.stats()["requests_running"] == 0:
            await asyncio.sleep(0.001)
        await engine.flush_cache()
        assert engine.stats()["requests_running"] == 1
        held = {node.id for node in engine.cache.index.nodes.values()}
        assert len(held) > 1  # the running request's path stayed
        engine.check_integrity()
        assert (await running).tokens == cold.tokens
        assert (await generate(engine, other, 4)).accounting.reuse_tokens == 0  # not held: it went
        engine.check_integrity()
    finally:
        await engine.stop()
