"""`--cache-dir` options: what it needs, what it replaces, and the directories it refuses."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from hybridcache.cache.write_back import HostWrite
from hybridcache.config import CacheOptions, EngineOptions, OptionError, resolve_options


def resolve(**cache) -> object:
    return resolve_options(EngineOptions(cache=CacheOptions(**cache)))


def test_a_new_directory_in_an_existing_parent_is_taken_and_implies_write_through(tmp_path: Path):
    options = resolve(cache_dir=str(tmp_path / "new"))
    assert options.cache.cache_dir == str(tmp_path / "new") and options.cache.host_write == HostWrite.THROUGH
    assert not (tmp_path / "new").exists()  # nothing is created before the engine starts
    assert resolve(cache_dir=str(tmp_path), host_write="back").cache.host_write == HostWrite.BACK


@pytest.mark.parametrize(
    ("cache", "words"),
    [
        ({"host_cache_mib": 0}, "needs a Host tier"),
        ({"prefix_cache_file": "x.cache"}, "replaces --prefix-cache-file"),
        ({"prefix_reuse": False}, "--no-prefix-reuse"),
    ],
)
def test_combinations_that_cannot_work_are_refused(tmp_path: Path, cache, words):
    with pytest.raises(OptionError, match=words) as error:
        resolve(cache_dir=str(tmp_path / "d"), **cache)
    assert error.value.flag == "--cache-dir"


def test_a_file_a_missing_parent_or_an_event_log_inside_are_refused(tmp_path: Path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(OptionError, match="not a directory"):
        resolve(cache_dir=str(tmp_path / "file"))
    with pytest.raises(OptionError, match="parent directory"):
        resolve(cache_dir=str(tmp_path / "a" / "b"))
    with pytest.raises(OptionError, match="inside the cache directory"):
        resolve(cache_dir=str(tmp_path), event_log=str(tmp_path / "events.log"))


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o1777])
def test_a_directory_others_can_write_into_is_refused(tmp_path: Path, mode: int):
    directory = tmp_path / "cache"
    directory.mkdir()
    os.chmod(directory, mode)
    with pytest.raises(OptionError, match="writable"):
        resolve(cache_dir=str(directory))


def test_a_slab_file_others_can_write_is_refused(tmp_path: Path):
    directory = tmp_path / "cache"
    directory.mkdir(mode=0o700)
    (directory / "slabs").write_bytes(b"")
    os.chmod(directory / "slabs", 0o666)
    with pytest.raises(OptionError, match="slabs"):
        resolve(cache_dir=str(directory))


def test_another_users_directory_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    directory = tmp_path / "cache"
    directory.mkdir(mode=0o700)
    monkeypatch.setattr(os, "geteuid", lambda: os.stat(directory).st_uid + 1)
    with pytest.raises(OptionError, match="another user"):
        resolve(cache_dir=str(directory))
