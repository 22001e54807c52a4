"""Prefill passes and where ladder (FLEXIBLE) taps land on them."""

from hypothesis import given
from hypothesis import strategies as st

from hybridcache.cache.prefill_passes import flexible_landings, pass_end


def test_a_pass_ends_on_a_block_boundary_unless_it_ends_the_prompt():
    assert pass_end(0, 10_000, 2048, []) == 2048
    assert pass_end(100, 10_000, 512, []) == 576  # 612 cut back to the block boundary
    assert pass_end(100, 130, 512, []) == 130  # the prompt's end
    assert pass_end(100, 10_000, 20, []) == 120  # shorter than the way to the next boundary


def test_an_exact_tap_ends_a_pass():
    assert pass_end(0, 10_000, 2048, [1000, 1500]) == 1000
    assert pass_end(1000, 10_000, 2048, [1000, 1500]) == 1500


def test_landings_by_hand():
    # n = 15,422 on 2048-token passes: rungs at 11,326 and 7,230 land at the ends of their passes
    assert flexible_landings([11_326, 7_230], [], 0, 15_422, 2048) == [8192, 12_288]
    # on 512-token passes the same rungs would land elsewhere: why the engine lands them on a fixed length
    assert flexible_landings([11_326, 7_230], [], 0, 15_422, 512) == [7_680, 11_776]
    # a rung in the final pass lands at its start; one whose landing is the base is dropped
    assert flexible_landings([4_500], [], 0, 5_000, 2048) == [4096]
    assert flexible_landings([4_500], [], 4096, 5_000, 2048) == []
    # an exact tap cuts the pass that reaches the rung; rungs sharing a landing give one
    assert flexible_landings([2_500, 2_900], [3_000], 0, 10_000, 2048) == [3000]
    # passes start at the base: a resumed prompt's rungs land on its own passes (1,000 -> 3,008 -> 5,056)
    assert flexible_landings([5_000], [], 1_000, 10_000, 2048) == [5056]


def _per_pass(flexible, exact, base, n, chunk):
    """The rule as the worker applied it pass by pass before landings were computed up front."""
    landed, start = set(), base
    while start < n:
        end = pass_end(start, n, chunk, exact)
        for position in flexible:
            if start < position <= end:
                frontier = start if end == n else end
                if base < frontier < n:
                    landed.add(frontier)
        start = end
    return sorted(landed)


@given(
    st.integers(1, 20_000),
    st.integers(0, 20_000),
    st.lists(st.integers(0, 20_000), max_size=6),
    st.lists(st.integers(0, 20_000), max_size=3),
    st.sampled_from([64, 128, 512, 2048]),
)
def test_landings_match_the_pass_by_pass_rule(n, base, flexible, exact, chunk):
    base = min(base, n)
    exact = sorted(p for p in set(exact) if base < p < n)
    assert flexible_landings(flexible, exact, base, n, chunk) == _per_pass(flexible, exact, base, n, chunk)
