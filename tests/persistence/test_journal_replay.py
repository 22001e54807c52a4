"""replay_journal: a journal written through the real sink folds to the live digest; torn tails,
planted bad events, failing invariants, --until and restarts are reported precisely."""

from __future__ import annotations

from pathlib import Path

import pytest
from cache_factories import geometry, run_request, tokens
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_replay import OPERATIONS, EngineDriver  # the cache tests' engine-playing driver

from hybridcache.cache import events as ev
from hybridcache.cache.errors import IntegrityError
from hybridcache.cache.facade import Cache
from hybridcache.cache.integrity import check_integrity
from hybridcache.persistence.event_sink import open_journal
from hybridcache.persistence.journal import JournalReader, JournalWriter
from hybridcache.persistence.replay_fold import ReplayError, replay_journal

GEOMETRY = geometry(num_pages=96, host_slabs=256)


def journaled_session(path: Path, requests: int = 4, checkpoint: bool = True) -> Cache:
    """A cache whose events go through the real journal sink; conversations with taps, then closed."""
    sink = open_journal(str(path), "/models/x", GEOMETRY, {"prefill_chunk": 64})
    cache = Cache(GEOMETRY, journal=sink)
    for turn in range(requests):
        run_request(
            cache, tokens(150, 1) + tokens(100 + 30 * turn, turn + 5), generated=tokens(40, turn), taps=[128]
        )
        if checkpoint:
            cache.checkpoint()
    sink.writer.close()
    return cache


def rewrite_journal(source: Path, target: Path, edit) -> None:
    """Re-journal the events of ``source`` through ``edit(events) -> events`` into ``target``."""
    reader = JournalReader(source)
    events = [ev.decode_event(p) for p in reader.payloads()]
    writer = JournalWriter(target, options=reader.header.options)
    for event in edit(events):
        writer.append(event.seq, ev.encode_event(event))
    writer.close()


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    seed=st.integers(0, 10_000),
    operations=st.lists(st.sampled_from(OPERATIONS), min_size=10, max_size=60),
    host_slabs=st.sampled_from([0, 40, 200]),
)
def test_a_random_sessions_journal_replays_to_the_live_digest(tmp_path_factory, seed, operations, host_slabs):
    path = tmp_path_factory.mktemp("journal") / "events.log"
    driver = EngineDriver(seed, host_slabs)
    sink = open_journal(str(path), "/models/x", driver.geometry, {})
    driver.cache.journal = sink
    for operation in operations:
        driver.step(operation)
    driver.drain()
    driver.cache.checkpoint()
    sink.writer.close()

    result = replay_journal(path)

    assert result.ok and result.violation is None and not result.damage
    assert result.state.digest == driver.cache.index.digest()
    assert result.events == driver.cache.index.seq and result.checkpoints >= 1


def test_rotated_segments_replay_as_one_history(tmp_path: Path):
    path = tmp_path / "events.log"
    sink = open_journal(str(path), "/models/x", GEOMETRY, {})
    sink.writer._max_segment_bytes = 2048  # rotate often
    cache = Cache(GEOMETRY, journal=sink)
    for turn in range(4):
        run_request(cache, tokens(150, 1) + tokens(90 + 20 * turn, turn), generated=tokens(30, turn))
    sink.writer.close()
    result = replay_journal(path)
    assert len(result.segments) > 2 and result.ok
    assert result.state.digest == cache.index.digest()


def test_a_torn_tail_is_reported_and_the_prefix_replays(tmp_path: Path):
    path = tmp_path / "events.log"
    journaled_session(path)
    data = path.read_bytes()
    path.write_bytes(data[:-7])  # the crash tore the last frame

    result = replay_journal(path)

    assert result.ok and len(result.damage) == 1 and result.damage[0].torn_tail
    assert result.damage[0].reason.startswith("torn frame")
    full = replay_journal(tmp_path / "events.log", until=result.state.seq)
    assert full.state == result.state


def test_corruption_in_an_older_segment_is_not_a_torn_tail(tmp_path: Path):
    path = tmp_path / "events.log"
    sink = open_journal(str(path), "/models/x", GEOMETRY, {})
    sink.writer._max_segment_bytes = 2048
    cache = Cache(GEOMETRY, journal=sink)
    for turn in range(3):
        run_request(cache, tokens(150, 1) + tokens(90 + 20 * turn, turn), generated=tokens(30, turn))
    sink.writer.close()
    oldest = path.with_name("events.log.1")
    data = bytearray(oldest.read_bytes())
    data[-3] ^= 0xFF
    oldest.write_bytes(bytes(data))

    result = replay_journal(path)

    assert not result.ok and not result.damage[0].torn_tail and "checksum" in result.damage[0].reason


def test_find_violation_names_a_planted_bad_event(tmp_path: Path):
    journaled_session(tmp_path / "good.log")

    def plant(events):
        # Re-grant a page the first lane already owns, right after the grant.
        grant = next(i for i, e in enumerate(events) if isinstance(e, ev.LanePagesGranted) and e.pages)
        bad = ev.LanePagesGranted(events[grant].seq + 1, events[grant].lane, events[grant].pages[:1])
        shifted = [type(e)(*(e.seq + 1, *_fields(e)[1:])) for e in events[grant + 1 :]]
        return [*events[: grant + 1], bad, *shifted]

    rewrite_journal(tmp_path / "good.log", tmp_path / "bad.log", plant)
    result = replay_journal(tmp_path / "bad.log")

    assert result.violation is not None and result.violation.kind == "rejected"
    assert "LanePagesGranted" in result.violation.event and "not free" in result.violation.invariant
    assert result.state.seq == result.violation.seq - 1


def _fields(event: ev.CacheEvent) -> tuple:
    return tuple(getattr(event, name) for name in event.__struct_fields__)


def test_find_violation_reports_the_first_event_after_which_an_invariant_fails(tmp_path: Path):
    journaled_session(tmp_path / "events.log")

    def check_breaks_with_the_first_snapshot(index):
        check_integrity(index)
        if index.snapshots:
            raise IntegrityError("planted: no snapshot may exist")

    result = replay_journal(tmp_path / "events.log", check=check_breaks_with_the_first_snapshot)

    assert result.violation is not None and result.violation.kind == "invariant"
    assert "SnapshotPublished" in result.violation.event and "planted" in result.violation.invariant


def test_a_checkpoint_with_a_wrong_digest_is_a_violation(tmp_path: Path):
    journaled_session(tmp_path / "good.log")

    def corrupt_checkpoint(events):
        return [ev.Checkpoint(e.seq, e.digest ^ 1) if isinstance(e, ev.Checkpoint) else e for e in events]

    rewrite_journal(tmp_path / "good.log", tmp_path / "bad.log", corrupt_checkpoint)
    result = replay_journal(tmp_path / "bad.log")
    assert result.violation is not None and result.violation.kind == "checkpoint"


def test_until_stops_at_that_event(tmp_path: Path):
    journaled_session(tmp_path / "events.log")
    result = replay_journal(tmp_path / "events.log", until=25, stats_every=10)
    assert result.stopped_at_until and result.state.seq == 25 == result.events
    assert [row.seq for row in result.stats] == [10, 20, 25]


def test_a_new_engine_run_in_the_same_journal_starts_a_fresh_fold(tmp_path: Path):
    path = tmp_path / "events.log"
    journaled_session(path, requests=2)
    second = journaled_session(path, requests=1)  # the previous file becomes events.log.1
    result = replay_journal(path)
    assert result.runs == 2 and result.ok and result.state.digest == second.index.digest()


def test_a_journal_without_geometry_cannot_be_replayed(tmp_path: Path):
    writer = JournalWriter(tmp_path / "events.log", options={})
    writer.append(1, ev.encode_event(ev.Checkpoint(1, 0)))
    writer.close()
    with pytest.raises(ReplayError, match="geometry"):
        replay_journal(tmp_path / "events.log")
