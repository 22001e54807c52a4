"""Host GDSF (§9.3, §13.1): hand-computed priorities, dead KV first, exclusive paths, monotonic L.

Priorities are GD*-tempered (host_eviction's module note): ``h(density)`` below is the expected H of a
snapshot published at L = 0 with that density.
"""

import pytest
from cache_factories import (
    IMAGE,
    PAGE,
    checked_cache,
    geometry,
    insert_path,
    linear_cost,
    run_request,
    tokens,
)

from hybridcache.cache.events import GdsfInflated, NodeHostDropped, SnapshotDeleted, SnapshotDeviceDropped
from hybridcache.cache.host_eviction import SUPERSEDED_WEIGHT, own_value, plan_host_room, tempered_density
from hybridcache.cache.index import PrefixIndex
from hybridcache.cache.write_back import HostWrite

RESTORE = IMAGE / 1e15  # restore_seconds(image) under linear_cost()


def h(density: float, weight: float = 1.0) -> float:
    """H of a snapshot valued at L = 0: its density, tempered (GD*), times its weight."""
    return weight * tempered_density(density)


def gdsf_cache(host_slabs: int = 200):
    """Write-through, so that every block lands on the host at release (the host policy is under test)."""
    return checked_cache(
        geometry(host_slabs=host_slabs, snapshot_slots=4), cost=linear_cost(), host_write=HostWrite.THROUGH
    )


def h_of(cache, snapshot_id) -> float:
    return cache.index.snapshots[snapshot_id].gdsf_h


def test_two_siblings_are_each_valued_as_a_unit_from_the_root():
    cache = gdsf_cache()
    shared = tokens(128, seed=1)
    _, _, a = run_request(cache, shared + tokens(128, seed=2), lane=0)  # endpoint at 256
    _, _, b = run_request(cache, shared + tokens(192, seed=3), lane=1)  # endpoint at 320, from the root
    # No snapshot lies where they part, so each lineage reaches the root: A saves 256 tokens over its
    # image and 4 path blocks, B 320 tokens over its image and 5 (lineage_unit.py).
    assert h_of(cache, a.endpoint) == pytest.approx(h(0.256 / (IMAGE + 4 * PAGE)))
    assert h_of(cache, b.endpoint) == pytest.approx(h(0.320 / (IMAGE + 5 * PAGE)))


def test_a_lineages_newest_and_its_parent_share_the_units_value_with_its_hits():
    cache = gdsf_cache()
    history = tokens(256, seed=1)
    _, _, first = run_request(cache, history, lane=0)  # E1 at 256
    quoted, _, second = run_request(cache, history + tokens(128, seed=2), lane=1)  # resumes E1, E2 at 384
    assert quoted.reuse_tokens == 256 and cache.index.snapshots[first.endpoint].superseded
    retry, _, third = run_request(cache, history + tokens(10, seed=3), lane=0)  # a retry re-retains E1
    assert retry.reuse_tokens == 256 and third.endpoint is None
    e1, e2 = cache.index.snapshots[first.endpoint], cache.index.snapshots[second.endpoint]
    assert not e1.superseded and e1.hits == 2
    # One unit: (1 + the most hits, 2) x 384 tokens from the root over two images and 6 path blocks, at
    # the latest L_s of the two (E1's last hit).
    expected = max(e1.base_l, e2.base_l) + h(3 * 0.384 / (2 * IMAGE + 6 * PAGE))
    assert e1.gdsf_h == pytest.approx(expected) and e2.gdsf_h == pytest.approx(expected)


def test_dead_kv_is_reclaimed_before_any_snapshot():
    cache = gdsf_cache()
    run_request(cache, tokens(256, seed=1), lane=0)
    insert_path(cache, tokens(256, seed=2), lane=1)  # written through, no snapshot can reach it
    dead = set(cache.index.dead_nodes)
    assert len(dead) == 4
    events = plan_host_room(cache.index, cache.index.host.num_free + 1)
    assert events == [NodeHostDropped(0, max(dead, key=lambda n: cache.index.nodes[n].depth))]


def test_evicting_a_snapshot_frees_its_exclusive_path_but_not_the_shared_one():
    cache = gdsf_cache()
    index = cache.index
    shared = tokens(128, seed=1)
    _, _, a = run_request(cache, shared + tokens(128, seed=2), lane=0)
    run_request(cache, shared + tokens(192, seed=3), lane=1)
    victim = index.snapshots[a.endpoint]
    exclusive = [n.id for n in index.path_to(victim.anchor)[2:]]
    shared_nodes = [n.id for n in index.path_to(victim.anchor)[:2]]
    cache._apply(SnapshotDeviceDropped(0, victim.id))  # only its host copy is left
    target = index.host.num_free + index.geometry.image_slabs + len(exclusive)
    steps = []
    while step := plan_host_room(index, target):
        steps.append(step)
        for event in step:
            cache._apply(event)
    assert steps[0] == [GdsfInflated(0, pytest.approx(victim.gdsf_h)), SnapshotDeleted(0, victim.id)]
    assert all(index.nodes[n].host_slab is None for n in exclusive)
    assert all(index.nodes[n].host_slab is not None for n in shared_nodes)


def test_the_inflation_value_never_falls_under_pressure():
    journal: list = []
    cache = checked_cache(geometry(host_slabs=20, snapshot_slots=4), journal, linear_cost())
    for seed in range(8):
        run_request(cache, tokens(150 + 40 * seed, seed=seed), lane=seed % 2)
    replayed = PrefixIndex(cache.index.geometry)
    seen = []
    for event in journal:
        replayed.apply(event)
        seen.append(replayed.gdsf_l)
    assert any(isinstance(e, GdsfInflated) for e in journal)
    assert seen == sorted(seen)


def test_a_superseded_snapshot_valued_by_itself_weighs_half():
    cache = gdsf_cache()
    history = tokens(256, seed=1)
    _, _, first = run_request(cache, history, lane=0)  # E1 at 256
    run_request(cache, history + tokens(64, seed=2), lane=1)  # resumes E1: E1 superseded, E2 at 320
    e1 = cache.index.snapshots[first.endpoint]
    assert e1.superseded and e1.hits == 1
    # By itself (as Boundaries and shared snapshots are valued): (1 + 1 hit) x its 256 tokens from the
    # root over its image alone (its blocks are E2's too), at the superseded weight.
    assert own_value(cache.index, e1, cache.cost) == pytest.approx(
        e1.base_l + h(2 * (0.256 - RESTORE) / IMAGE, SUPERSEDED_WEIGHT)
    )


def test_the_newest_snapshot_of_a_lineage_is_valued_against_the_nearest_shared_snapshot():
    cache = gdsf_cache()
    history = tokens(256, seed=1)
    _, _, first = run_request(cache, history, lane=0)  # E1 at 256
    _, _, second = run_request(cache, history + tokens(128, seed=2), lane=1)  # E2 at 384, below E1
    _, _, third = run_request(cache, history + tokens(192, seed=3), lane=0)  # E3 at 448, a second branch
    e1 = cache.index.snapshots[first.endpoint]
    assert len(e1.dependents) == 2
    # E1 is shared by two lineages now, so E3 (valued after the branch) is worth only its own 192 tokens.
    assert h_of(cache, third.endpoint) == pytest.approx(
        cache.index.snapshots[third.endpoint].base_l + h((0.192 - RESTORE) / (IMAGE + 3 * PAGE))
    )
    assert second.endpoint is not None


def test_superseded_snapshots_compete_by_value_instead_of_going_first():
    cache = gdsf_cache()
    index = cache.index
    history = tokens(256, seed=1)
    _, _, first = run_request(cache, history, lane=0)
    run_request(cache, history + tokens(128, seed=2), lane=1)
    run_request(cache, tokens(70, seed=9), lane=0)  # a short unrelated conversation: little to save
    superseded = index.snapshots[first.endpoint]
    assert superseded.superseded and not index.dead_nodes
    step = plan_host_room(index, index.host.num_slabs)
    assert step is not None
    victim = index.snapshots[step[-1].snapshot]
    host_snapshots = [s for s in index.snapshots.values() if s.host_slabs]
    assert victim.gdsf_h == min(s.gdsf_h for s in host_snapshots)
    assert not victim.superseded and superseded.gdsf_h > victim.gdsf_h
