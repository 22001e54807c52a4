"""Engine scenarios (spec §13.3): shared preambles, concurrency, cancellation, pressure, device-only
cache, disabled requests, faults, timeouts, orderly stop. The engine checks integrity after every unit."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from hybridcache.cache.ids import BLOCK_TOKENS
from hybridcache.core.api import RequestError
from hybridcache.core.frontend import Frontend
from hybridcache.core.sampling_params import SamplingParams
from tests.core.engine_kit import filler_tokens, generate, start_engine


@pytest.fixture(scope="module")
def frontend(micro_checkpoint: Path) -> Frontend:
    return Frontend.from_dir(micro_checkpoint, 32768)


def preamble_nodes(engine, preamble_blocks: int) -> int:
    return sum(
        1
        for node in engine.cache.index.nodes.values()
        if node.parent is not None and node.depth < preamble_blocks
    )


async def test_eight_sessions_share_one_preamble(micro_checkpoint: Path, frontend: Frontend):
    engine = await start_engine(micro_checkpoint, host_cache_mib=64)
    try:
        preamble = filler_tokens(1024, seed=20)
        results = []
        for session in range(8):
            prompt = frontend.prepare_tokens(preamble + filler_tokens(100 + session, seed=30 + session))
            results.append(await generate(engine, prompt, 2))
        assert results[0].accounting.reuse_tokens == 0
        # the lone first request tapped only its own tail; its blocks still serve as a match, and every
        # later session finds at least the preamble's blocks cached (counted once in the tree)
        assert all(r.accounting.cached_prefix_tokens >= 1024 for r in results[1:])
        assert preamble_nodes(engine, 1024 // BLOCK_TOKENS) == 1024 // BLOCK_TOKENS
    finally:
        await engine.stop()


async def test_eight_sessions_with_a_system_block_all_hit_it(micro_checkpoint: Path, frontend: Frontend):
    engine = await start_engine(micro_checkpoint, lanes=2, host_cache_mib=64)
    try:
        system = {"role": "system", "content": "Shared tools and rules. " * 50}
        results = []
        for session in range(8):
            messages = [system, {"role": "user", "content": f"Session {session} asks something new."}]
            results.append(await generate(engine, frontend.prepare_chat(messages), 2))
        structural = min(
            p
            for p, kind in frontend.prepare_chat([system, {"role": "user", "content": "x"}]).tap_hints
            if kind == 3
        )
        expected = structural // BLOCK_TOKENS * BLOCK_TOKENS
        assert all(r.accounting.reuse_tokens >= expected > 0 for r in results[1:])
    finally:
        await engine.stop()


async def test_identical_prompts_arriving_together_give_correct_outputs(
    micro_checkpoint: Path, frontend: Frontend
):
    engine = await start_engine(micro_checkpoint, lanes=8, pages=1024, host_cache_mib=64)
    try:
        prompt = frontend.prepare_tokens(filler_tokens(600, seed=40))
        cold = await generate(
            engine, frontend.prepare_tokens(filler_tokens(600, seed=40), prefix_reuse=False), 12
        )
        together = await asyncio.gather(*(generate(engine, prompt, 12) for _ in range(8)))
        assert all(result.tokens == cold.tokens for result in together)
    finally:
        await engine.stop()


async def test_a_request_cancelled_mid_prefill_publishes_its_blocks(
    micro_checkpoint: Path, frontend: Frontend
):
    engine = await start_engine(micro_checkpoint, chunk=256, host_cache_mib=64)
    try:
        tokens = filler_tokens(5000, seed=50)
        stream = engine.submit(frontend.prepare_tokens(tokens), SamplingParams(max_tokens=4, temperature=0))
        admitted = await stream.__anext__()
        assert admitted.accounting is not None
        while engine.stats()["prefill_tokens"] < 1024:
            await asyncio.sleep(0.01)
        await stream.aclose()
        for _ in range(200):
            if engine.stats()["requests_running"] == 0:
                break
            await asyncio.sleep(0.01)
        committed_nodes = len(engine.cache.index.nodes) - 1
        assert committed_nodes >= 1024 // BLOCK_TOKENS
        again = await generate(engine, frontend.prepare_tokens(tokens), 2)
        assert again.accounting.cached_prefix_tokens >= committed_nodes * BLOCK_TOKENS - BLOCK_TOKENS
    finally:
        await engine.stop()


async def test_active_growth_evicts_cache_never_an_active_request(micro_checkpoint: Path, frontend: Frontend):
    engine = await start_engine(micro_checkpoint, pages=48, lanes=1, host_cache_mib=0)
    try:
        for seed in range(3):  # fill the small device pool with cache
            await generate(engine, frontend.prepare_tokens(filler_tokens(900, seed=60 + seed)), 2)
        grown = await generate(engine, frontend.prepare_tokens(filler_tokens(200, seed=70)), 1500)
        assert len(grown.tokens) == 1500 and grown.finish_reason == "length"
        assert engine.stats()["prefix_cache_eviction_events"]["device"] > 0
    finally:
        await engine.stop()


async def test_a_device_only_cache_reuses_and_deletes_unbacked_subtrees(
    micro_checkpoint: Path, frontend: Frontend
):
    engine = await start_engine(micro_checkpoint, pages=40, lanes=1, host_cache_mib=0)
    try:
        prompt = filler_tokens(500, seed=80)
        await generate(engine, frontend.prepare_tokens(prompt), 2)
        again = await generate(engine, frontend.prepare_tokens(prompt), 2)
        assert again.accounting.source == "device" and again.accounting.reuse_tokens == 499  # tail tap
        for seed in range(4):  # unbacked eviction: the first prompt's subtree goes with its last copy
            await generate(engine, frontend.prepare_tokens(filler_tokens(900, seed=90 + seed)), 2)
        gone = await generate(engine, frontend.prepare_tokens(prompt), 2)
        assert gone.accounting.reuse_tokens < again.accounting.reuse_tokens
        engine.check_integrity()
    finally:
        await engine.stop()


async def test_disabled_requests_leave_no_cache_entries(micro_checkpoint: Path, frontend: Frontend):
    engine = await start_engine(micro_checkpoint, host_cache_mib=64)
    try:
        await generate(engine, frontend.prepare_tokens(filler_tokens(300, seed=100)), 4)
        index = engine.cache.index
        before = (len(index.nodes), len(index.snapshots))
        disabled = frontend.prepare_tokens(filler_tokens(700, seed=101), prefix_reuse=False)
        result = await generate(engine, disabled, 80)
        assert result.accounting.reuse_tokens == 0
        assert (len(index.nodes), len(index.snapshots)) == before
    finally:
        await engine.stop()


async def test_a_transfer_fault_fails_the_engine_cleanly(micro_checkpoint: Path, frontend: Frontend):
    engine = await start_engine(micro_checkpoint, host_cache_mib=64)
    stream = engine.runtime.backend.transfer_stream

    def broken_copy(*args, **kwargs):
        def fail() -> None:
            raise OSError("injected transfer fault")

        stream.enqueue(fail)

    stream.copy_2d = broken_copy  # every write-through now fails on the transfer stream
    try:
        with pytest.raises(RequestError) as running:
            await generate(engine, frontend.prepare_tokens(filler_tokens(300, seed=110)), 200)
        assert running.value.kind == "internal" and "injected transfer fault" in running.value.message
        assert engine.stats()["stopping"]
        with pytest.raises(RequestError) as later:
            await generate(engine, frontend.prepare_tokens(filler_tokens(300, seed=111)), 2)
        assert later.value.kind == "unavailable"
        assert not engine.cache.index.lanes  # the failed lane's pins were released
        engine.check_integrity()
    finally:
        await engine.stop()
    fresh = await start_engine(micro_checkpoint, host_cache_mib=64)  # a restart starts clean
    try:
        ok = await generate(fresh, frontend.prepare_tokens(filler_tokens(300, seed=110)), 2)
        assert len(ok.tokens) == 2
    finally:
        await fresh.stop()


async def test_a_fault_in_a_write_back_fails_the_engine_cleanly(micro_checkpoint: Path, frontend: Frontend):
    engine = await start_engine(micro_checkpoint, pages=16, host_cache_mib=64)
    stream = engine.runtime.backend.transfer_stream
    try:
        await generate(engine, frontend.prepare_tokens(filler_tokens(700, seed=112)), 100)
        await asyncio.sleep(0.1)  # the endpoint's copies land before the fault is injected

        def broken_copy(*args, **kwargs):
            def fail() -> None:
                raise OSError("injected write-back fault")

            stream.enqueue(fail)

        stream.copy_2d = broken_copy
        # The second prompt needs pages the first path holds: eviction writes it back first, and fails.
        with pytest.raises(RequestError) as failed:
            await generate(engine, frontend.prepare_tokens(filler_tokens(700, seed=113)), 2)
        assert failed.value.kind == "internal" and "injected write-back fault" in failed.value.message
        assert engine.stats()["host_tier_written_back_blocks"] == 0
        assert not engine.cache.index.lanes
        engine.check_integrity()
    finally:
        await engine.stop()


async def test_a_request_waiting_too_long_times_out(micro_checkpoint: Path, frontend: Frontend):
    engine = await start_engine(micro_checkpoint, lanes=1, host_cache_mib=64)
    engine.options = (
        engine.options.__class__(**{**engine.options.__struct_config__.__class__.__dict__})
        if False
        else engine.options
    )
    try:
        long_one = asyncio.ensure_future(
            generate(engine, frontend.prepare_tokens(filler_tokens(200, seed=120)), 3000)
        )
        await asyncio.sleep(0.2)
        engine._worker.options = _with_timeout(engine.options, 0.3)
        with pytest.raises(RequestError) as caught:
            await generate(engine, frontend.prepare_tokens(filler_tokens(200, seed=121)), 2)
        assert caught.value.kind == "timeout"
        engine.cancel("req-1")
        await long_one
    finally:
        await engine.stop()


def _with_timeout(options, seconds: float):
    import msgspec

    return msgspec.structs.replace(options, pending_timeout_s=seconds)


async def test_stop_fails_running_and_queued_requests_as_unavailable(
    micro_checkpoint: Path, frontend: Frontend
):
    engine = await start_engine(micro_checkpoint, lanes=1, host_cache_mib=64)
    running = asyncio.ensure_future(
        generate(engine, frontend.prepare_tokens(filler_tokens(200, seed=130)), 5000)
    )
    queued = asyncio.ensure_future(generate(engine, frontend.prepare_tokens(filler_tokens(200, seed=131)), 5))
    await asyncio.sleep(0.3)
    await engine.stop()
    for task in (running, queued):
        with pytest.raises(RequestError) as caught:
            await task
        assert caught.value.kind == "unavailable"
    engine.check_integrity()
    assert not engine.cache.index.lanes


async def test_identical_prompts_arriving_together_prefill_the_shared_prefix_once(
    micro_checkpoint: Path, frontend: Frontend
):
    engine = await start_engine(micro_checkpoint, lanes=8, pages=1024, chunk=256, host_cache_mib=64)
    try:
        tokens = filler_tokens(1500, seed=140)
        results = await asyncio.gather(
            *(generate(engine, frontend.prepare_tokens(tokens), 4) for _ in range(8))
        )
        assert len({tuple(r.tokens) for r in results}) == 1
        tail_tap = len(tokens) - 1  # the coalescing target: the whole shared prefix below n - 1
        assert sorted(r.accounting.reuse_tokens for r in results)[1:] == [tail_tap] * 7
        # one prefill, then each sibling recomputes the tokens past the tail tap
        assert engine.stats()["prefill_tokens"] == len(tokens) + 7 * (len(tokens) - tail_tap)
    finally:
        await engine.stop()


async def test_the_blocked_head_prefetches_its_host_only_blocks(micro_checkpoint: Path, frontend: Frontend):
    engine = await start_engine(
        micro_checkpoint, pages=40, lanes=1, host_cache_mib=64, device_snapshot_slots=1
    )
    try:
        prompt = filler_tokens(700, seed=150)
        cold = await generate(engine, frontend.prepare_tokens(prompt, prefix_reuse=False), 8)
        await generate(engine, frontend.prepare_tokens(prompt), 4)
        for seed in range(151, 155):  # push the prompt's blocks off the device (they stay on the host)
            await generate(engine, frontend.prepare_tokens(filler_tokens(700, seed=seed)), 4)
        busy = asyncio.ensure_future(
            generate(engine, frontend.prepare_tokens(filler_tokens(100, seed=156)), 200)
        )
        await asyncio.sleep(0.05)
        waiting = asyncio.ensure_future(generate(engine, frontend.prepare_tokens(prompt), 8))
        await busy
        resumed = await waiting
        assert engine.stats()["prefetched_blocks"] > 0
        assert resumed.accounting.reuse_tokens >= 640
        assert resumed.tokens == cold.tokens
        block_bytes = engine.runtime.geometry.slab_bytes
        image_bytes = engine.runtime.geometry.image_bytes
        # most path blocks were already on the device when it was admitted
        assert resumed.accounting.restored_host_bytes < 4 * block_bytes + image_bytes + block_bytes
    finally:
        await engine.stop()


async def test_a_failed_host_allocation_is_a_clear_startup_error(micro_checkpoint: Path, monkeypatch):
    from hybridcache.core import runtime
    from hybridcache.gpu.host_tier import HostAllocationError

    def refuse(nbytes: int):
        raise RuntimeError(f"cannot allocate {nbytes} bytes")

    monkeypatch.setattr(runtime, "cpu_allocator", refuse)
    with pytest.raises(HostAllocationError, match="64 MiB of host slab memory"):
        await start_engine(micro_checkpoint, host_cache_mib=64)


async def test_stats_report_the_host_tier_composition(micro_checkpoint: Path, frontend: Frontend):
    # An inexact-resume engine keeps the decode endpoint, whose tail inside a block reaches the host too.
    engine = await start_engine(
        micro_checkpoint, pages=16, host_cache_mib=64, exact_resume=False, endpoint_refill=False
    )
    try:
        await generate(engine, frontend.prepare_tokens(filler_tokens(700, seed=160)), 100)
        await asyncio.sleep(0.1)  # the endpoint's image and tail land on the host
        assert engine.stats()["host_tier_bytes"]["kv_live"] == 0  # its blocks are still only on the device
        # A second long prompt needs most of the 16 pages: eviction writes the first path back first.
        await generate(engine, frontend.prepare_tokens(filler_tokens(700, seed=161)), 1)
        stats = engine.stats()
        host = stats["host_tier_bytes"]
        assert stats["host_tier_written_back_blocks"] > 0
        assert host["kv_live"] > 0 and host["snapshot_images"] > 0 and host["snapshot_tails"] > 0
        slab = engine.runtime.geometry.slab_bytes
        assert host["kv_live"] == stats["host_tier_written_back_blocks"] * slab
        snapshot_bytes = host["snapshot_images"] + host["snapshot_tails"]
        assert stats["host_tier_superseded_snapshot_bytes"] <= snapshot_bytes
        # The worker tells the cache the time (its recency floor's clock); two short prompts never gate it on.
        assert engine.cache.now is not None
        assert stats["host_tier_recency_floor_on"] is False
        assert stats["host_tier_recency_floor_switched_on"] == 0
    finally:
        await engine.stop()
