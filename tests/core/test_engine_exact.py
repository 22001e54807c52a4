"""Bit-exact reuse: a request resumed from any source produces the cold run's first-token log-probabilities
(bit for bit) and its 64 greedy tokens, in float32 and in bf16, from snapshots on a block boundary and
inside a block (the prompt tail n - 1, which keeps a pending tail of layer inputs)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from hybridcache.core.frontend import Frontend
from tests.core.engine_kit import Generated, cold_run, filler_tokens, generate, start_engine

DTYPES = ("float32", "bfloat16")
STEPS = 64


@pytest.fixture(scope="module")
def frontend(micro_checkpoint: Path) -> Frontend:
    return Frontend.from_dir(micro_checkpoint, 32768)


def assert_identical(resumed: Generated, cold: Generated) -> None:
    assert resumed.first_logprobs == cold.first_logprobs  # exact float equality, every top-20 entry
    assert resumed.tokens == cold.tokens


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("length", [437, 449])  # the tail n - 1 inside a block, and on a boundary
async def test_a_repeat_and_an_extension_resume_on_the_device_exactly(
    micro_checkpoint: Path, frontend: Frontend, dtype: str, length: int
):
    prompt = filler_tokens(length + 300, seed=length)
    # device copies kept beside the host images (a CPU drops them by default: runtime.py)
    engine = await start_engine(micro_checkpoint, dtype=dtype, host_cache_mib=64, device_snapshot_copies=True)
    try:
        await generate(engine, frontend.prepare_tokens(prompt[:length]), 1)
        repeat = await generate(engine, frontend.prepare_tokens(prompt[:length]), STEPS)
        extension = await generate(engine, frontend.prepare_tokens(prompt), STEPS)
    finally:
        await engine.stop()
    tail_tap = length - 1
    assert repeat.accounting.source == extension.accounting.source == "device"
    assert repeat.accounting.reuse_tokens == tail_tap
    assert extension.accounting.reuse_tokens >= tail_tap
    assert_identical(repeat, await cold_run(micro_checkpoint, frontend, prompt[:length], dtype, STEPS))
    assert_identical(extension, await cold_run(micro_checkpoint, frontend, prompt, dtype, STEPS))


@pytest.mark.parametrize("dtype", DTYPES)
async def test_a_host_resume_is_exact(micro_checkpoint: Path, frontend: Frontend, dtype: str):
    prompt = filler_tokens(700, seed=31)
    engine = await start_engine(
        micro_checkpoint, dtype=dtype, pages=40, lanes=1, host_cache_mib=64, device_snapshot_slots=1
    )
    try:
        await generate(engine, frontend.prepare_tokens(prompt[:500]), 1)
        for seed in range(40, 43):  # unrelated traffic pushes the first prompt to host slabs
            await generate(engine, frontend.prepare_tokens(filler_tokens(700, seed=seed)), 1)
        resumed = await generate(engine, frontend.prepare_tokens(prompt), STEPS)
        stats = engine.stats()
    finally:
        await engine.stop()
    assert resumed.accounting.source == "host" and resumed.accounting.reuse_tokens == 499  # the tail
    # micro: 3 Gated DeltaNet layers, each image holds 63 layer inputs of 32 values and a count
    item = 4 if dtype == "float32" else 2
    assert stats["snapshot_image_pending_tail_bytes"] == 3 * (63 * 32 * item + 4)
    assert stats["host_tier_pending_tail_bytes"] % stats["snapshot_image_pending_tail_bytes"] == 0
    assert stats["host_tier_pending_tail_bytes"] > 0
    assert_identical(resumed, await cold_run(micro_checkpoint, frontend, prompt, dtype, STEPS))


@pytest.mark.parametrize("dtype", DTYPES)
async def test_a_resume_from_the_cache_file_after_a_restart_is_exact(
    micro_checkpoint: Path, frontend: Frontend, tmp_path: Path, dtype: str
):
    cache_file = str(tmp_path / "prefix.cache")
    prompt = filler_tokens(800, seed=32)
    options = {"dtype": dtype, "host_cache_mib": 64, "prefix_cache_file": cache_file}
    engine = await start_engine(micro_checkpoint, **options)
    await generate(engine, frontend.prepare_tokens(prompt[:601]), 1)
    await engine.stop()
    restarted = await start_engine(micro_checkpoint, **options)
    try:
        resumed = await generate(restarted, frontend.prepare_tokens(prompt), STEPS)
    finally:
        await restarted.stop()
    assert resumed.accounting.source == "host" and resumed.accounting.reuse_tokens == 600  # the tail
    assert_identical(resumed, await cold_run(micro_checkpoint, frontend, prompt, dtype, STEPS))


@pytest.mark.parametrize("dtype", DTYPES)
async def test_a_coalesced_request_resumes_from_its_siblings_tap_exactly(
    micro_checkpoint: Path, frontend: Frontend, dtype: str
):
    shared = filler_tokens(1200, seed=33)
    fork = 650  # inside a block: the sibling captures its state at that very token
    target = shared[:fork] + filler_tokens(120, seed=34)
    engine = await start_engine(micro_checkpoint, dtype=dtype, chunk=128, host_cache_mib=64)
    try:
        _, resumed = await asyncio.gather(
            generate(engine, frontend.prepare_tokens(shared), 1),
            generate(engine, frontend.prepare_tokens(target), STEPS),
        )
    finally:
        await engine.stop()
    assert resumed.accounting.reuse_tokens == fork
    assert_identical(resumed, await cold_run(micro_checkpoint, frontend, target, dtype, STEPS))


@pytest.mark.parametrize("dtype", DTYPES)
async def test_an_edit_near_the_end_resumes_from_a_hedge_taken_inside_the_pass_exactly(
    micro_checkpoint: Path, frontend: Frontend, dtype: str
):
    first = filler_tokens(1400, seed=35)  # one pass [128, 1400) (chunk 2048), the tail tap at 1399 inside it
    edited = first[:1200] + filler_tokens(150, seed=36)  # diverges 200 tokens before the first one's end
    engine = await start_engine(
        micro_checkpoint, dtype=dtype, chunk=2048, host_cache_mib=64, device_snapshot_slots=7
    )  # room for four hedges and the tail (a hedge never takes the slot the tail needs: room_for_hedge)
    try:
        await generate(engine, frontend.prepare_tokens(first[:130]), 1)  # so `first` resumes at its tail 129
        before = engine.stats()["snapshot_taps_in_pass"]
        await generate(engine, frontend.prepare_tokens(first), 1)
        captured = engine.stats()["snapshot_taps_in_pass"] - before
        resumed = await generate(engine, frontend.prepare_tokens(edited), STEPS)
        hedge_bytes = engine.stats()["host_tier_hedge_snapshot_bytes"]
    finally:
        await engine.stop()
    # hedges at the last block boundary 1344 and at n-256, n-512, n-1024 floored to 64 (1088, 832, 320),
    # and the tail at 1399, all copied inside the one pass
    assert captured == 5
    assert resumed.accounting.reuse_tokens == 1088  # without the hedge: the root (no ladder this short)
    assert hedge_bytes > 0
    assert_identical(resumed, await cold_run(micro_checkpoint, frontend, edited, dtype, STEPS))


@pytest.mark.parametrize("dtype", DTYPES)
async def test_a_rewritten_last_block_resumes_from_the_hedge_at_its_start_exactly(
    micro_checkpoint: Path, frontend: Frontend, dtype: str
):
    # Block-hashed traces (WEKA) re-hash a prompt's partial last block in the next request: the next one
    # shares the prompt up to its last block boundary and continues differently from there.
    first = filler_tokens(1400, seed=37)
    rewritten = first[:1344] + filler_tokens(200, seed=38)
    engine = await start_engine(
        micro_checkpoint, dtype=dtype, chunk=2048, host_cache_mib=64, device_snapshot_slots=7
    )
    try:
        await generate(engine, frontend.prepare_tokens(first), 1)  # cold: hedged, the hedge budget is > 0
        resumed = await generate(engine, frontend.prepare_tokens(rewritten), STEPS)
    finally:
        await engine.stop()
    assert resumed.accounting.reuse_tokens == 1344  # the hedge at the last block boundary below 1399
    assert_identical(resumed, await cold_run(micro_checkpoint, frontend, rewritten, dtype, STEPS))


@pytest.mark.parametrize(("budget", "reuse"), [("auto", 1088), (0, 0)])
async def test_a_cold_prompt_is_hedged_only_where_hedges_have_a_host_budget(
    micro_checkpoint: Path, frontend: Frontend, budget: int | str, reuse: int
):
    first = filler_tokens(1400, seed=39)
    edited = first[:1200] + filler_tokens(150, seed=40)
    engine = await start_engine(
        micro_checkpoint, chunk=2048, host_cache_mib=64, device_snapshot_slots=7, hedge_budget=budget
    )  # auto: 4 MiB (1/16 of the host tier), a micro image is far smaller than the KV of 256 tokens
    try:
        await generate(engine, frontend.prepare_tokens(first), 1)  # resumes nothing
        resumed = await generate(engine, frontend.prepare_tokens(edited), 1)
    finally:
        await engine.stop()
    assert resumed.accounting.reuse_tokens == reuse  # the n-256 hedge, or nothing (no ladder this short)


async def test_without_hedges_only_the_tail_is_taken_inside_the_pass(
    micro_checkpoint: Path, frontend: Frontend
):
    engine = await start_engine(
        micro_checkpoint, chunk=2048, host_cache_mib=64, device_snapshot_slots=6, hedges=False
    )
    prompt = filler_tokens(1400, seed=35)
    try:
        await generate(engine, frontend.prepare_tokens(prompt[:130]), 1)  # so the prompt below resumes
        before = engine.stats()["snapshot_taps_in_pass"]
        await generate(engine, frontend.prepare_tokens(prompt), 1)
        stats = engine.stats()
    finally:
        await engine.stop()
    assert stats["snapshot_taps_in_pass"] - before == 1  # the prompt tail at 1344; no hedge at 1088, 832, 320
    assert stats["host_tier_hedge_snapshot_bytes"] == 0


def test_the_serve_flag_turns_hedges_off():
    import argparse

    from hybridcache.http.serve_command import add_arguments, engine_options_from_args

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    assert engine_options_from_args(parser.parse_args([])).cache.hedges
    assert not engine_options_from_args(parser.parse_args(["--no-cache-hedges"])).cache.hedges


def test_the_serve_flag_sets_the_hedge_budget_and_the_ledger_shows_it():
    import argparse

    import msgspec

    from hybridcache.config import OptionError, resolve_options
    from hybridcache.http.lifecycle import startup_ledger
    from hybridcache.http.serve_command import add_arguments, engine_options_from_args
    from hybridcache.http.server_options import ServerOptions

    parser = argparse.ArgumentParser()
    add_arguments(parser)
    default = engine_options_from_args(parser.parse_args([]))
    assert default.cache.hedge_budget == "auto"
    given = engine_options_from_args(parser.parse_args(["--cache-hedge-budget", "512M"]))
    assert given.cache.hedge_budget == 512 << 20
    rows = dict(startup_ledger(resolve_options(given), ServerOptions()))
    assert rows["hedges"] == "on, host budget 512.0 MiB"
    auto = dict(startup_ledger(resolve_options(default), ServerOptions()))["hedges"]
    assert auto.startswith("on, host budget auto")
    with pytest.raises(SystemExit):
        parser.parse_args(["--cache-hedge-budget", "lots"])
    bad = msgspec.structs.replace(given, cache=msgspec.structs.replace(given.cache, hedge_budget=-1))
    with pytest.raises(OptionError, match="--cache-hedge-budget"):
        resolve_options(bad)
