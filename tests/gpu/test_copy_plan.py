"""Transfer planning (spec §5.4, §11.2): coalesced runs, explicit splits, images spread over slabs."""

from hypothesis import given, settings
from hypothesis import strategies as st

from hybridcache.cache.ids import PageId, SlabId
from hybridcache.cache.slab_pool import SlabLocation
from hybridcache.gpu.copy_plan import ImageSegment, PageRun, plan_image_segments, plan_page_runs

SLAB = 4096


def chunked(slabs_per_chunk: int):
    """A slab locator for chunks of `slabs_per_chunk` slabs of SLAB bytes."""

    def locate(slab: SlabId) -> SlabLocation:
        chunk, index = divmod(slab, slabs_per_chunk)
        return SlabLocation(chunk, index * SLAB)

    return locate


def pairs(*items: tuple[int, int]) -> list[tuple[PageId, SlabId]]:
    return [(PageId(page), SlabId(slab)) for page, slab in items]


def test_consecutive_pages_and_slabs_form_one_run():
    runs = plan_page_runs(pairs((5, 10), (6, 11), (7, 12)), chunked(100))
    assert runs == [PageRun(PageId(5), 0, 10 * SLAB, SLAB, 3)]


def test_a_constant_larger_pitch_still_coalesces():
    runs = plan_page_runs(pairs((0, 0), (1, 2), (2, 4)), chunked(100))
    assert runs == [PageRun(PageId(0), 0, 0, 2 * SLAB, 3)]


def test_runs_split_at_chunk_boundaries():
    runs = plan_page_runs(pairs((0, 2), (1, 3), (2, 4), (3, 5)), chunked(4))
    assert [(run.first_page, run.chunk, run.count) for run in runs] == [(0, 0, 2), (2, 1, 2)]


def test_runs_split_at_the_pitch_limit():
    far = 1000  # slabs 0 and 1000 are 1000 * SLAB apart, beyond the limit below
    runs = plan_page_runs(pairs((0, 0), (1, far), (2, far + 1)), chunked(10_000), max_pitch=100 * SLAB)
    assert [(run.first_page, run.count) for run in runs] == [(0, 1), (1, 2)]


def test_gaps_reversals_and_pitch_changes_split():
    runs = plan_page_runs(pairs((0, 5), (1, 4), (3, 6), (4, 7), (5, 9)), chunked(100))
    assert [(run.first_page, run.count) for run in runs] == [(0, 1), (1, 1), (3, 2), (5, 1)]


def test_single_page_runs_have_no_pitch():
    assert plan_page_runs(pairs((9, 3)), chunked(100)) == [PageRun(PageId(9), 0, 3 * SLAB, 0, 1)]


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.tuples(st.integers(0, 200), st.integers(0, 300)), unique_by=(lambda p: p[0], lambda p: p[1])),
    st.integers(1, 64),
)
def test_runs_cover_every_pair_exactly_once_and_stay_in_one_chunk(raw, slabs_per_chunk):
    locate = chunked(slabs_per_chunk)
    requested = pairs(*raw)
    covered = []
    for run in plan_page_runs(requested, locate):
        assert run.count >= 1 and (run.count == 1) == (run.host_pitch == 0)
        for i in range(run.count):
            covered.append((run.first_page + i, run.chunk, run.host_offset + i * run.host_pitch))
    expected = sorted((page, *locate(slab)) for page, slab in requested)
    assert sorted(covered) == expected


def test_image_parts_spread_over_slabs_in_packed_order():
    segments = plan_image_segments([3000, 3000, 100], [SlabId(7), SlabId(2)], SLAB)
    assert segments == [
        ImageSegment(0, 0, SlabId(7), 0, 3000),
        ImageSegment(1, 0, SlabId(7), 3000, 1096),
        ImageSegment(1, 1096, SlabId(2), 0, 1904),
        ImageSegment(2, 0, SlabId(2), 1904, 100),
    ]


def test_an_image_larger_than_its_slabs_is_refused():
    try:
        plan_image_segments([SLAB + 1], [SlabId(0)], SLAB)
    except ValueError as error:
        assert "cannot hold" in str(error)
    else:
        raise AssertionError("expected ValueError")
