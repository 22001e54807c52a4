"""The prefix cache outlives the process (spec §5.5): save at the orderly stop, load at construction."""

from __future__ import annotations

from pathlib import Path

from hybridcache.core.frontend import Frontend
from tests.core.engine_kit import filler_tokens, generate, start_engine


async def test_a_restart_resumes_the_conversation_with_identical_output(
    micro_checkpoint: Path, tmp_path: Path
):
    cache_file = tmp_path / "prefix.cache"
    frontend = Frontend.from_dir(micro_checkpoint, 32768)
    turn1 = filler_tokens(800, seed=7)
    engine = await start_engine(micro_checkpoint, host_cache_mib=64, prefix_cache_file=str(cache_file))
    first = await generate(engine, frontend.prepare_tokens(turn1), 100)
    turn2 = turn1 + first.tokens + filler_tokens(40, seed=8)
    before = await generate(engine, frontend.prepare_tokens(turn2), 16)
    await engine.stop()
    assert before.accounting.reuse_tokens > 0
    assert cache_file.exists() and cache_file.stat().st_mode & 0o777 == 0o600

    restarted = await start_engine(micro_checkpoint, host_cache_mib=64, prefix_cache_file=str(cache_file))
    try:
        assert len(restarted.cache.index.snapshots) > 0
        after = await generate(restarted, frontend.prepare_tokens(turn2), 16)
        assert after.accounting.source == "host"
        assert after.accounting.reuse_tokens == before.accounting.reuse_tokens
        assert after.tokens == before.tokens
    finally:
        await restarted.stop()


async def test_a_file_from_another_checkpoint_geometry_is_refused(micro_checkpoint: Path, tmp_path: Path):
    cache_file = tmp_path / "prefix.cache"
    frontend = Frontend.from_dir(micro_checkpoint, 32768)
    engine = await start_engine(micro_checkpoint, host_cache_mib=64, prefix_cache_file=str(cache_file))
    await generate(engine, frontend.prepare_tokens(filler_tokens(800, seed=9)), 70)
    await engine.stop()
    other = await start_engine(
        micro_checkpoint, chunk=512, host_cache_mib=64, prefix_cache_file=str(cache_file)
    )
    try:
        assert len(other.cache.index.snapshots) == 0  # another prefill signature: nothing loaded
        ok = await generate(other, frontend.prepare_tokens(filler_tokens(800, seed=9)), 2)
        assert ok.accounting.reuse_tokens == 0
    finally:
        await other.stop()


async def test_a_restart_gives_back_superseded_snapshots_inside_earlier_turns(
    micro_checkpoint: Path, tmp_path: Path
):
    """A 3-turn chat: the first turn's states are superseded by the later turns, yet repeating the
    first turn after a restart reuses as much as it would have before the stop."""
    from hybridcache.cache.match import PromptInput

    cache_file = tmp_path / "prefix.cache"
    frontend = Frontend.from_dir(micro_checkpoint, 32768)
    engine = await start_engine(micro_checkpoint, host_cache_mib=64, prefix_cache_file=str(cache_file))
    first_turn = filler_tokens(660, seed=21)
    cold = await generate(engine, frontend.prepare_tokens(first_turn), 8)
    history = first_turn + cold.tokens
    for turn, length in enumerate((837, 899), start=1):
        history = history + filler_tokens(length - len(history), seed=turn)
        history = history + (await generate(engine, frontend.prepare_tokens(history), 8)).tokens
    repeat = frontend.prepare_tokens(first_turn)
    probe = PromptInput(repeat.token_ids, repeat.block_hashes, token_bytes=repeat.token_bytes)
    quoted = engine.cache.quote(probe)  # what repeating the first turn would reuse before the stop
    assert any(s.superseded for s in engine.cache.index.snapshots.values())
    await engine.stop()
    assert quoted.reuse_tokens > 0

    restarted = await start_engine(micro_checkpoint, host_cache_mib=64, prefix_cache_file=str(cache_file))
    try:
        after = await generate(restarted, repeat, 8)
        assert after.accounting.reuse_tokens == quoted.reuse_tokens
        assert after.tokens == cold.tokens
    finally:
        await restarted.stop()
