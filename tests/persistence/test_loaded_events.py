"""BlockLoaded / SnapshotLoaded: host-only entries rebuilt from a file, validated before any change."""

from __future__ import annotations

import pytest
from cache_factories import checked_cache, geometry, tokens

from hybridcache.cache import events as ev
from hybridcache.cache.errors import EventRejected
from hybridcache.cache.facade import Cache
from hybridcache.cache.integrity import check_integrity
from hybridcache.cache.records import Residency

BLOCK = tuple(tokens(64, seed=1))
CHILD = tuple(tokens(64, seed=2))


def apply(cache: Cache, event: ev.CacheEvent) -> None:
    cache._apply(event)


def loaded_chain(cache: Cache) -> None:
    """Blocks 1 -> 2 on slabs 0, 1 and a tailed snapshot at block 2 on slabs 2, 3, 4 (+5 for its tail)."""
    apply(cache, ev.BlockLoaded(0, 1, 0, 11, BLOCK, 0, 0))
    apply(cache, ev.BlockLoaded(0, 2, 1, 12, CHILD, 0, 1))
    apply(cache, ev.SnapshotLoaded(0, 0, 2, 1, (5, 6), (2, 3, 4), 5, hits=3))


def assert_rejected_and_unchanged(cache: Cache, event: ev.CacheEvent, words: str) -> None:
    digest = cache.index.digest()
    with pytest.raises(EventRejected, match=words):
        apply(cache, event)
    assert cache.index.digest() == digest


def test_loaded_entries_are_host_only_and_their_blocks_live_below_the_snapshot():
    cache = checked_cache(geometry())
    loaded_chain(cache)
    index = cache.index
    snap = index.snapshots[0]
    assert snap.host_complete and snap.device_slot is None and snap.hits == 3
    assert snap.frontier == 128 + 2 and index.snapshot_by_key[(2, (5, 6))] is snap
    for node_id in (1, 2):
        node = index.nodes[node_id]
        assert node.host_state == Residency.RESIDENT and node.device_page is None
        assert node.live_snapshots_below == 1 and node_id not in index.dead_nodes
    assert index.host.num_used == 6 and index.next_node_id == 3 and index.next_snapshot_id == 1
    check_integrity(index)


def test_a_loaded_block_without_a_snapshot_is_dead_kv():
    cache = checked_cache(geometry())
    apply(cache, ev.BlockLoaded(0, 1, 0, 11, BLOCK, 0, 0))
    assert 1 in cache.index.dead_nodes
    apply(cache, ev.NodeHostDropped(0, 1))
    assert len(cache.index.nodes) == 1 and cache.index.host.num_used == 0


@pytest.mark.parametrize(
    ("event", "words"),
    [
        (ev.BlockLoaded(0, 1, 0, 99, CHILD, 0, 9), "in use"),
        (ev.BlockLoaded(0, 7, 42, 99, CHILD, 0, 9), "does not exist"),
        (ev.BlockLoaded(0, 7, 0, 11, BLOCK, 0, 9), "already has this child"),
        (ev.BlockLoaded(0, 7, 0, 99, CHILD[:10], 0, 9), "tokens"),
        (ev.BlockLoaded(0, 7, 1, 99, BLOCK, 0, 0), "slab 0 is not free"),
        (ev.SnapshotLoaded(0, 0, 1, 1, (), (6, 7, 8), None), "in use"),
        (ev.SnapshotLoaded(0, 1, 2, 1, (5, 6), (6, 7, 8), 9), "exists"),
        (ev.SnapshotLoaded(0, 1, 1, 1, (), (6, 7), None), "takes 3 slabs"),
        (ev.SnapshotLoaded(0, 1, 1, 1, (), (6, 7, 8), 9), "tail slab exactly"),
        (ev.SnapshotLoaded(0, 1, 1, 1, (4,), (6, 7, 8), None), "tail slab exactly"),
        (ev.SnapshotLoaded(0, 1, 1, 9, (), (6, 7, 8), None), "unknown kind"),
        (ev.SnapshotLoaded(0, 1, 1, 1, (), (6, 7, 2), None), "slab 2 is not free"),
    ],
)
def test_inconsistent_loads_are_rejected_without_a_change(event, words):
    cache = checked_cache(geometry())
    loaded_chain(cache)
    assert_rejected_and_unchanged(cache, event, words)


def test_loaded_events_survive_the_journal_encoding():
    for event in (
        ev.BlockLoaded(4, 1, 0, 11, BLOCK, 0, 0),
        ev.SnapshotLoaded(5, 0, 1, 3, (7,), (1, 2, 3), 4, 2),
    ):
        assert ev.decode_event(ev.encode_event(event)) == event


def test_a_loaded_snapshot_links_into_the_ancestry_of_snapshots_below_it():
    cache = checked_cache(geometry())
    loaded_chain(cache)
    apply(cache, ev.SnapshotLoaded(0, 1, 1, 0, (), (6, 7, 8), None))
    index = cache.index
    assert index.snapshots[0].ancestor is index.snapshots[1]
    assert set(index.snapshots[1].dependents) == {0}
    check_integrity(index)
