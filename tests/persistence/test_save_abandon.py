"""An abandoned or failed save leaves the previous file intact and no temporary file behind (§5.5)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from persistence_factories import conversation_state, fingerprint, fresh_target, save

from hybridcache.persistence import save as save_module
from hybridcache.persistence.load import load_prefix_cache
from hybridcache.persistence.save import select_saved


@pytest.fixture(scope="module")
def states():
    """The state saved first (the "previous file") and a different one whose save is interrupted."""
    return conversation_state(seed=31), conversation_state(seed=32, conversations=4)


def assert_only_the_previous_file(directory: Path, path: Path, previous: bytes) -> None:
    assert [p.name for p in directory.iterdir()] == [path.name], "a temporary file was left behind"
    assert path.read_bytes() == previous


def abandon_after(calls: int, event: threading.Event):
    """A progress callback that sets ``event`` on its ``calls``-th call (the prelude counts as none)."""
    seen = []

    def progress(done: int) -> None:
        seen.append(done)
        if len(seen) >= calls:
            event.set()

    return progress


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(point=st.floats(0.0, 1.0))
def test_a_save_abandoned_at_any_point_keeps_the_previous_file(states, tmp_path_factory, point: float):
    first, second = states
    directory = tmp_path_factory.mktemp("abandon")
    path = directory / "cache.bin"
    save(path, first.cache, first.memory)
    previous = path.read_bytes()
    blocks, snapshots = select_saved(second.cache.index)
    runs = len(blocks) + len(snapshots)  # the progress callback is called once per run
    abandon = threading.Event()
    calls = int(point * runs)
    if calls == 0:
        abandon.set()

    report = save(path, second.cache, second.memory, abandon=abandon, progress=abandon_after(calls, abandon))

    assert not report.saved and report.reason == "abandoned"
    assert_only_the_previous_file(directory, path, previous)


def test_an_abandon_after_the_last_run_is_caught_before_the_rename(states, tmp_path: Path):
    first, second = states
    path = tmp_path / "cache.bin"
    save(path, first.cache, first.memory)
    previous = path.read_bytes()
    abandon = threading.Event()
    done: list[int] = []

    report = save(path, second.cache, second.memory, abandon=abandon, progress=done.append)
    assert report.saved
    final_size = done[-1]
    save(path, first.cache, first.memory)
    previous = path.read_bytes()

    def abandon_at_the_end(progress: int) -> None:
        if progress == final_size:
            abandon.set()

    report = save(path, second.cache, second.memory, abandon=abandon, progress=abandon_at_the_end)
    assert not report.saved
    assert_only_the_previous_file(tmp_path, path, previous)


@pytest.mark.parametrize("failing", ["replace", "fsync"])
def test_a_failed_save_raises_and_keeps_the_previous_file(states, tmp_path: Path, monkeypatch, failing: str):
    first, second = states
    path = tmp_path / "cache.bin"
    save(path, first.cache, first.memory)
    previous = path.read_bytes()

    def fail(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(save_module.os, failing, fail)
    with pytest.raises(OSError, match="No space"):
        save(path, second.cache, second.memory)
    monkeypatch.undo()
    assert_only_the_previous_file(tmp_path, path, previous)


def test_the_previous_file_still_loads_after_an_abandoned_save(states, tmp_path: Path):
    first, second = states
    path = tmp_path / "cache.bin"
    saved = save(path, first.cache, first.memory)
    abandon = threading.Event()
    save(path, second.cache, second.memory, abandon=abandon, progress=abandon_after(2, abandon))
    target, memory = fresh_target()
    loaded = load_prefix_cache(path, target, memory, fingerprint())
    assert loaded.status == "restored" and loaded.restored_snapshots == saved.snapshots
