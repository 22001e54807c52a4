"""Files the server writes are private from their first moment; files it trusts are its own alone; the
cache file and the event log never name the same file."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest
from persistence_factories import conversation_state, save

from hybridcache.config import CacheOptions, EngineOptions, OptionError, resolve_options
from hybridcache.persistence.journal import JournalReader, JournalWriter, journal_segments


@pytest.fixture
def permissive_umask():
    """Umask 0: a file created without an explicit mode would be world-readable and writable."""
    previous = os.umask(0)
    yield
    os.umask(previous)


@pytest.fixture
def no_chmod(monkeypatch: pytest.MonkeyPatch):
    """Any chmod after creation fails the test: the mode must come with the create call."""

    def refuse(*args, **kwargs):
        raise AssertionError("a file was chmod-ed after creation")

    monkeypatch.setattr(os, "chmod", refuse)
    monkeypatch.setattr(os, "fchmod", refuse)


def mode_of(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def resolve_cache(**cache) -> object:
    return resolve_options(EngineOptions(cache=CacheOptions(**cache)))


# -- every file written is created 0600 --------------------------------------------------------------
def test_journal_segments_and_their_rotations_are_created_private(tmp_path, permissive_umask, no_chmod):
    path = tmp_path / "events.log"
    path.write_bytes(b"a previous run")  # rotated away at the first write (renamed, mode kept)
    writer = JournalWriter(path, max_segment_bytes=500, flush_interval_s=0.001)
    for seq in range(1, 200):
        writer.append(seq, b"x" * 40)
        if seq % 20 == 0:
            writer.flush()
    writer.close()
    segments = journal_segments(path)
    assert len(segments) > 3
    created = [segment for segment in segments if segment.name != "events.log.1"]
    assert {segment.name: mode_of(segment) for segment in created} == {s.name: 0o600 for s in created}
    assert len(list(JournalReader(path).payloads())) > 0


def test_the_prefix_cache_file_and_its_temporary_file_are_private(tmp_path, permissive_umask, no_chmod):
    target = tmp_path / "cache.bin"
    seen: dict[str, int] = {}

    def look_at_the_temporary_file(done: int) -> None:
        for entry in tmp_path.iterdir():
            if entry.name.endswith(".tmp"):
                seen[entry.name] = mode_of(entry)

    state = conversation_state(seed=5)
    report = save(target, state.cache, state.memory, progress=look_at_the_temporary_file)
    assert report.saved
    assert seen and set(seen.values()) == {0o600}
    assert mode_of(target) == 0o600


# -- a file someone else could have written is refused --------------------------------------------
@pytest.mark.parametrize("flag,field", [("--prefix-cache-file", "prefix_cache_file"),
                                        ("--event-log", "event_log")])
@pytest.mark.parametrize("mode", [0o620, 0o602, 0o666])
def test_a_group_or_world_writable_file_is_refused(tmp_path: Path, flag: str, field: str, mode: int):
    path = tmp_path / "shared.bin"
    path.write_bytes(b"")
    os.chmod(path, mode)
    with pytest.raises(OptionError, match="group- or world-writable") as caught:
        resolve_cache(**{field: str(path)})
    assert caught.value.flag == flag and "\n" not in str(caught.value)


def test_a_file_owned_by_another_user_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    path = tmp_path / "cache.bin"
    path.write_bytes(b"")
    os.chmod(path, 0o600)
    owner = path.stat().st_uid
    monkeypatch.setattr(os, "geteuid", lambda: owner + 1)  # this process is now someone else
    if tmp_path.stat().st_uid != 0:
        monkeypatch.setattr(os, "stat", _directory_owned_by_root(os.stat, tmp_path))
    with pytest.raises(OptionError, match="owned by another user") as caught:
        resolve_cache(prefix_cache_file=str(path))
    assert caught.value.flag == "--prefix-cache-file"


def _directory_owned_by_root(real_stat, directory: Path):
    """os.stat that reports `directory` as root's (root's directories are trusted), everything else real."""

    def fake(path, *args, **kwargs):
        result = real_stat(path, *args, **kwargs)
        if Path(path) == directory:
            fields = list(result)
            fields[stat.ST_UID] = 0
            return os.stat_result(fields)
        return result

    return fake


def test_a_symlink_planted_by_another_user_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    own = tmp_path / "mine.bin"
    own.write_bytes(b"")
    os.chmod(own, 0o600)
    link = tmp_path / "cache.bin"
    os.symlink(own, link)
    resolve_cache(prefix_cache_file=str(link))  # a link of this user's is fine
    real_lstat = os.lstat

    def lstat_as_someone_else(path, *args, **kwargs):
        result = real_lstat(path, *args, **kwargs)
        if Path(path) == link:
            fields = list(result)
            fields[stat.ST_UID] = os.geteuid() + 1
            return os.stat_result(fields)
        return result

    monkeypatch.setattr(os, "lstat", lstat_as_someone_else)
    with pytest.raises(OptionError, match="symlink owned by another user"):
        resolve_cache(prefix_cache_file=str(link))


def test_a_directory_others_can_write_is_refused_unless_sticky(tmp_path: Path):
    shared = tmp_path / "shared"
    shared.mkdir()
    os.chmod(shared, 0o777)
    with pytest.raises(OptionError, match=r"directory .* group- or world-writable"):
        resolve_cache(event_log=str(shared / "events.log"))
    os.chmod(shared, 0o1777)  # like /tmp: others cannot rename or remove our files
    assert resolve_cache(event_log=str(shared / "events.log")).cache.event_log == str(shared / "events.log")


def test_a_private_file_of_this_user_is_accepted(tmp_path: Path):
    path = tmp_path / "cache.bin"
    path.write_bytes(b"")
    os.chmod(path, 0o600)
    assert resolve_cache(prefix_cache_file=str(path)).cache.prefix_cache_file == str(path)


# -- the cache file and the event log are different files ------------------------------------------
@pytest.mark.parametrize("cache_name", ["events.log", "events.log.1", "events.log.17"])
def test_the_cache_file_cannot_be_the_event_log_or_one_of_its_rotations(tmp_path: Path, cache_name: str):
    with pytest.raises(OptionError, match="rotated segments") as caught:
        resolve_cache(prefix_cache_file=str(tmp_path / cache_name), event_log=str(tmp_path / "events.log"))
    assert caught.value.flag == "--prefix-cache-file"


def test_the_same_file_through_a_symlink_or_a_hard_link_is_refused(tmp_path: Path):
    log = tmp_path / "events.log"
    (tmp_path / "other").mkdir()
    os.symlink(tmp_path / "events.log.2", tmp_path / "other" / "cache.bin")
    with pytest.raises(OptionError, match="rotated segments"):
        resolve_cache(prefix_cache_file=str(tmp_path / "other" / "cache.bin"), event_log=str(log))
    (tmp_path / "events.log.3").write_bytes(b"journal")
    os.chmod(tmp_path / "events.log.3", 0o600)
    os.link(tmp_path / "events.log.3", tmp_path / "cache.bin")
    with pytest.raises(OptionError, match="hard link"):
        resolve_cache(prefix_cache_file=str(tmp_path / "cache.bin"), event_log=str(log))


def test_names_that_only_look_alike_are_accepted(tmp_path: Path):
    for cache_name in ("events.log.bin", "events.logx", "events.log.1a", "cache.bin"):
        options = resolve_cache(prefix_cache_file=str(tmp_path / cache_name),
                                event_log=str(tmp_path / "events.log"))
        assert options.cache.prefix_cache_file == str(tmp_path / cache_name)


# -- validation touches nothing --------------------------------------------------------------------
def test_a_refused_start_leaves_every_file_as_it_was(tmp_path: Path):
    log = tmp_path / "events.log"
    log.write_bytes(b"previous journal")
    os.chmod(log, 0o600)
    before = {entry.name: entry.read_bytes() for entry in tmp_path.iterdir()}
    with pytest.raises(OptionError):
        resolve_cache(prefix_cache_file=str(tmp_path / "events.log.1"), event_log=str(log))
    assert {entry.name: entry.read_bytes() for entry in tmp_path.iterdir()} == before


def test_a_held_journal_touches_no_file_until_released(tmp_path: Path):
    path = tmp_path / "events.log"
    path.write_bytes(b"previous journal")
    writer = JournalWriter(path, flush_interval_s=0.001, hold=True)
    writer.append(1, b"first")
    writer.append(2, b"second")
    writer._thread.join(0.05)  # time for an unheld writer to have written
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["events.log"]
    assert path.read_bytes() == b"previous journal"
    writer.release()
    writer.close()
    assert sorted(entry.name for entry in tmp_path.iterdir()) == ["events.log", "events.log.1"]
    assert [bytes(p) for p in JournalReader(path).payloads()] == [b"first", b"second"]
