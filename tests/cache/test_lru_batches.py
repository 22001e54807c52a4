"""Device LRU batch forms (§9.1): ``extend_mru`` and ``remove_all`` leave the lists exactly as the
single-entry ``push_mru`` / ``remove`` calls they stand for, in the same order, with the same counts; so
does ``pin_chain``, which cuts runs of consecutive entries out at once, whatever order the path is in."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridcache.cache.lru import DeviceLru
from hybridcache.cache.records import BlockNode, LruLinks, LruList, Residency


class Entry(LruLinks):
    __slots__ = ("id",)

    def __init__(self, entry_id: int) -> None:
        super().__init__()
        self.id = entry_id


def listed_ids(lru: DeviceLru) -> tuple[list[int], list[int]]:
    return tuple(  # type: ignore[return-value]
        [entry.id for entry in lru.iter_lru_first(which)] for which in (LruList.BACKED, LruList.UNBACKED)
    )


def assert_same_lists(batched: DeviceLru, single: DeviceLru) -> None:
    assert listed_ids(batched) == listed_ids(single)
    for which in (LruList.BACKED, LruList.UNBACKED):
        assert batched.count(which) == single.count(which) == len(list(batched.iter_lru_first(which)))


# One step: ("push", list, ids) appends the unlisted ones among ids; ("remove", ids) unlinks them.
_ids = st.lists(st.integers(0, 15))
_steps = st.lists(
    st.one_of(
        st.tuples(st.just("push"), st.sampled_from([LruList.BACKED, LruList.UNBACKED]), _ids),
        st.tuples(st.just("remove"), _ids),
    ),
    max_size=25,
)


@settings(max_examples=60, deadline=None)
@given(steps=_steps)
def test_batches_match_single_entry_calls_step_for_step(steps):
    batched, single = DeviceLru(), DeviceLru()
    batched_entries = [Entry(i) for i in range(16)]
    single_entries = [Entry(i) for i in range(16)]
    for step in steps:
        if step[0] == "push":
            _, which, ids = step
            wanted = list(dict.fromkeys(i for i in ids if batched_entries[i].lru_list is LruList.NONE))
            batched.extend_mru([batched_entries[i] for i in wanted], which)
            for i in wanted:
                single.push_mru(single_entries[i], which)
        else:
            _, ids = step
            batched.remove_all([batched_entries[i] for i in dict.fromkeys(ids)])
            for i in dict.fromkeys(ids):
                single.remove(single_entries[i])
        assert_same_lists(batched, single)
    assert [e.lru_list for e in batched_entries] == [e.lru_list for e in single_entries]


def test_an_empty_batch_changes_nothing():
    lru = DeviceLru()
    first = Entry(1)
    lru.push_mru(first, LruList.BACKED)
    lru.extend_mru([], LruList.UNBACKED)
    lru.remove_all([])
    assert listed_ids(lru) == ([1], []) and len(lru) == 1


def test_removed_entries_are_unlinked_and_can_join_again():
    lru = DeviceLru()
    entries = [Entry(i) for i in range(4)]
    lru.extend_mru(entries, LruList.UNBACKED)
    lru.remove_all(entries[1:3])
    assert listed_ids(lru) == ([], [0, 3])
    assert all(e.lru_prev is None and e.lru_next is None for e in entries[1:3])
    lru.extend_mru(entries[2:0:-1], LruList.BACKED)
    assert listed_ids(lru) == ([2, 1], [0, 3]) and len(lru) == 4


def test_extending_a_list_that_is_not_a_device_list_raises():
    with pytest.raises(ValueError, match="not a device LRU list"):
        DeviceLru().extend_mru([Entry(1)], LruList.NONE)


def _chain_on_lists(size: int, order: list[int], lists: list, pinned: set[int]):
    """Blocks 0..size-1 of a chain (ids 1..size) and four other nodes (ids 100..103), put on the lists
    in ``order`` (indices into chain + others) with the copies each list implies: host-backed entries
    have both, unbacked ones a device copy, unlisted ones a host copy. ``pinned`` blocks are held by
    another lane already (both copies, on no list)."""
    root = BlockNode(0, None, 0, (), 0)
    path: list[BlockNode] = []
    for block in range(size):
        path.append(BlockNode(block + 1, path[-1] if path else root, block, (), 0))
    others = [BlockNode(100 + i, root, 100 + i, (), 0) for i in range(4)]
    entries = path + others
    lru = DeviceLru()
    for index, which in zip(order, lists):
        entry = entries[index]
        entry.live_snapshots_below = 1  # nothing is dead
        if index < size and index in pinned:
            entry.active_refs = 1
            which = LruList.BACKED if which is None else which  # copies as if listed
        else:
            if which is not None:
                lru.push_mru(entry, which)
        entry.device_state = Residency.ABSENT if which is None else Residency.RESIDENT
        entry.host_state = Residency.ABSENT if which is LruList.UNBACKED else Residency.RESIDENT
    return lru, path, others


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_pin_chain_unlinks_exactly_the_path_and_unpin_path_puts_it_back_whatever_the_list_order(data):
    size = data.draw(st.integers(1, 9), label="blocks")
    chain, others = list(range(size)), list(range(size, size + 4))
    released = chain[::-1]  # how a released path joins a list: deepest block first
    order = data.draw(
        st.one_of(
            st.permutations(chain + others),
            st.just(released + others),
            st.just(others[:1] + chain + others[1:]),  # how a landed write batch joins: in block order
            st.just(others[:2] + released + others[2:]),
        ),
        label="order",
    )
    lists = data.draw(
        st.lists(
            st.sampled_from([None, LruList.BACKED, LruList.UNBACKED]),
            min_size=len(order),
            max_size=len(order),
        ),
        label="lists",
    )
    pinned = data.draw(st.sets(st.integers(0, size - 1)), label="pinned blocks")
    still_held = data.draw(st.sets(st.integers(0, size - 1)), label="blocks another lane holds at release")
    lru, path, _ = _chain_on_lists(size, order, lists, pinned)
    expected = tuple(
        [e.id for e in lru.iter_lru_first(which) if e not in path]
        for which in (LruList.BACKED, LruList.UNBACKED)
    )
    off_lists = [node for node in reversed(path) if node.lru_list is LruList.NONE]
    was_backed = {node.id for node in path if node.lru_list is LruList.BACKED}
    unlisted: list[BlockNode] = []
    spans: list[tuple[int, int]] = []
    assert lru.pin_chain(path[-1], size, 7, {}, unlisted, spans) == path
    assert unlisted == off_lists
    assert listed_ids(lru) == expected
    for which, ids in zip((LruList.BACKED, LruList.UNBACKED), expected):
        assert lru.count(which) == len(ids)
    for block, node in enumerate(path):
        assert node.lru_list is LruList.NONE and node.last_access_tick == 7
        assert node.active_refs == (2 if block in pinned else 1)
    spanned = [block for first, last in spans for block in range(last, first - 1, -1)]
    assert spanned == sorted(spanned, reverse=True)  # deepest first, no overlap
    assert {path[block].id for block in spanned} == was_backed
    # Releasing with the spans leaves what releasing with a residency test on every node leaves.
    twin, twin_path, _ = _chain_on_lists(size, order, lists, pinned)
    twin.pin_chain(twin_path[-1], size, 7, {}, [], [])
    for block in still_held:
        path[block].active_refs += 1
        twin_path[block].active_refs += 1
    lru.unpin_path(path, {}, spans)
    twin.unpin_path(twin_path, {})
    assert listed_ids(lru) == listed_ids(twin)
    for which in (LruList.BACKED, LruList.UNBACKED):
        assert lru.count(which) == twin.count(which) == len(list(lru.iter_lru_first(which)))
    assert [(n.active_refs, n.lru_list) for n in path] == [(n.active_refs, n.lru_list) for n in twin_path]


def test_a_node_released_onto_no_list_drops_the_links_a_cut_run_left_it():
    root = BlockNode(0, None, 0, (), 0)
    path: list[BlockNode] = []
    for block in range(4):
        path.append(BlockNode(block + 1, path[-1] if path else root, block, (), 0))
        path[-1].device_state = path[-1].host_state = Residency.RESIDENT
        path[-1].live_snapshots_below = 1
    lru = DeviceLru()
    lru.extend_mru(path[::-1], LruList.BACKED)  # a released path: one run for pin_chain to cut out
    lru.pin_chain(path[-1], 4, 1, {}, [], [])
    assert path[1].lru_prev is path[2]  # an inner link of the run, stale while the node is pinned
    path[1].restore_pins = 1  # a write batch holds it
    path[2].device_state = Residency.ABSENT  # (not in a real index: a pinned node keeps its copy)
    lru.unpin_path(path, {})
    assert listed_ids(lru) == ([4, 1], [])
    for node in path[1:3]:
        assert node.lru_list is LruList.NONE and node.lru_prev is None and node.lru_next is None
