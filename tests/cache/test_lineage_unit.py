"""Lineage units (cache/lineage_unit.py): the chain, the checkpoints kept, and the value they share."""

import pytest
from cache_factories import IMAGE, PAGE, checked_cache, geometry, linear_cost, prompt, run_request, tokens
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridcache.cache.events import SnapshotDeleted, SnapshotDeviceDropped, SnapshotHostDropped
from hybridcache.cache.host_eviction import plan_host_room, plan_revalue, tempered_density
from hybridcache.cache.lineage_unit import (
    CHECKPOINT_SPACING,
    MIN_CHECKPOINT_GAP,
    lineage_newest,
    lineage_of,
    unit_of,
)
from hybridcache.cache.records import SnapshotKind
from hybridcache.cache.write_back import HostWrite


def unit_cache(host_slabs: int = 400, snapshot_slots: int = 40):
    """Write-through, so every block and image lands on the host (the host policy is under test)."""
    return checked_cache(
        geometry(num_pages=128, host_slabs=host_slabs, snapshot_slots=snapshot_slots),
        cost=linear_cost(),
        host_write=HostWrite.THROUGH,
    )


def by_frontier(cache):
    return {s.frontier: s for s in cache.index.snapshots.values()}


def first_host_victim(cache) -> int:
    index = cache.index
    step = plan_host_room(index, index.host.num_slabs)
    assert step, "something must be evictable"
    named = [e.snapshot for e in step if isinstance(e, SnapshotDeleted | SnapshotHostDropped)]
    assert len(named) == 1
    return named[0]


def test_checkpoints_lie_at_doubling_distances_from_the_newest():
    cache = unit_cache()
    toks = tokens(4096, seed=1)
    run_request(cache, toks, taps=range(256, 4096, 256))  # taps every 256 tokens, the endpoint at 4096
    snaps = by_frontier(cache)
    unit = lineage_of(snaps[4096])
    assert [s.frontier for s in unit.chain] == list(range(4096, 0, -256))
    # The parent (gap 256), then gaps of at least 2 x 256, 2 x 512, 2 x 1024; the next would need 4096.
    assert sorted(snaps[i].frontier for i in [s.frontier for s in unit.members()]) == [2048, 3072, 3584, 3840,
                                                                                       4096]
    assert unit.base == 0
    assert unit_of(snaps[1024]) == unit and unit_of(snaps[4096]) == unit


@settings(max_examples=25, deadline=None)
@given(st.sets(st.integers(min_value=1, max_value=47), min_size=1, max_size=20))
def test_every_snapshot_skipped_lies_too_close_to_the_last_checkpoint_kept(blocks):
    cache = unit_cache()
    toks = tokens(3072, seed=2)
    run_request(cache, toks, taps=[64 * b for b in blocks])
    unit = lineage_of(by_frontier(cache)[3072])
    newest = unit.newest
    last_gap = None
    for snap in unit.chain[1:]:  # newest first: the rule, step by step
        gap = newest.frontier - snap.frontier
        due = last_gap is None or gap >= CHECKPOINT_SPACING * max(last_gap, MIN_CHECKPOINT_GAP)
        assert (snap.id in unit.kept) == due
        if due:
            last_gap = gap


def test_hedges_are_walked_through_but_never_kept_and_keep_their_own_value():
    cache = unit_cache()
    toks = tokens(2048, seed=3)
    run_request(cache, toks, taps=[1024], hedges=[1536, 1792])
    snaps = by_frontier(cache)
    unit = lineage_of(snaps[2048])
    assert [s.frontier for s in unit.chain] == [2048, 1792, 1536, 1024]
    assert snaps[1792].kind == SnapshotKind.HEDGE
    assert unit.kept == {snaps[2048].id, snaps[1024].id}  # the hedge nearest the newest is passed over
    assert snaps[1536].gdsf_h != snaps[1536].base_l  # valued by itself, not thinned


def test_a_shared_snapshot_starts_each_lineage_below_it_and_belongs_to_none():
    cache = unit_cache()
    history = tokens(512, seed=4)
    _, _, first = run_request(cache, history, lane=0)  # E1 at 512
    run_request(cache, history + tokens(256, seed=5), lane=1)  # below E1
    run_request(cache, history + tokens(320, seed=6), lane=0)  # below E1 too: E1 is shared
    snaps = by_frontier(cache)
    e1 = cache.index.snapshots[first.endpoint]
    assert len(e1.dependents) == 2
    assert unit_of(e1) is None and lineage_newest(e1) is None
    for end in (768, 832):
        unit = unit_of(snaps[end])
        assert unit is not None and unit.base == 512 and [s.frontier for s in unit.chain] == [end]


def test_a_boundary_starts_a_unit_and_the_preamble_taps_above_it_are_kept_by_no_unit():
    cache = unit_cache()
    index = cache.index
    preamble = tokens(2048, seed=15)
    run_request(cache, preamble + tokens(512, seed=16), taps=range(256, 2048, 256), boundaries=[2048], lane=0)
    snaps = by_frontier(cache)
    boundary = snaps[2048]
    assert boundary.kind == SnapshotKind.BOUNDARY and len(boundary.dependents) == 1
    assert unit_of(boundary) is None
    unit = unit_of(snaps[1024])
    assert unit is not None and unit.newest is snaps[2560] and unit.base == 2048
    assert [s.frontier for s in unit.chain] == [2560]
    # While the Boundary ended its chain, the preamble was thinned to checkpoints below it.
    assert sorted(s.frontier for s in lineage_of(boundary).members()) == [1024, 1536, 1792, 2048]
    # Valued with the conversation's unit, a preamble tap is worth its L_s alone.
    valued = dict(zip(*_valued(plan_revalue(index, [snaps[1024]], cache.cost))))
    assert valued.get(snaps[1024].id, snaps[1024].gdsf_h) == snaps[1024].base_l
    run_request(cache, preamble + tokens(300, seed=17), lane=1)  # a second conversation shares it
    assert len(boundary.dependents) == 2 and unit_of(snaps[1024]) is None  # valued by itself again
    valued = dict(zip(*_valued(plan_revalue(index, [snaps[1024]], cache.cost))))
    assert valued.get(snaps[1024].id, snaps[1024].gdsf_h) > snaps[1024].base_l


def _valued(events) -> tuple[tuple[int, ...], tuple[float, ...]]:
    return (events[0].snapshots, events[0].values) if events else ((), ())


def test_the_newest_and_its_checkpoints_share_the_value_of_the_whole_unit():
    cache = unit_cache()
    toks = tokens(2048, seed=7)
    run_request(cache, toks, taps=range(256, 2048, 256))
    snaps = by_frontier(cache)
    unit = lineage_of(snaps[2048])
    members = unit.members()
    assert sorted(s.frontier for s in members) == [1024, 1536, 1792, 2048]
    # 2048 tokens from the root, over 32 path blocks and four host images (1 ms a token).
    expected = max(s.base_l for s in members) + tempered_density(2.048 / (4 * IMAGE + 32 * PAGE))
    for snap in members:
        assert snap.gdsf_h == pytest.approx(expected)
    for snap in unit.chain:
        if snap.id not in unit.kept:
            assert snap.gdsf_h == snap.base_l  # thinned: worth its L_s alone


def test_a_snapshot_the_unit_does_not_keep_is_the_first_host_victim():
    cache = unit_cache()
    run_request(cache, tokens(2048, seed=8), taps=range(256, 2048, 256), lane=0)
    run_request(cache, tokens(300, seed=9), lane=1)  # another conversation, short and fresh
    unit = lineage_of(by_frontier(cache)[2048])
    thinned = [s for s in unit.chain if s.id not in unit.kept]
    assert thinned and first_host_victim(cache) == min(thinned, key=lambda s: (s.gdsf_h, -s.frontier)).id


def test_a_unit_under_pressure_loses_its_deepest_member_first():
    cache = unit_cache()
    run_request(cache, tokens(2048, seed=8), taps=range(256, 2048, 256), lane=0)
    unit = lineage_of(by_frontier(cache)[2048])
    for snap in unit.chain:  # only the unit's members left, on the host alone
        if snap.id not in unit.kept:
            cache._apply(SnapshotDeleted(0, snap.id))
    for snap in unit.members():
        if snap.device_slot is not None:
            cache._apply(SnapshotDeviceDropped(0, snap.id))
    cache._revalue(unit.members())
    members = unit.members()
    assert len({s.gdsf_h for s in members}) == 1
    assert first_host_victim(cache) == max(members, key=lambda s: s.frontier).id  # the newest, 2048


def test_a_hit_on_the_newest_renews_the_whole_unit():
    cache = unit_cache()
    history = tokens(1024, seed=10)
    run_request(cache, history, taps=[256, 512, 768], lane=0)
    run_request(cache, tokens(2000, seed=11), lane=1)  # other traffic
    run_request(cache, tokens(1500, seed=12), lane=1)
    snaps = by_frontier(cache)
    parent = snaps[768]
    before = parent.gdsf_h
    quoted = cache.quote(prompt(history + tokens(100, seed=13)))
    assert quoted.snapshot == snaps[1024].id
    cache.stage(quoted, 0)
    cache.release(0)
    assert snaps[1024].hits == 1
    assert parent.gdsf_h > before and parent.gdsf_h == pytest.approx(snaps[1024].gdsf_h)


def test_replaying_the_journal_gives_the_same_values():
    from hybridcache.cache.index import PrefixIndex

    journal: list = []
    cache = checked_cache(geometry(num_pages=128, host_slabs=60, snapshot_slots=6), journal, linear_cost())
    history = tokens(1024, seed=14)
    for turn in range(5):
        history = history + tokens(192, seed=20 + turn)
        run_request(cache, history, taps=[len(history) - 512], lane=turn % 2)
    replayed = PrefixIndex(cache.index.geometry)
    for event in journal:
        replayed.apply(event)
    assert {s: replayed.snapshots[s].gdsf_h for s in replayed.snapshots} == {
        s: cache.index.snapshots[s].gdsf_h for s in cache.index.snapshots
    }
