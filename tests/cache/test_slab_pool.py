"""HostSlabPool (spec §5.4, §13.1): exhaustion, reuse, chunked allocation, no slab across chunks."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridcache.cache.ids import SlabId
from hybridcache.cache.slab_pool import HostSlabPool, SlabLocation, slab_bytes_for

KIB = 1024
MIB = 1024 * KIB


def pool_of(num_slabs: int, slab_bytes: int = 4 * KIB, slabs_per_chunk: int | None = None) -> HostSlabPool:
    """A pool of exactly `num_slabs` slabs; chunks hold `slabs_per_chunk` (default: all in one chunk)."""
    per_chunk = slabs_per_chunk or max(num_slabs, 1)
    return HostSlabPool(slab_bytes, num_slabs * slab_bytes, chunk_bytes=per_chunk * slab_bytes)


def allocate(pool: HostSlabPool, count: int) -> list[SlabId]:
    """Take `count` slabs the way the index does: peek, then take exactly those."""
    slabs = pool.peek_free(count)
    assert slabs is not None, f"pool exhausted: wanted {count}, {pool.num_free} free"
    pool.take(slabs)
    return slabs


def assert_accounting(pool: HostSlabPool, used: set[int]) -> None:
    """The pool's view of free/used agrees with `used`, slab by slab and in the counters."""
    assert pool.num_free == pool.num_slabs - len(used)
    assert pool.num_used == len(used)
    for slab in range(pool.num_slabs):
        assert pool.is_free(SlabId(slab)) == (slab not in used)
    assert sorted(pool.free_slabs()) == sorted(set(range(pool.num_slabs)) - used)


def test_a_fresh_pool_hands_out_low_ids_first_so_chunks_fill_in_order():
    pool = pool_of(10, slabs_per_chunk=4)
    assert pool.peek_free(3) == [0, 1, 2]
    first = allocate(pool, 5)
    assert first == [0, 1, 2, 3, 4]
    assert {pool.location(slab).chunk for slab in first} == {0, 1}


def test_peek_is_pure_and_deterministic():
    pool = pool_of(8)
    allocate(pool, 2)
    assert pool.peek_free(3) == pool.peek_free(3)
    assert pool.num_free == 6


def test_exhaustion_is_reported_by_peek_not_raised():
    pool = pool_of(4)
    allocate(pool, 3)
    assert pool.peek_free(2) is None
    assert pool.peek_free(1) == [3]
    allocate(pool, 1)
    assert pool.peek_free(1) is None
    assert pool.peek_free(0) == []


def test_released_slabs_are_reused_last_released_first():
    pool = pool_of(6)
    allocate(pool, 4)
    pool.release([SlabId(1), SlabId(3)])
    assert pool.peek_free(3) == [3, 1, 4]
    assert_accounting(pool, {0, 2})


def test_a_zero_budget_pool_has_no_slabs_and_no_chunks():
    pool = HostSlabPool(4 * KIB, 0)
    assert (pool.num_slabs, pool.num_free, pool.num_chunks) == (0, 0, 0)
    assert pool.peek_free(1) is None


def test_chunks_hold_whole_slabs_only_and_a_slab_never_crosses_a_chunk():
    slab = 3 * MIB + 4 * KIB
    pool = HostSlabPool(slab, 100 * MIB, chunk_bytes=10 * MIB)
    assert pool.slabs_per_chunk == 3  # 10 MiB holds three 3.004 MiB slabs, the rest is unused
    assert pool.num_slabs == (100 * MIB) // slab
    assert pool.num_chunks == -(-pool.num_slabs // 3)
    for index in range(pool.num_slabs):
        chunk, offset = pool.location(SlabId(index))
        assert offset + slab <= pool.chunk_size_bytes(chunk)
        assert offset % slab == 0


def test_the_last_chunk_may_be_short():
    pool = pool_of(10, slabs_per_chunk=4)
    assert pool.num_chunks == 3
    assert [pool.chunk_slab_count(c) for c in range(3)] == [4, 4, 2]
    assert pool.location(SlabId(9)) == SlabLocation(chunk=2, offset=4 * KIB)
    with pytest.raises(ValueError):
        pool.chunk_slab_count(3)


def test_default_chunks_are_4_gib():
    pool = HostSlabPool(2 * MIB, 10 << 30)
    assert pool.slabs_per_chunk == 2048
    assert pool.num_chunks == 3


def test_images_take_ceil_of_their_bytes_in_slabs():
    pool = pool_of(4, slab_bytes=4 * MIB)
    assert pool.image_slab_count(0) == 0
    assert pool.image_slab_count(1) == 1
    assert pool.image_slab_count(4 * MIB) == 1
    assert pool.image_slab_count(4 * MIB + 1) == 2
    assert pool.image_slab_count(195_897_344) == 47  # the 27B DFlash2 image over 4 MiB BF16 bundles
    with pytest.raises(ValueError):
        pool.image_slab_count(-1)


def test_taking_a_used_slab_fails_and_changes_nothing():
    pool = pool_of(5)
    allocate(pool, 2)
    with pytest.raises(ValueError, match="not free"):
        pool.take([SlabId(4), SlabId(1)])
    assert_accounting(pool, {0, 1})


def test_repeated_or_foreign_ids_fail_and_change_nothing():
    pool = pool_of(5)
    with pytest.raises(ValueError, match="repeated"):
        pool.take([SlabId(2), SlabId(2)])
    with pytest.raises(ValueError, match="outside"):
        pool.take([SlabId(0), SlabId(5)])
    with pytest.raises(ValueError, match="outside"):
        pool.is_free(SlabId(-1))
    assert_accounting(pool, set())


def test_a_double_free_fails_and_changes_nothing():
    pool = pool_of(5)
    allocate(pool, 3)
    pool.release([SlabId(1)])
    with pytest.raises(ValueError, match="double free"):
        pool.release([SlabId(0), SlabId(1)])
    assert_accounting(pool, {0, 2})


def test_taking_arbitrary_free_ids_works_in_any_order():
    pool = pool_of(6)
    pool.take([SlabId(4), SlabId(0), SlabId(5)])
    assert_accounting(pool, {0, 4, 5})
    assert sorted(allocate(pool, 3)) == [1, 2, 3]
    assert pool.peek_free(1) is None


def test_invalid_geometry_is_rejected():
    with pytest.raises(ValueError):
        HostSlabPool(0, 1 << 20)
    with pytest.raises(ValueError):
        HostSlabPool(4 * KIB, -1)
    with pytest.raises(ValueError, match="chunk"):
        HostSlabPool(8 * KIB, 1 << 20, chunk_bytes=4 * KIB)


def test_slab_bytes_packs_planes_and_rounds_up_to_4_kib():
    assert slab_bytes_for([4096]) == 4096
    assert slab_bytes_for([1000, 1000]) == 4096
    assert slab_bytes_for([2 * MIB, 2 * MIB, 1]) == 4 * MIB + 4 * KIB
    with pytest.raises(ValueError):
        slab_bytes_for([])
    with pytest.raises(ValueError):
        slab_bytes_for([4096, -1])


operations = st.lists(
    st.tuples(st.sampled_from(["alloc", "release", "take_any"]), st.integers(min_value=0, max_value=6)),
    max_size=60,
)


@settings(max_examples=80, deadline=None)
@given(num_slabs=st.integers(min_value=0, max_value=20), ops=operations, data=st.data())
def test_free_stack_matches_a_set_model_under_random_operations(num_slabs, ops, data):
    pool = pool_of(num_slabs, slabs_per_chunk=3)
    used: set[int] = set()
    for op, count in ops:
        free = sorted(set(range(num_slabs)) - used)
        if op == "alloc":
            peeked = pool.peek_free(count)
            if count > len(free):
                assert peeked is None
                continue
            assert peeked is not None and len(set(peeked)) == count
            assert set(peeked) <= set(free)
            pool.take(peeked)
            used |= set(peeked)
        elif op == "take_any" and free:
            chosen = data.draw(st.lists(st.sampled_from(free), unique=True, max_size=count))
            pool.take([SlabId(s) for s in chosen])
            used |= set(chosen)
        elif op == "release" and used:
            chosen = data.draw(st.lists(st.sampled_from(sorted(used)), unique=True, max_size=count))
            pool.release([SlabId(s) for s in chosen])
            used -= set(chosen)
            if chosen:
                assert pool.peek_free(1) == [chosen[-1]]
        assert_accounting(pool, used)
