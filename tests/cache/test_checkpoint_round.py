"""Rolling checkpoints: a round of sliced Checkpoint events covers every record once, replay checks each
slice at its own seq, the live index digests each slice once, and a slice stays small at any size."""

from __future__ import annotations

import pytest

from hybridcache.cache import events as ev
from hybridcache.cache import index as index_module
from hybridcache.cache.checkpoint_round import (
    RECORDS_PER_PART,
    CheckpointRound,
    checkpoint_parts,
)
from hybridcache.cache.digest import _keys_in_part, state_bytes
from hybridcache.cache.errors import EventRejected
from hybridcache.cache.index import PrefixIndex
from hybridcache.cache.integrity import check_integrity
from hybridcache.tools.bench_checkpoint import build_large_index


def run_round(cache, parts: int) -> None:
    rounds = CheckpointRound()
    rounds.begin(parts)
    while rounds.active:
        cache.checkpoint(*rounds.take())


def fold(geometry, prefix: list[ev.CacheEvent], events: list[ev.CacheEvent], corrupt=None) -> PrefixIndex:
    index = PrefixIndex(geometry)
    for event in prefix:
        index.apply(event)
    if corrupt is not None:
        corrupt(index)
    for event in events:
        index.apply(event)
    return index


def test_a_slice_of_one_part_is_the_whole_state():
    cache = build_large_index(5, 6, tap_every=2)
    assert state_bytes(cache.index, 0, 1) == state_bytes(cache.index)
    assert cache.index.digest(0, 1) == cache.index.digest()


@pytest.mark.parametrize("parts", [2, 3, 7, 64])
def test_the_parts_of_a_round_cover_every_record_exactly_once(parts: int):
    index = build_large_index(6, 9, tap_every=3).index
    for mapping, limit in ((index.nodes, index.next_node_id), (index.snapshots, index.next_snapshot_id)):
        covered = [key for part in range(parts) for key in _keys_in_part(mapping, limit, part, parts)]
        assert sorted(covered) == sorted(mapping)
        probed = [_keys_in_part(mapping, limit, part, parts) for part in range(parts)]
        scanned = [sorted(k for k in mapping if k % parts == part) for part in range(parts)]
        assert probed == scanned  # probing ids and scanning the mapping agree


def test_replay_checks_each_slice_and_rejects_the_slice_holding_a_corrupted_node():
    journal: list[ev.CacheEvent] = []
    cache = build_large_index(8, 10, tap_every=3, journal=journal)
    parts = 5
    prefix = list(journal)
    run_round(cache, parts)
    assert [(e.part, e.parts) for e in journal[len(prefix):]] == [(p, parts) for p in range(parts)]
    round_events = journal[len(prefix):]

    replayed = fold(cache.index.geometry, prefix, round_events)
    assert replayed.digest() == cache.index.digest()
    check_integrity(replayed)

    victim = max(node for node in cache.index.nodes if node % parts == 3)

    def corrupt(index: PrefixIndex) -> None:
        index.nodes[victim].last_access_tick += 1

    with pytest.raises(EventRejected, match="digest differs") as caught:
        fold(cache.index.geometry, prefix, round_events, corrupt)
    assert f"seq {round_events[3].seq}" in str(caught.value)  # the fourth slice (part 3) caught it


def test_replay_catches_a_reordered_lru_in_a_slice():
    journal: list[ev.CacheEvent] = []
    cache = build_large_index(8, 10, tap_every=3, journal=journal)
    prefix = list(journal)
    run_round(cache, 4)
    round_events = journal[len(prefix):]

    def reorder(index: PrefixIndex) -> None:
        entry = next(node for node in index.nodes.values() if node.lru_list)
        which = entry.lru_list
        index.lru.remove(entry)
        index.lru.push_mru(entry, which)

    with pytest.raises(EventRejected, match="digest differs"):
        fold(cache.index.geometry, prefix, round_events, reorder)


def test_the_live_index_digests_each_slice_once(monkeypatch: pytest.MonkeyPatch):
    cache = build_large_index(4, 6, tap_every=2)
    calls = []
    real = index_module.state_bytes
    monkeypatch.setattr(index_module, "state_bytes", lambda *a: calls.append(a[1:]) or real(*a))
    cache.checkpoint(1, 3)
    cache.checkpoint()
    assert calls == [(1, 3), (0, 1)]


def test_slices_stay_small_as_the_index_grows():
    for conversations in (4, 40, 120):
        index = build_large_index(conversations, 25, tap_every=5).index
        parts = checkpoint_parts(index)
        records = len(index.nodes) + 2 * len(index.snapshots)
        assert parts >= records // RECORDS_PER_PART
        whole = len(state_bytes(index))
        largest = max(len(state_bytes(index, part, parts)) for part in range(parts))
        assert largest <= 2 * whole // parts + 4096, (conversations, parts, largest, whole)


def test_a_round_hands_out_each_part_once():
    rounds = CheckpointRound()
    assert not rounds.active
    with pytest.raises(ValueError):
        rounds.take()
    rounds.begin(3)
    with pytest.raises(ValueError):
        rounds.begin(2)
    assert [rounds.take() for _ in range(3)] == [(0, 3), (1, 3), (2, 3)]
    assert not rounds.active
    with pytest.raises(ValueError):
        rounds.begin(0)
