"""Supersession and device slot admission (§9.2, §9.3, §13.1)."""

from cache_factories import checked_cache, geometry, insert_path, linear_cost, prompt, run_request, tokens

from hybridcache.cache.events import (
    GdsfInflated,
    SnapshotDeleted,
    SnapshotDeviceDropped,
    SnapshotSuperseded,
)
from hybridcache.cache.host_eviction import plan_host_room, plan_supersession
from hybridcache.cache.records import SnapshotKind
from hybridcache.cache.slots import plan_snapshot_slot


def test_a_lineage_supersedes_its_previous_snapshot_and_a_hit_retains_it():
    cache = checked_cache()
    history = tokens(256, seed=1)
    _, _, first = run_request(cache, history, lane=0)
    _, _, second = run_request(cache, history + tokens(100, seed=2), lane=1)
    snapshots = cache.index.snapshots
    assert snapshots[first.endpoint].superseded and not snapshots[second.endpoint].superseded
    run_request(cache, history + tokens(5, seed=3), lane=0)  # a retry diverging before the newer one
    assert not snapshots[first.endpoint].superseded


def test_a_prompts_later_tap_supersedes_its_earlier_tap_but_the_endpoint_keeps_the_last_tap():
    cache = checked_cache(geometry(snapshot_slots=4))
    _, _, finished = run_request(cache, tokens(400, seed=1), taps=[128, 256])
    by_frontier = {s.frontier: s for s in cache.index.snapshots.values()}
    assert by_frontier[128].superseded and not by_frontier[256].superseded
    assert finished.endpoint is not None and not by_frontier[400].superseded


def _boundary_snapshot(cache, toks, position):
    cache.stage(cache.quote(prompt(toks)), 0)
    cache.activate(0)
    assert cache.take_tap(0, position, boundary=True).slot is not None
    cache.commit_blocks(0, toks)
    published = cache.publish_ready_taps(0, toks).published
    cache.release(0)
    return cache.index.snapshots[published[0].snapshot]


def test_a_boundary_is_superseded_only_while_the_tree_below_it_is_one_chain():
    cache = checked_cache()
    preamble = tokens(128, seed=1)
    boundary = _boundary_snapshot(cache, preamble + tokens(130, seed=2), 128)
    assert boundary.kind == SnapshotKind.BOUNDARY
    assert plan_supersession(cache.index, [boundary.id], 300) == [SnapshotSuperseded(0, boundary.id)]
    insert_path(cache, preamble + tokens(128, seed=3), lane=1)  # another conversation continues below it
    assert plan_supersession(cache.index, [boundary.id], 300) == []


def _fill_slots(cache, count, seeds=(11, 12, 13, 14)):
    endpoints = []
    for seed in seeds[:count]:
        _, _, finished = run_request(cache, tokens(200, seed=seed), lane=0)
        endpoints.append(finished.endpoint)
    return endpoints


def test_device_slots_go_to_superseded_owners_first():
    cache = checked_cache(geometry(snapshot_slots=2), cost=linear_cost())
    older, newer = _fill_slots(cache, 2)
    assert plan_snapshot_slot(cache.index, 1.0, needs_free_slot=False) == [SnapshotDeviceDropped(0, older)]
    cache._apply(SnapshotSuperseded(0, newer))
    assert plan_snapshot_slot(cache.index, 1.0, needs_free_slot=False) == [SnapshotDeviceDropped(0, newer)]


def test_a_device_only_owner_is_displaced_only_by_a_snapshot_worth_as_much():
    cache = checked_cache(geometry(host_slabs=0, snapshot_slots=2), cost=linear_cost())
    first, second = _fill_slots(cache, 2)
    cheapest = min((first, second), key=lambda s: (cache.index.snapshots[s].gdsf_h, s))
    value = cache.index.snapshots[cheapest].gdsf_h
    assert plan_snapshot_slot(cache.index, value * 0.5, needs_free_slot=False) is None
    assert plan_snapshot_slot(cache.index, value, needs_free_slot=False) == [
        GdsfInflated(0, value),
        SnapshotDeleted(0, cheapest),
    ]


def test_a_hedge_never_deletes_a_device_only_snapshot_of_another_class():
    cache = checked_cache(geometry(host_slabs=0, snapshot_slots=2), cost=linear_cost())
    _fill_slots(cache, 2)
    worth_more = 2 * max(s.gdsf_h for s in cache.index.snapshots.values())
    assert plan_snapshot_slot(cache.index, worth_more, needs_free_slot=False, hedge=True) is None
    assert plan_snapshot_slot(cache.index, worth_more, needs_free_slot=False) is not None


def test_host_backed_owners_give_up_the_least_recently_hit_device_copy():
    cache = checked_cache(geometry(snapshot_slots=2), cost=linear_cost())
    first_tokens = tokens(200, seed=11)
    first, second = _fill_slots(cache, 2)
    run_request(cache, first_tokens + tokens(20, seed=5), lane=1)  # hits the first: now the second is LRU
    assert cache.index.snapshots[first].last_hit_tick > cache.index.snapshots[second].last_hit_tick
    assert plan_snapshot_slot(cache.index, 0.0, needs_free_slot=False) == [SnapshotDeviceDropped(0, second)]


def test_a_host_write_displaces_the_lowest_valued_snapshot_whatever_its_worth():
    # Deviation from §9.3 (see host_eviction's module note): the write is never refused on value.
    cache = checked_cache(geometry(host_slabs=12, snapshot_slots=4), cost=linear_cost())
    _, _, finished = run_request(cache, tokens(150, seed=1))
    index = cache.index
    value = index.snapshots[finished.endpoint].gdsf_h
    assert not index.dead_nodes
    step = plan_host_room(index, index.host.num_slabs)
    assert step is not None and step[-1].snapshot == finished.endpoint
    assert GdsfInflated(0, value) in step
