"""Liveness (§9.4, §13.1): live_snapshots_below under publish / evict / subtree deletion."""

from cache_factories import checked_cache, geometry, run_request, tokens

from hybridcache.cache.device_eviction import plan_device_eviction
from hybridcache.cache.events import SnapshotDeleted, SubtreeDeleted
from hybridcache.cache.records import LIVE_BELOW_CAP


def live_below(cache, node_id: int) -> int:
    return cache.index.nodes[node_id].live_snapshots_below


def test_live_snapshots_below_follows_interleaved_publish_evict_and_subtree_deletion():
    cache = checked_cache(geometry(host_slabs=60, snapshot_slots=4))
    index = cache.index
    shared = tokens(128, seed=1)
    _, _, first = run_request(cache, shared + tokens(100, seed=2), lane=0)
    shared_top = index.snapshots[first.endpoint].anchor
    while shared_top.depth > 1:
        shared_top = shared_top.parent
    assert live_below(cache, shared_top.id) == 1
    _, _, second = run_request(cache, shared + tokens(150, seed=3), lane=1)
    assert live_below(cache, shared_top.id) == 2 and index.root.live_snapshots_below == 2
    cache._apply(SnapshotDeleted(0, first.endpoint))  # host eviction of a victim with no device copy
    assert live_below(cache, shared_top.id) == 1
    _, _, third = run_request(cache, shared + tokens(90, seed=5), lane=0)
    assert live_below(cache, shared_top.id) == 2
    second_branch = index.snapshots[second.endpoint].anchor
    while second_branch.depth > 2:
        second_branch = second_branch.parent
    cache._apply(SubtreeDeleted(0, second_branch.id))  # the branch lost its last copy (§9.4)
    assert set(index.snapshots) == {third.endpoint}
    assert live_below(cache, shared_top.id) == 1 and index.root.live_snapshots_below == 1


def test_losing_the_last_copy_deletes_exactly_the_subtree_snapshots():
    cache = checked_cache(geometry(num_pages=40, host_slabs=0, snapshot_slots=4))
    shared = tokens(128, seed=1)
    _, _, left = run_request(cache, shared + tokens(130, seed=2), lane=0)
    _, _, right = run_request(cache, shared + tokens(200, seed=3), lane=1)
    index = cache.index
    left_snapshot = index.snapshots[left.endpoint]
    left_leaf = left_snapshot.anchor
    doomed_subtree_top = left_leaf
    while doomed_subtree_top.depth > 2:
        doomed_subtree_top = doomed_subtree_top.parent
    assert doomed_subtree_top.depth == 2
    cache._apply(SubtreeDeleted(0, doomed_subtree_top.id))
    assert set(index.snapshots) == {right.endpoint}
    assert index.nodes[doomed_subtree_top.parent.id].live_snapshots_below == 1
    assert all(node.depth < 2 or node.live_snapshots_below == 1 for node in index.nodes.values())


def test_unbacked_device_eviction_deletes_subtrees_deepest_first():
    cache = checked_cache(geometry(num_pages=24, host_slabs=0))
    run_request(cache, tokens(300, seed=4), lane=0)
    index = cache.index
    deleted_depths = []
    while index.num_free_pages < index.geometry.num_pages:
        events = plan_device_eviction(index, index.geometry.num_pages)
        if not events:
            break
        for event in events:
            if isinstance(event, SubtreeDeleted):
                deleted_depths.append(index.nodes[event.node].depth)
            cache._apply(event)
    assert deleted_depths == sorted(deleted_depths, reverse=True)
    assert len(index.nodes) == 1 and not index.snapshots and index.root.live_snapshots_below == 0


def test_counts_saturate_above_a_node_with_more_than_two_live_snapshots_below():
    """A node holds its own snapshots plus each child's count capped at LIVE_BELOW_CAP: exact up to two,
    at least LIVE_BELOW_CAP beyond, so retirements walk up only while a capped count changes."""
    cache = checked_cache(geometry(host_slabs=120, snapshot_slots=6))  # rebuilt and compared every event
    index = cache.index
    shared = tokens(128, seed=1)
    endpoints = [
        run_request(cache, shared + tokens(100, seed=2 + n), lane=n % 2)[2].endpoint for n in range(5)
    ]
    shared_top = index.snapshots[endpoints[0]].anchor
    while shared_top.depth > 1:
        shared_top = shared_top.parent
    assert live_below(cache, shared_top.id) == 5  # five branches, one snapshot each: an exact sum
    assert index.root.live_snapshots_below == LIVE_BELOW_CAP  # its one child's count, capped
    seen = []
    for endpoint in endpoints:
        cache._apply(SnapshotDeleted(0, endpoint))
        seen.append((live_below(cache, shared_top.id), index.root.live_snapshots_below))
    assert seen == [(4, 3), (3, 3), (2, 2), (1, 1), (0, 0)]
