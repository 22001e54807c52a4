"""Host valuation (issue 7): GD* tempering, lineage-aware bases, superseded weight: stories, properties."""

from cache_factories import checked_cache, geometry, linear_cost, run_request, tokens
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridcache.cache.events import SnapshotDeleted, SnapshotHostDropped
from hybridcache.cache.host_eviction import (
    REFERENCE_DENSITY,
    TEMPERING_EXPONENT,
    plan_host_room,
    shared_ancestor,
    tempered_density,
    valuation_base,
)

densities = st.floats(min_value=1e-15, max_value=1e-3, allow_nan=False, allow_infinity=False)


def gdsf_cache(host_slabs: int = 200):
    return checked_cache(geometry(host_slabs=host_slabs, snapshot_slots=4), cost=linear_cost())


def first_host_victim(cache) -> int:
    """The snapshot the next host eviction names (there is no dead KV in these stories)."""
    index = cache.index
    step = plan_host_room(index, index.host.num_slabs)
    assert step, "something must be evictable"
    named = [e.snapshot for e in step if isinstance(e, SnapshotDeleted | SnapshotHostDropped)]
    assert len(named) == 1
    return named[0]


@settings(max_examples=60, deadline=None)
@given(densities, densities)
def test_tempering_keeps_the_order_of_densities_and_takes_the_square_root_of_their_ratio(a, b):
    low, high = sorted((a, b))
    assert tempered_density(low) <= tempered_density(high)
    ratio = tempered_density(high) / tempered_density(low)
    assert abs(ratio - (high / low) ** TEMPERING_EXPONENT) <= 1e-9 * ratio


def test_tempering_leaves_the_reference_density_alone_and_values_nothing_at_zero():
    assert abs(tempered_density(REFERENCE_DENSITY) - REFERENCE_DENSITY) <= 1e-12 * REFERENCE_DENSITY
    assert tempered_density(0.0) == 0.0
    assert tempered_density(-1.0) == 0.0


def test_a_conversations_newest_endpoint_outlives_its_middle_snapshots_under_pressure():
    cache = gdsf_cache()
    history = tokens(256, seed=1)
    _, _, first = run_request(cache, history, lane=0)  # E1 at 256
    _, _, second = run_request(cache, history + tokens(64, seed=2), lane=1)  # E2 at 320, E1 superseded
    index = cache.index
    e1, e2 = index.snapshots[first.endpoint], index.snapshots[second.endpoint]
    assert e1.superseded and not e2.dependents
    assert valuation_base(e2) == 0  # the newest of its lineage carries the whole conversation
    assert valuation_base(e1) == 0  # E1 is the lineage's first snapshot: its nearest one above is the root
    # E2's 64 own tokens alone would have made it the victim (the rule before issue 7); valued from the
    # root it outranks E1, the middle, whose loss costs only the rare retry between 256 and 320.
    assert first_host_victim(cache) == e1.id
    assert e2.gdsf_h > e1.gdsf_h


def test_a_branch_point_shared_by_two_lineages_bounds_the_value_of_each_newest_snapshot():
    cache = gdsf_cache()
    history = tokens(256, seed=1)
    _, _, first = run_request(cache, history, lane=0)  # E1 at 256
    _, _, left = run_request(cache, history + tokens(128, seed=2), lane=1)  # below E1
    _, _, right = run_request(cache, history + tokens(192, seed=3), lane=0)  # below E1 too: E1 is shared
    index = cache.index
    e1 = index.snapshots[first.endpoint]
    newest = index.snapshots[right.endpoint]
    assert shared_ancestor(newest) is e1
    assert valuation_base(newest) == e1.frontier
    assert valuation_base(index.snapshots[left.endpoint]) == e1.frontier
