"""`--cache-dir`: the host tier lives in a mapped slab file whose contents journal makes it durable as it
fills, so a restart (after a stop or a crash) gives back what verifies, and nothing else."""

from __future__ import annotations

import os
from pathlib import Path

from hybridcache.cache.match import PromptInput
from hybridcache.core.frontend import Frontend
from hybridcache.persistence.cache_dir import contents_path, slabs_path
from hybridcache.persistence.contents_file import read_contents
from tests.core.engine_kit import filler_tokens, generate, start_engine


async def _three_turn_chat(engine, frontend):
    first_turn = filler_tokens(660, seed=21)
    cold = await generate(engine, frontend.prepare_tokens(first_turn), 8)
    history = first_turn + cold.tokens
    for turn, length in enumerate((837, 899), start=1):
        history = history + filler_tokens(length - len(history), seed=turn)
        history = history + (await generate(engine, frontend.prepare_tokens(history), 8)).tokens
    return first_turn, cold


def _quote(engine, prompt) -> int:
    probe = PromptInput(prompt.token_ids, prompt.block_hashes, token_bytes=prompt.token_bytes)
    return engine.cache.quote(probe).reuse_tokens


async def test_a_restart_from_the_directory_gives_back_the_first_turn(micro_checkpoint: Path, tmp_path: Path):
    directory = tmp_path / "cache"
    frontend = Frontend.from_dir(micro_checkpoint, 32768)
    engine = await start_engine(micro_checkpoint, host_cache_mib=64, cache_dir=str(directory))
    first_turn, cold = await _three_turn_chat(engine, frontend)
    repeat = frontend.prepare_tokens(first_turn)
    quoted = _quote(engine, repeat)
    await engine.stop()
    assert quoted > 600
    for path in (slabs_path(directory), contents_path(directory), directory / "lock"):
        assert path.stat().st_mode & 0o777 == 0o600
    assert directory.stat().st_mode & 0o777 == 0o700

    restarted = await start_engine(micro_checkpoint, host_cache_mib=64, cache_dir=str(directory))
    try:
        restarted.check_integrity()
        counts = restarted.cache_dir.counts
        assert counts.restored_snapshots == counts.listed_snapshots > 0
        assert counts.mismatched == 0 and counts.restored_superseded > 0
        after = await generate(restarted, repeat, 8)
        assert after.accounting.reuse_tokens == quoted
        assert after.tokens == cold.tokens
        restarted.check_integrity()
    finally:
        await restarted.stop()
