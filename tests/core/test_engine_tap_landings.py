"""A CPU's shorter default prefill passes leave the snapshots 2048-token passes leave (prefill_passes.py):
ladder taps land where they would on a GPU's passes, captured inside the shorter pass that covers them."""

from __future__ import annotations

from pathlib import Path

from hybridcache.cache.records import SnapshotKind
from hybridcache.core.frontend import Frontend
from tests.core.engine_kit import filler_tokens, generate, snapshot_frontiers, start_engine


async def _frontiers_after(
    model: Path, chunk: int | None, prompt: list[int]
) -> tuple[int, list[int], list[int]]:
    engine = await start_engine(model, chunk=chunk, host_cache_mib=64, device="cpu")
    try:
        frontend = Frontend.from_dir(model, 32768, engine.tokenizer)
        result = await generate(engine, frontend.prepare_tokens(prompt), 2)
        return engine.options.prefill_chunk, snapshot_frontiers(engine, SnapshotKind.TAP), result.tokens
    finally:
        await engine.stop()


async def test_the_cpu_default_passes_leave_the_snapshots_of_2048_token_passes(micro_checkpoint: Path):
    prompt = filler_tokens(15_422, seed=11)
    default_chunk, default_taps, default_tokens = await _frontiers_after(micro_checkpoint, None, prompt)
    gpu_chunk, gpu_taps, gpu_tokens = await _frontiers_after(micro_checkpoint, 2048, prompt)
    assert (default_chunk, gpu_chunk) == (512, 2048)
    ladder = [f for f in gpu_taps if f % 2048 == 0]
    assert ladder, gpu_taps  # rungs at the ends of 2048-token passes
    assert default_taps == gpu_taps
    assert default_tokens == gpu_tokens  # and the passes' size does not change the output
