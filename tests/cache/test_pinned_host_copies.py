"""Host copies that a running lane's pinned device copies duplicate (host_eviction.pinned_duplicates):
chosen after dead KV and before any snapshot, never for a hedge; dropping them keeps the device copies,
and the lane's release lists those blocks as device-only (write-back copies them again)."""

import pytest
from cache_factories import checked_cache, flush_and_land, geometry, prompt, run_request, tokens
from hypothesis import given
from hypothesis import strategies as st

from hybridcache.cache import events as ev
from hybridcache.cache.errors import EventRejected
from hybridcache.cache.host_eviction import pinned_duplicates, plan_host_room
from hybridcache.cache.index import PrefixIndex
from hybridcache.cache.integrity import check_integrity
from hybridcache.cache.lru import spans_without
from hybridcache.cache.records import LruList, Residency
from hybridcache.cache.write_back import HostWrite

HISTORY = tokens(256, seed=1)  # four blocks, an endpoint at 256


def resumed_lane(land: bool = True, host_write: HostWrite = HostWrite.BACK, journal: list | None = None):
    """A cache whose lane 1 runs a request resumed from lane 0's endpoint, its 4-block path on both tiers
    and pinned; returns (cache, the path's nodes from block 0)."""
    cache = checked_cache(geometry(host_slabs=64), journal=journal, host_write=host_write)
    run_request(cache, HISTORY, lane=0)
    flush_and_land(cache)  # write-back mode writes the path now, write-through already did at the finish
    assert all(n.host_state is Residency.RESIDENT for n in cache.index.nodes.values() if n.parent)
    quoted = cache.quote(prompt(HISTORY + tokens(64, seed=2)))
    assert quoted.reuse_tokens == 256
    staged = cache.stage(quoted, 1)
    if land and staged.restore is not None:
        cache.restore_done(staged.restore.batch)
    cache.activate(1)
    path = cache.index.lanes[1].path
    return cache, list(path)


def test_a_running_lanes_path_is_offered_deepest_first_up_to_the_count():
    cache, path = resumed_lane()
    assert pinned_duplicates(cache.index, 3) == [path[3], path[2], path[1]]
    assert pinned_duplicates(cache.index, 10) == path[::-1]


def test_they_come_after_dead_kv_and_before_any_snapshot_when_asked_for():
    cache, path = resumed_lane()
    index = cache.index
    assert not index.dead_nodes
    needed = index.host.num_free + 2
    step = plan_host_room(index, needed, release_pinned=True)
    assert step == [ev.PinnedHostCopiesDropped(0, (path[3].id, path[2].id))]
    assert not any(isinstance(e, ev.PinnedHostCopiesDropped) for e in plan_host_room(index, needed) or [])


@pytest.mark.parametrize("host_write", [HostWrite.BACK, HostWrite.THROUGH])
def test_only_write_back_mode_releases_them_and_never_for_a_hedge(host_write: HostWrite):
    cache, path = resumed_lane(host_write=host_write)
    index = cache.index
    endpoint = next(s for s in index.snapshots.values() if s.frontier == 256)
    assert not cache._free_host_slabs_below(index.host.num_free + 1, endpoint)  # a hedge-style write
    assert path[3].host_state is Residency.RESIDENT
    assert cache._free_host_slabs(index.host.num_free + 1)
    if host_write is HostWrite.BACK:  # the pinned copy went, the snapshot's image stayed
        assert path[3].host_state is Residency.ABSENT and endpoint.host_slabs
    else:  # write-through keeps the copy (--cache-dir finds the path after a crash): the image went
        assert path[3].host_state is Residency.RESIDENT and not endpoint.host_slabs


def test_dropping_keeps_the_device_copies_and_the_release_lists_them_device_only():
    cache, path = resumed_lane()
    index = cache.index
    free = index.host.num_free
    cache._apply(ev.PinnedHostCopiesDropped(0, (path[3].id, path[2].id)))  # integrity checked after it
    assert index.host.num_free == free + 2
    both, device_only = (Residency.RESIDENT, Residency.RESIDENT), (Residency.RESIDENT, Residency.ABSENT)
    assert [(n.device_state, n.host_state) for n in path] == [both] * 2 + [device_only] * 2
    cache.release(1)
    assert [n.lru_list for n in path] == [LruList.BACKED] * 2 + [LruList.UNBACKED] * 2
    # The endpoint still resumes whole: its blocks are on the device.
    assert cache.quote(prompt(HISTORY + tokens(64, seed=3))).reuse_tokens == 256


def test_a_block_pinned_by_no_lane_or_named_twice_is_refused():
    cache, path = resumed_lane()
    cache.release(1)
    with pytest.raises(EventRejected, match="not pinned by a lane"):
        cache._apply(ev.PinnedHostCopiesDropped(0, (path[3].id,)))
    with pytest.raises(EventRejected, match="named twice"):
        cache._apply(ev.PinnedHostCopiesDropped(0, (path[3].id, path[3].id)))


def test_a_block_on_one_tier_only_is_refused():
    cache, path = resumed_lane()
    cache._apply(ev.PinnedHostCopiesDropped(0, (path[3].id,)))
    with pytest.raises(EventRejected, match="not on both tiers"):
        cache._apply(ev.PinnedHostCopiesDropped(0, (path[3].id,)))


def test_spans_without_cuts_spans_around_the_blocks_deepest_first():
    assert spans_without([(10, 20), (0, 5)], {15, 0, 5}) == [(16, 20), (10, 14), (1, 4)]
    assert spans_without([(3, 3)], {3}) == []
    assert spans_without([(0, 9)], {0, 9}) == [(1, 8)]
    assert spans_without([(0, 9)], {12}) == [(0, 9)]


@given(st.lists(st.integers(0, 60), max_size=20), st.sets(st.integers(0, 60), max_size=20))
def test_spans_without_keeps_every_other_block_once_in_deepest_first_order(cuts, blocks):
    edges = sorted(set(cuts), reverse=True)
    # disjoint, deepest first
    spans = [(low, high) for high, low in zip(edges[::2], edges[1::2], strict=False)]
    kept = spans_without(spans, blocks)
    covered = [b for first, last in kept for b in range(last, first - 1, -1)]
    expected = [b for first, last in spans for b in range(last, first - 1, -1) if b not in blocks]
    assert covered == expected
    assert all(first <= last for first, last in kept)


def test_the_cache_directory_journal_releases_the_dropped_blocks():
    from hybridcache.persistence.contents_records import BlockReleased
    from hybridcache.persistence.contents_sink import ContentsSink

    cache, path = resumed_lane()
    sink = ContentsSink(cache.index, cache.index.host.num_slabs)
    written: list = []
    sink.writer = type("Writer", (), {"append": lambda self, items: written.extend(items)})()
    event = ev.PinnedHostCopiesDropped(0, (path[3].id, path[2].id))
    cache._apply(event)
    sink.append(event)
    assert written == [BlockReleased(path[3].id), BlockReleased(path[2].id)]


def test_a_journal_with_the_drop_replays_to_the_same_state():
    journal: list = []
    cache, _ = resumed_lane(journal=journal)
    assert cache._free_host_slabs(cache.index.host.num_free + 2)
    cache.release(1)
    assert any(isinstance(e, ev.PinnedHostCopiesDropped) for e in journal)
    replayed = PrefixIndex(cache.index.geometry)
    for event in journal:
        replayed.apply(ev.decode_event(ev.encode_event(event)))
    check_integrity(replayed)
    assert replayed.digest() == cache.index.digest()
