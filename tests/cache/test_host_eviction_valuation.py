"""Host valuation (issue 7): GD* tempering and the bases of snapshots valued by themselves."""

from cache_factories import checked_cache, geometry, linear_cost, run_request, tokens
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridcache.cache.host_eviction import (
    REFERENCE_DENSITY,
    TEMPERING_EXPONENT,
    shared_ancestor,
    tempered_density,
    valuation_base,
)

densities = st.floats(min_value=1e-15, max_value=1e-3, allow_nan=False, allow_infinity=False)


def gdsf_cache(host_slabs: int = 200):
    return checked_cache(geometry(host_slabs=host_slabs, snapshot_slots=4), cost=linear_cost())


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
