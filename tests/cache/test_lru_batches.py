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


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_pin_chain_unlinks_exactly_the_path_whatever_order_the_lists_hold_it_in(data):
    size = data.draw(st.integers(1, 9), label="blocks")
    root = BlockNode(0, None, 0, (), 0)
    path: list[BlockNode] = []
    for block in range(size):
        path.append(BlockNode(block + 1, path[-1] if path else root, block, (), 0))
    others = [BlockNode(100 + i, root, 100 + i, (), 0) for i in range(4)]
    released = list(reversed(path))  # how a released path joins a list: deepest block first
    order = data.draw(
        st.one_of(
            st.permutations(path + others),
            st.just(released + others),
            st.just(others[:1] + path + others[1:]),  # how a landed write batch joins: in block order
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
    lru = DeviceLru()
    for entry, which in zip(order, lists):
        if which is not None and not (entry in path and path.index(entry) in pinned):
            lru.push_mru(entry, which)
    for node in (*path, *others):
        node.live_snapshots_below = 1  # nothing is dead
    for block in pinned:
        path[block].active_refs = 1
    expected = tuple(
        [e.id for e in lru.iter_lru_first(which) if e not in path]
        for which in (LruList.BACKED, LruList.UNBACKED)
    )
    off_lists = [node for node in reversed(path) if node.lru_list is LruList.NONE]
    unlisted: list[BlockNode] = []
    assert lru.pin_chain(path[-1], size, 7, {}, unlisted) == path
    assert unlisted == off_lists
    assert listed_ids(lru) == expected
    for which, ids in zip((LruList.BACKED, LruList.UNBACKED), expected):
        assert lru.count(which) == len(ids)
    for block, node in enumerate(path):
        assert node.lru_list is LruList.NONE and node.last_access_tick == 7
        assert node.active_refs == (2 if block in pinned else 1)


def test_a_node_released_onto_no_list_drops_the_links_a_cut_run_left_it():
    root = BlockNode(0, None, 0, (), 0)
    path: list[BlockNode] = []
    for block in range(4):
        path.append(BlockNode(block + 1, path[-1] if path else root, block, (), 0))
        path[-1].device_state = path[-1].host_state = Residency.RESIDENT
        path[-1].live_snapshots_below = 1
    lru = DeviceLru()
    lru.extend_mru(path[::-1], LruList.BACKED)  # a released path: one run for pin_chain to cut out
    lru.pin_chain(path[-1], 4, 1, {}, [])
    assert path[1].lru_prev is path[2]  # an inner link of the run, stale while the node is pinned
    path[1].restore_pins = 1  # a write batch holds it
    path[2].device_state = Residency.ABSENT  # (not in a real index: a pinned node keeps its copy)
    lru.unpin_path(path, {})
    assert listed_ids(lru) == ([4, 1], [])
    for node in path[1:3]:
        assert node.lru_list is LruList.NONE and node.lru_prev is None and node.lru_next is None
