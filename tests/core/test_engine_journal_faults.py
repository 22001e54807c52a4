"""The event log under faults: a failed write is reported at once and the engine keeps serving; the
journal is not touched before the engine starts."""

from __future__ import annotations

import asyncio
import errno
import logging
from pathlib import Path

import pytest

from hybridcache.config import CacheOptions, EngineOptions, resolve_options
from hybridcache.core.engine import Engine
from hybridcache.core.frontend import Frontend
from hybridcache.persistence import journal as journal_module
from tests.core.engine_kit import filler_tokens, generate, start_engine


class DiskFullFile:
    """A segment file whose writes fail with ENOSPC once its first write (the header) has landed."""

    def __init__(self, real) -> None:
        self.real = real
        self.writes = 0

    def write(self, data: bytes) -> int:
        self.writes += 1
        if self.writes > 1:
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.real.write(data)

    def __getattr__(self, name: str):
        return getattr(self.real, name)


@pytest.fixture
def disk_fills_after_the_header(monkeypatch: pytest.MonkeyPatch) -> None:
    real_create = journal_module.create_segment_file
    monkeypatch.setattr(journal_module, "create_segment_file",
                        lambda path: DiskFullFile(real_create(path)))


async def test_a_journal_write_error_is_reported_at_once_and_serving_goes_on(
    micro_checkpoint: Path, tmp_path: Path, disk_fills_after_the_header, caplog: pytest.LogCaptureFixture
):
    log_path = tmp_path / "events.log"
    frontend = Frontend.from_dir(micro_checkpoint, 32768)
    engine = await start_engine(
        micro_checkpoint, pages=64, lanes=1, host_cache_mib=64, event_log=str(log_path)
    )
    closed = []
    real_close = engine.runtime.close
    engine.runtime.close = lambda: (closed.append(True), real_close())  # type: ignore[method-assign]
    stats = engine.stats()
    assert stats["journal_write_errors"] == 0 and stats["journal_error"] is None

    with caplog.at_level(logging.ERROR, logger="hybridcache"):
        first = await generate(engine, frontend.prepare_tokens(filler_tokens(500, seed=1)), 8)
        for _ in range(200):  # the writer thread reports without waiting for a flush or the stop
            if engine.stats()["journal_write_errors"]:
                break
            await asyncio.sleep(0.01)
        stats = engine.stats()
        assert stats["journal_write_errors"] == 1
        assert "No space left on device" in str(stats["journal_error"])
        assert any("journaling stopped" in record.getMessage() for record in caplog.records)

    again = await generate(engine, frontend.prepare_tokens(filler_tokens(500, seed=1)), 8)
    assert again.tokens == first.tokens and again.accounting.reuse_tokens > 0
    assert engine.stats()["journal_events_dropped"] > 0
    await engine.stop()  # the close raises the kept error; the stop logs it and still closes the runtime
    assert closed == [True]


async def test_an_engine_that_never_starts_leaves_the_event_log_alone(micro_checkpoint: Path, tmp_path: Path):
    log_path = tmp_path / "events.log"
    log_path.write_bytes(b"the previous run's journal")
    cache_file = tmp_path / "cache.bin"
    options = resolve_options(EngineOptions(
        model=str(micro_checkpoint), kv_capacity=64, max_concurrency=1,
        cache=CacheOptions(host_cache_mib=64, event_log=str(log_path), prefix_cache_file=str(cache_file)),
    ))
    engine = Engine(micro_checkpoint, options)  # e.g. the port turns out to be taken after this
    engine.journal.writer._thread.join(0.1)  # time for an unheld writer to have written
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["events.log"]
    assert log_path.read_bytes() == b"the previous run's journal"
    await engine.start()
    await engine.stop()
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["cache.bin", "events.log", "events.log.1"]
