"""The recency floor (cache/recency_floor.py): its gate, what it spares, and the host victim it changes."""

from types import SimpleNamespace

from cache_factories import checked_cache, geometry, linear_cost, run_request, tokens

from hybridcache.cache.host_eviction import plan_host_room
from hybridcache.cache.integrity import check_integrity
from hybridcache.cache.recency_floor import (
    DEEP_TOKENS,
    GATE_DELETIONS,
    WINDOW_S,
    YOUNG_S,
    RecencyFloor,
    finished_unit,
)
from hybridcache.cache.records import SnapshotKind
from hybridcache.cache.write_back import HostWrite


def snap(sid: int, frontier: int = DEEP_TOKENS + 64, dependents=(), kind=SnapshotKind.ENDPOINT):
    return SimpleNamespace(id=sid, frontier=frontier, dependents=dict.fromkeys(dependents), kind=kind)


def delete_young(floor: RecencyFloor, first_id: int, now: float, age: float, count: int = GATE_DELETIONS):
    """``count`` deep newest snapshots, each finished ``age`` seconds before it is deleted at ``now``."""
    for sid in range(first_id, first_id + count):
        floor.finished([sid], now - age)
        floor.deleted(snap(sid), now)


def test_the_floor_is_off_until_deep_conversations_go_minutes_after_they_spoke():
    floor = RecencyFloor()
    assert floor.spared(1000.0) is None
    delete_young(floor, 0, 1000.0, age=YOUNG_S / 2, count=GATE_DELETIONS - 1)
    assert not floor.is_on(1000.0)  # one deletion short
    delete_young(floor, 100, 1000.0, age=YOUNG_S / 2, count=1)
    assert floor.is_on(1000.0) and floor.switched_on == 1
    assert floor.is_on(1000.0 + WINDOW_S - 1) and not floor.is_on(1000.0 + WINDOW_S)


def test_a_median_of_old_deletions_keeps_it_off():
    floor = RecencyFloor()
    half = GATE_DELETIONS // 2
    delete_young(floor, 0, 5000.0, age=10.0, count=half)
    for sid in range(100, 100 + GATE_DELETIONS - half):  # finished too long ago to be remembered
        floor.deleted(snap(sid), 5000.0)
    assert not floor.is_on(5000.0)


def test_shallow_shared_and_hedge_deletions_do_not_count():
    floor = RecencyFloor()
    for sid in range(3 * GATE_DELETIONS):
        floor.finished([sid], 990.0)
    for sid in range(GATE_DELETIONS):
        floor.deleted(snap(sid, frontier=DEEP_TOKENS), 1000.0)  # not deeper than DEEP_TOKENS
        floor.deleted(snap(GATE_DELETIONS + sid, dependents=[7]), 1000.0)  # not a lineage's newest
        floor.deleted(snap(2 * GATE_DELETIONS + sid, kind=SnapshotKind.HEDGE), 1000.0)
    assert not floor.is_on(1000.0)


def test_it_spares_what_finished_within_the_window_and_forgets_older_finishes():
    floor = RecencyFloor()
    floor.finished([1], 0.0)
    floor.finished([2], 900.0)
    delete_young(floor, 10, 1000.0, age=1.0)
    spared = floor.spared(1000.0)
    assert spared is not None
    assert spared(snap(2)) and not spared(snap(1)) and not spared(snap(99))
    floor.finished([3], 1000.0)
    assert 1 not in floor._finished  # older than the window and the gate's horizon: forgotten
    assert floor.spared(1000.0 + WINDOW_S) is None


def host_cache():
    return checked_cache(
        geometry(host_slabs=200, snapshot_slots=4), cost=linear_cost(), host_write=HostWrite.THROUGH
    )


def test_plan_host_room_takes_the_lowest_unspared_victim_and_all_when_all_are_spared():
    cache = host_cache()
    index = cache.index
    for lane, seed in enumerate((1, 2, 3)):
        run_request(cache, tokens(256 + 64 * lane, seed=seed), lane=lane)
    want = index.host.num_slabs
    natural = plan_host_room(index, want)
    assert natural is not None
    first = natural[-1].snapshot
    step = plan_host_room(index, want, spared=lambda s: s.id == first)
    assert step is not None and step[-1].snapshot != first
    second = index.snapshots[step[-1].snapshot]
    others = [s for s in index.snapshots.values() if s.host_slabs and s.id != first]
    assert second.gdsf_h == min(s.gdsf_h for s in others)
    assert plan_host_room(index, want, spared=lambda s: True) == natural


def test_a_finish_records_its_unit_and_the_cache_spares_it_while_the_floor_is_on():
    cache = host_cache()
    index = cache.index
    cache.now = 0.0
    _, _, old = run_request(cache, tokens(320, seed=1), lane=0)
    cache.now = 900.0
    _, _, new = run_request(cache, tokens(320, seed=2), lane=1)
    assert finished_unit(index.snapshots[new.endpoint], 0) == [new.endpoint]
    assert cache._spared() is None  # the gate has not fired
    delete_young(cache.recency_floor, 10_000, 950.0, age=1.0)
    cache.now = 1000.0
    spared = cache._spared()
    assert spared is not None
    assert spared(index.snapshots[new.endpoint]) and not spared(index.snapshots[old.endpoint])
    step = plan_host_room(index, index.host.num_slabs, spared=spared)
    assert step is not None and step[-1].snapshot == old.endpoint
    for event in step:
        cache._apply(event)
    check_integrity(index)


def test_without_a_time_from_its_owner_the_cache_never_floors():
    cache = host_cache()
    _, _, result = run_request(cache, tokens(320, seed=1), lane=0)
    assert cache.now is None and cache._spared() is None
    assert not cache.recency_floor._finished
    assert result.endpoint in cache.index.snapshots
