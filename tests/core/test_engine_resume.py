"""Exact resume (spec §13.3): a resumed request produces what a cold one produces, from the device and
from host slabs; multi-turn endpoints; re-rendered history; edits deep in history."""

from __future__ import annotations

from pathlib import Path

import pytest

from hybridcache.cache.ids import BLOCK_TOKENS
from hybridcache.cache.records import SnapshotKind
from hybridcache.core.frontend import Frontend
from tests.core.engine_kit import (
    filler_tokens,
    generate,
    snapshot_frontiers,
    start_engine,
)


@pytest.fixture(scope="module")
def frontend(micro_checkpoint: Path) -> Frontend:
    return Frontend.from_dir(micro_checkpoint, 32768)


async def cold_run(model_dir: Path, frontend: Frontend, tokens: list[int], max_tokens: int = 64):
    engine = await start_engine(model_dir, prefix_reuse=False)
    try:
        return await generate(engine, frontend.prepare_tokens(tokens), max_tokens)
    finally:
        await engine.stop()


async def test_a_device_resume_matches_a_cold_run(micro_checkpoint: Path, frontend: Frontend):
    prompt = filler_tokens(900, seed=1)
    cold = await cold_run(micro_checkpoint, frontend, prompt)
    engine = await start_engine(micro_checkpoint, host_cache_mib=64, device_snapshot_copies=True)
    try:
        first = await generate(engine, frontend.prepare_tokens(prompt), 8)
        assert first.accounting.source == "root"
        resumed = await generate(engine, frontend.prepare_tokens(prompt), 64)
        assert resumed.accounting.source == "device"
        # the prompt-tail tap sits at n - 1 (inside a block: it keeps a pending tail of layer inputs)
        assert resumed.accounting.reuse_tokens == len(prompt) - 1
        assert resumed.tokens == cold.tokens
        assert resumed.first_logprobs == cold.first_logprobs
    finally:
        await engine.stop()


async def test_a_host_only_resume_matches_a_cold_run(micro_checkpoint: Path, frontend: Frontend):
    prompt = filler_tokens(700, seed=2)
    cold = await cold_run(micro_checkpoint, frontend, prompt)
    # a small device pool and one snapshot slot: later traffic pushes the first prompt to host slabs
    engine = await start_engine(
        micro_checkpoint, pages=40, lanes=1, host_cache_mib=64, device_snapshot_slots=1
    )
    try:
        await generate(engine, frontend.prepare_tokens(prompt), 4)
        for seed in range(10, 14):
            await generate(engine, frontend.prepare_tokens(filler_tokens(700, seed=seed)), 4)
        resumed = await generate(engine, frontend.prepare_tokens(prompt), 64)
        assert resumed.accounting.source == "host"
        assert resumed.accounting.restored_host_bytes > 0
        assert resumed.accounting.reuse_tokens >= 640
        assert resumed.tokens == cold.tokens
        assert resumed.first_logprobs == cold.first_logprobs
        assert engine.stats()["prefix_cache_eviction_events"]["device"] > 0
        assert engine.stats()["host_tier_written_back_blocks"] > 0  # the path reached the host on eviction
    finally:
        await engine.stop()


async def test_the_next_turn_resumes_exactly_at_the_endpoint(micro_checkpoint: Path, frontend: Frontend):
    engine = await start_engine(micro_checkpoint, host_cache_mib=64)
    try:
        turn1 = filler_tokens(300, seed=3)
        first = await generate(engine, frontend.prepare_tokens(turn1), 100)  # >= 64 past the tail tap
        endpoint = len(turn1) + len(first.tokens) - 1  # the last sampled token is not computed
        assert endpoint in snapshot_frontiers(engine, SnapshotKind.ENDPOINT)
        turn2 = turn1 + first.tokens + filler_tokens(50, seed=4)  # an agent echoing its output
        second = await generate(engine, frontend.prepare_tokens(turn2), 8)
        assert second.accounting.reuse_tokens == endpoint
        assert endpoint % BLOCK_TOKENS != 0  # the endpoint's tail page was copied into the lane, not shared
        again = await generate(engine, frontend.prepare_tokens(turn2), 8)
        assert again.tokens == second.tokens
    finally:
        await engine.stop()


async def test_re_rendered_history_resumes_from_the_opener_tap(micro_checkpoint: Path, frontend: Frontend):
    engine = await start_engine(micro_checkpoint, host_cache_mib=64)
    try:
        messages = [
            {"role": "system", "content": "Answer in one word. " * 20},
            {"role": "user", "content": "Name a colour, any colour you like, please. " * 3},
        ]
        prompt1 = frontend.prepare_chat(messages)
        first = await generate(engine, prompt1, 12)
        opener = max(p for p, kind in prompt1.tap_hints if kind == 2)
        reply = frontend.tokenizer.decode(first.tokens, skip_special_tokens=True)
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": "Another."}]
        second = await generate(engine, frontend.prepare_chat(messages), 4)
        assert second.accounting.reuse_tokens == opener  # the tap lies at the opener's token
    finally:
        await engine.stop()


async def test_an_edit_deep_in_history_resumes_from_the_deepest_ladder_tap(
    micro_checkpoint: Path, frontend: Frontend
):
    engine = await start_engine(micro_checkpoint, chunk=256, host_cache_mib=64)
    try:
        history = filler_tokens(9000, seed=5)
        await generate(engine, frontend.prepare_tokens(history), 2)
        taps = snapshot_frontiers(engine, SnapshotKind.TAP)
        assert len(taps) >= 2, taps
        edit_at = 6000
        edited = [*history[:edit_at], 33, *history[edit_at + 1 :]]
        resumed = await generate(engine, frontend.prepare_tokens(edited), 2)
        assert resumed.accounting.reuse_tokens == max(f for f in taps if f <= edit_at)
    finally:
        await engine.stop()


async def test_on_a_cpu_a_snapshot_keeps_one_copy_and_its_resume_from_the_host_is_exact(
    micro_checkpoint: Path, frontend: Frontend
):
    """A CPU's snapshot slots and host slabs are one memory: once a snapshot's host image lands, its device
    copy is dropped and the slot's pages are given back; the resume then reads the host image."""
    prompt = filler_tokens(900, seed=3)
    cold = await cold_run(micro_checkpoint, frontend, prompt)
    engine = await start_engine(micro_checkpoint, host_cache_mib=64)
    assert not engine.runtime.keep_device_snapshot_copies  # the default on a CPU
    released = []
    release = engine.runtime.states.release_pages
    engine.runtime.states.release_pages = lambda slot: released.append(slot) or release(slot)
    try:
        await generate(engine, frontend.prepare_tokens(prompt), 8)
        await engine._worker.drain_transfers()
        stats = engine.stats()
        assert stats["prefix_cache_snapshots"] >= 1
        assert stats["slots_snapshot"] == 0  # no device copy left beside the host images
        assert stats["host_tier_bytes"]["snapshot_images"] > 0
        assert released  # the freed slots' pages went back to the system
        resumed = await generate(engine, frontend.prepare_tokens(prompt), 64)
        assert resumed.accounting.source == "host"
        assert resumed.accounting.reuse_tokens == len(prompt) - 1  # the tail, exact inside its block
        assert resumed.tokens == cold.tokens
        assert resumed.first_logprobs == cold.first_logprobs
    finally:
        await engine.stop()
