"""`--cache-dir`: the host tier lives in a mapped slab file whose contents journal makes it durable as it
fills, so a restart (after a stop or a crash) gives back what verifies, and nothing else."""

from __future__ import annotations

import asyncio
import os
import shutil
from pathlib import Path

import msgspec

from hybridcache.cache.match import PromptInput
from hybridcache.core.frontend import Frontend
from hybridcache.persistence.cache_dir import contents_path, slabs_path
from hybridcache.persistence.contents_file import encode_records, read_contents
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


async def _chat_then_stop(checkpoint: Path, directory: Path):
    frontend = Frontend.from_dir(checkpoint, 32768)
    engine = await start_engine(checkpoint, host_cache_mib=64, cache_dir=str(directory))
    first_turn, cold = await _three_turn_chat(engine, frontend)
    repeat = frontend.prepare_tokens(first_turn)
    quoted = _quote(engine, repeat)
    await engine.stop()
    return repeat, cold, quoted


async def _restart_and_repeat(checkpoint: Path, directory: Path, repeat):
    engine = await start_engine(checkpoint, host_cache_mib=64, cache_dir=str(directory))
    try:
        engine.check_integrity()
        counts = engine.cache_dir.counts
        after = await generate(engine, repeat, 8)
        engine.check_integrity()
    finally:
        await engine.stop()
    return counts, after


def _first_image_slab(directory: Path) -> int:
    fold = read_contents(contents_path(directory)).fold
    return min(slab for image in fold.images.values() for slab in image.slabs)


async def test_a_torn_contents_tail_is_dropped_and_the_rest_restored(micro_checkpoint: Path, tmp_path: Path):
    directory = tmp_path / "cache"
    repeat, cold, quoted = await _chat_then_stop(micro_checkpoint, directory)
    with open(contents_path(directory), "ab") as stream:
        stream.write(b"\x40\x00\x00\x00\x01\x02")  # a frame header and a little: a crash mid-append
    counts, after = await _restart_and_repeat(micro_checkpoint, directory, repeat)
    assert counts.torn_bytes == 6 and counts.mismatched == 0
    assert counts.restored_snapshots == counts.listed_snapshots
    assert after.accounting.reuse_tokens == quoted and after.tokens == cold.tokens


async def test_slab_bytes_that_fail_their_checksum_are_never_served(micro_checkpoint: Path, tmp_path: Path):
    directory = tmp_path / "cache"
    repeat, cold, _ = await _chat_then_stop(micro_checkpoint, directory)
    fold = read_contents(contents_path(directory)).fold
    slab_bytes = read_contents(contents_path(directory)).header.geometry.slab_bytes
    with open(slabs_path(directory), "r+b") as stream:  # damage every image: no snapshot may come back
        for image in fold.images.values():
            stream.seek(image.slabs[0] * slab_bytes + 100)
            byte = stream.read(1)
            stream.seek(image.slabs[0] * slab_bytes + 100)
            stream.write(bytes([byte[0] ^ 0x55]))
    counts, after = await _restart_and_repeat(micro_checkpoint, directory, repeat)
    assert counts.mismatched == len(fold.images) and counts.restored_snapshots == 0
    assert counts.restored_blocks == 0  # no snapshot needs them: released again
    assert after.accounting.reuse_tokens == 0 and after.tokens == cold.tokens


async def test_slab_writes_that_never_landed_drop_exactly_their_entries(
    micro_checkpoint: Path, tmp_path: Path
):
    directory = tmp_path / "cache"
    repeat, cold, _ = await _chat_then_stop(micro_checkpoint, directory)
    contents = read_contents(contents_path(directory))
    slab_bytes = contents.header.geometry.slab_bytes
    used = sorted(contents.fold.blocks[n].slab for n in contents.fold.blocks)
    cut = used[len(used) // 2]
    with open(slabs_path(directory), "r+b") as stream:  # the second half of the blocks never landed
        stream.truncate(cut * slab_bytes)
    counts, after = await _restart_and_repeat(micro_checkpoint, directory, repeat)
    assert counts.mismatched > 0 and counts.restored_blocks < len(used)
    assert counts.restored_snapshots + counts.mismatched + counts.unreachable >= counts.listed_snapshots
    assert after.tokens == cold.tokens  # whatever was restored verified; the reply is the cold one


async def test_a_copy_taken_while_serving_restores_what_had_become_durable(
    micro_checkpoint: Path, tmp_path: Path
):
    """The files as a kill -9 leaves them (the page cache survives a process crash): copied while the
    engine runs, contents after slabs, so the contents may name bytes the copy missed."""
    directory, crashed = tmp_path / "cache", tmp_path / "crashed"
    frontend = Frontend.from_dir(micro_checkpoint, 32768)
    engine = await start_engine(micro_checkpoint, host_cache_mib=64, cache_dir=str(directory))
    try:
        first_turn, cold = await _three_turn_chat(engine, frontend)
        repeat = frontend.prepare_tokens(first_turn)
        quoted = _quote(engine, repeat)
        for _ in range(3000):  # the last write-through lands, then its batch is made durable
            if engine.stats()["cache_dir_durable_seq"] == engine.cache.index.seq:
                break
            await asyncio.sleep(0.01)
        assert engine.stats()["cache_dir_durable_seq"] == engine.cache.index.seq
        crashed.mkdir(mode=0o700)
        for name in ("slabs", "contents"):
            shutil.copyfile(directory / name, crashed / name)
            os.chmod(crashed / name, 0o600)
    finally:
        await engine.stop()
    counts, after = await _restart_and_repeat(micro_checkpoint, crashed, repeat)
    assert counts.mismatched == 0 and counts.restored_snapshots == counts.listed_snapshots > 0
    assert after.accounting.reuse_tokens == quoted and after.tokens == cold.tokens


async def test_compaction_keeps_what_a_restart_gives_back(
    micro_checkpoint: Path, tmp_path: Path, monkeypatch
):
    monkeypatch.setenv("HYBRIDCACHE_COMPACT_MIN_TAIL", "4")
    monkeypatch.setenv("HYBRIDCACHE_COMPACT_TAIL_RATIO", "0.5")
    directory = tmp_path / "cache"
    frontend = Frontend.from_dir(micro_checkpoint, 32768)
    engine = await start_engine(micro_checkpoint, host_cache_mib=64, cache_dir=str(directory))
    first_turn, cold = await _three_turn_chat(engine, frontend)
    repeat = frontend.prepare_tokens(first_turn)
    quoted = _quote(engine, repeat)
    await engine.stop()
    assert engine.cache_dir.writer.compactions >= 1  # how many depends on how the batches fell
    contents = read_contents(contents_path(directory))
    assert contents.tail_records <= max(4, 0.5 * contents.base_entries) + 64  # + one batch
    counts, after = await _restart_and_repeat(micro_checkpoint, directory, repeat)
    assert counts.restored_snapshots == counts.listed_snapshots and counts.mismatched == 0
    assert after.accounting.reuse_tokens == quoted and after.tokens == cold.tokens


async def test_a_block_listed_twice_is_dropped_not_fatal(micro_checkpoint: Path, tmp_path: Path):
    """Two verified records for one key under one parent cannot both enter the index: the second is
    counted inconsistent and dropped; the server still starts and serves the cold reply."""
    directory = tmp_path / "cache"
    repeat, cold, quoted = await _chat_then_stop(micro_checkpoint, directory)
    contents = read_contents(contents_path(directory))
    slab_bytes = contents.header.geometry.slab_bytes
    original = next(b for b in contents.fold.blocks.values() if b.parent == 0)
    spare = os.path.getsize(slabs_path(directory)) // slab_bytes - 1
    with open(slabs_path(directory), "r+b") as stream:
        stream.seek(original.slab * slab_bytes)
        data = stream.read(slab_bytes)
        stream.seek(spare * slab_bytes)
        stream.write(data)
    twin = msgspec.structs.replace(original, node=10**6, slab=spare)
    with open(contents_path(directory), "ab") as stream:
        stream.write(encode_records([twin]))
    counts, after = await _restart_and_repeat(micro_checkpoint, directory, repeat)
    assert counts.inconsistent == 1 and counts.mismatched == 0
    assert after.accounting.reuse_tokens == quoted and after.tokens == cold.tokens
