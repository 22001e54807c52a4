"""Disk full while the cache is being made durable: the server keeps serving with the cold run's
tokens, the error is reported at once, the files on disk stay as they were before the failure, and a
restart gives back what had become durable (and nothing that does not verify).

Three writes can meet a full disk: a batch of the cache directory (slab file + contents journal), a
compaction of the contents journal (a rewrite through a temporary file), and the prefix-cache file's save
at an orderly stop. (The event journal's own ENOSPC test is tests/core/test_engine_journal_faults.py.)
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
from pathlib import Path

import pytest

from hybridcache.core.frontend import Frontend
from hybridcache.persistence import contents_writer as contents_writer_module
from hybridcache.persistence import save as save_module
from hybridcache.persistence.cache_dir import contents_path
from hybridcache.persistence.contents_file import read_contents, temporary_name
from tests.core.engine_kit import filler_tokens, generate, start_engine


def disk_full(*args, **kwargs):
    raise OSError(errno.ENOSPC, "No space left on device")


async def _until(condition, timeout_s: float = 10.0) -> None:
    deadline = asyncio.get_running_loop().time() + timeout_s
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "never happened"
        await asyncio.sleep(0.02)


def _durable(engine) -> bool:
    stats = engine.stats()
    return stats["host_writes_in_flight"] == 0 and stats["cache_dir_durable_seq"] >= stats["cache_event_seq"]


async def _serve_after_the_failure(engine, frontend, prompt, cold) -> None:
    """The prompt served twice more: the cold run's tokens, and the second time from the cache."""
    again = await generate(engine, prompt, 8)
    assert again.tokens == cold.tokens and again.accounting.reuse_tokens > 0
    engine.check_integrity()
    assert not engine.stats()["stopping"]


@pytest.mark.parametrize("compaction", [False, True], ids=["batch", "compaction"])
async def test_disk_full_in_the_cache_directory_keeps_serving_and_the_durable_part_restores(
    micro_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, compaction: bool,
    caplog: pytest.LogCaptureFixture,
):
    directory = tmp_path / "cache"
    if compaction:  # every few records: the first batch after the fault compacts
        monkeypatch.setenv("HYBRIDCACHE_COMPACT_MIN_TAIL", "8")
        monkeypatch.setenv("HYBRIDCACHE_COMPACT_TAIL_RATIO", "0.25")
    frontend = Frontend.from_dir(micro_checkpoint, 32768)
    first = frontend.prepare_tokens(filler_tokens(700, seed=401))
    second = frontend.prepare_tokens(filler_tokens(700, seed=402))
    engine = await start_engine(micro_checkpoint, host_cache_mib=64, cache_dir=str(directory))
    try:
        cold_first = await generate(engine, first, 8)
        await _until(lambda: _durable(engine))
        durable_before = read_contents(contents_path(directory)).fold
        assert durable_before.images, "the first conversation never became durable"
        if compaction:
            monkeypatch.setattr(os, "fsync", disk_full)  # the rewrite's fsync (batches use fdatasync)
        else:
            monkeypatch.setattr(contents_writer_module.os, "fdatasync", disk_full)
        with caplog.at_level(logging.ERROR, logger="hybridcache"):
            cold_second = await generate(engine, second, 8)
            await _until(lambda: engine.stats()["cache_dir_error"] is not None)
        assert "No space left on device" in engine.stats()["cache_dir_error"]
        assert any("write failed" in record.getMessage() for record in caplog.records)
        await _serve_after_the_failure(engine, frontend, second, cold_second)
        await _serve_after_the_failure(engine, frontend, first, cold_first)
    finally:
        await engine.stop()
        monkeypatch.undo()
    assert not temporary_name(contents_path(directory)).exists()
    on_disk = read_contents(contents_path(directory))  # readable, and still names the durable entries
    assert set(durable_before.images) <= set(on_disk.fold.images)

    restarted = await start_engine(micro_checkpoint, host_cache_mib=64, cache_dir=str(directory))
    try:
        restarted.check_integrity()
        counts = restarted.cache_dir.counts
        assert counts.restored_snapshots > 0 and counts.torn_bytes == 0
        after = await generate(restarted, first, 8)
        assert after.accounting.reuse_tokens > 0 and after.tokens == cold_first.tokens
        assert (await generate(restarted, second, 8)).tokens == cold_second.tokens
        restarted.check_integrity()
    finally:
        await restarted.stop()


def _half_the_prelude_then_disk_full(stream, prelude, *rest) -> None:
    stream.write(prelude[: len(prelude) // 2])
    disk_full()


@pytest.mark.parametrize("failing", ["write", "fsync"])
async def test_disk_full_while_saving_the_prefix_cache_file_keeps_the_previous_file(
    micro_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str,
    caplog: pytest.LogCaptureFixture,
):
    cache_file = tmp_path / "prefix.cache"
    frontend = Frontend.from_dir(micro_checkpoint, 32768)
    first = frontend.prepare_tokens(filler_tokens(700, seed=411))
    second = frontend.prepare_tokens(filler_tokens(700, seed=412))
    engine = await start_engine(micro_checkpoint, host_cache_mib=64, prefix_cache_file=str(cache_file))
    cold_first = await generate(engine, first, 8)
    await engine.stop()
    previous = cache_file.read_bytes()

    engine = await start_engine(micro_checkpoint, host_cache_mib=64, prefix_cache_file=str(cache_file))
    closed = []
    real_close = engine.runtime.close
    engine.runtime.close = lambda: (closed.append(True), real_close())  # type: ignore[method-assign]
    await generate(engine, second, 8)
    if failing == "write":
        monkeypatch.setattr(save_module, "_write_all", _half_the_prelude_then_disk_full)
    else:
        monkeypatch.setattr(save_module.os, "fsync", disk_full)
    with caplog.at_level(logging.ERROR, logger="hybridcache"):
        await engine.stop()
    monkeypatch.undo()
    assert closed == [True]
    assert any("the previous file is intact" in record.getMessage() for record in caplog.records)
    assert cache_file.read_bytes() == previous
    assert sorted(path.name for path in tmp_path.iterdir()) == ["prefix.cache"]

    restarted = await start_engine(micro_checkpoint, host_cache_mib=64, prefix_cache_file=str(cache_file))
    try:
        after = await generate(restarted, first, 8)
        assert after.accounting.reuse_tokens > 0 and after.tokens == cold_first.tokens
        restarted.check_integrity()
    finally:
        await restarted.stop()
