"""The fast paths of apply() decide exactly what the slow ones did: path checks, restores, packing on
first match, the derived cache epoch, list membership by identity, and the one-walk publication."""

import msgspec
import pytest
from cache_factories import checked_cache, flush_and_land, geometry, match_depth, prompt, run_request, tokens

from hybridcache.cache import events as ev
from hybridcache.cache.errors import EventRejected
from hybridcache.cache.ids import BLOCK_TOKENS
from hybridcache.cache.index import PrefixIndex
from hybridcache.cache.integrity import check_integrity
from hybridcache.cache.lru import DeviceLru
from hybridcache.cache.records import LIVE_BELOW_CAP, BlockNode, LruList, pack_tokens


def _cache_with_a_five_block_chain():
    cache = checked_cache()
    run_request(cache, tokens(300), generated=tokens(30, 1))  # 330 tokens: nodes 1..5, one chain
    assert flush_and_land(cache) == 5  # every block host-backed too
    chain = cache.index.path_to(max(cache.index.nodes.values(), key=lambda n: n.depth))
    assert [n.id for n in chain] == [1, 2, 3, 4, 5]
    return cache


def _assert_rejected(index: PrefixIndex, event, fragment: str) -> None:
    before = index.digest()
    with pytest.raises(EventRejected, match=fragment):
        index.apply(msgspec.structs.replace(event, seq=index.seq + 1))
    assert index.digest() == before, "a rejected event changed the index"
    check_integrity(index)


@pytest.mark.parametrize(
    "blocks, path_end, complaint",
    [
        (2, 3, "node 3 ends 3"),
        (4, 3, "node 3 ends 3"),
        (2, 99, "path end 99 is not a block of the tree"),
        (2, 0, "path end 0 is not a block of the tree"),
        (2, None, "needs 2 path blocks, the path is empty"),
        (0, 1, "needs 0 path blocks, node 1 ends 1"),
    ],
    ids=["too deep", "too shallow", "names a missing node", "names the root", "missing", "given for no path"],
)
def test_a_staged_path_end_that_is_missing_or_ends_another_length_is_rejected(blocks, path_end, complaint):
    cache = _cache_with_a_five_block_chain()
    index = cache.index
    slot = index.slots.peek_free()
    snap = next(iter(index.snapshots.values()))  # any snapshot: the path is checked before it
    staged = ev.LaneStaged(0, 1, True, slot, BLOCK_TOKENS * blocks, path_end, (), snap.id)
    _assert_rejected(index, staged, complaint)


def test_a_staged_lane_pins_exactly_the_chain_above_its_path_end():
    cache = _cache_with_a_five_block_chain()
    index = cache.index
    anchored = max(index.snapshots.values(), key=lambda s: s.frontier)
    blocks = anchored.frontier // BLOCK_TOKENS
    slot = index.slots.peek_free()
    end = anchored.anchor.id
    staged = ev.LaneStaged(index.seq + 1, 1, True, slot, anchored.frontier, end, (), anchored.id)
    index.apply(staged)
    check_integrity(index)
    pinned = [n.id for n in index.nodes.values() if n.active_refs]
    assert index.lanes[1].path == index.path_to(anchored.anchor)
    assert sorted(pinned) == list(range(1, blocks + 1))
    assert all(index.nodes[i].lru_list is LruList.NONE for i in pinned)


def test_activation_names_the_first_path_node_still_without_a_device_page():
    cache = _cache_with_a_five_block_chain()
    index = cache.index
    index.apply(ev.DeviceCopiesDropped(index.seq + 1, (2, 4), ()))  # host-backed copies: host-only now
    anchored = max(index.snapshots.values(), key=lambda s: s.frontier)
    assert anchored.anchor.id == 5
    slot = index.slots.peek_free()
    index.apply(ev.LaneStaged(index.seq + 1, 1, True, slot, anchored.frontier, 5, (), anchored.id))
    _assert_rejected(index, ev.LaneActivated(0, 1), "path node 2 has no device page")
    pages = index.pages.free_order()[:2]
    index.apply(ev.RestoreOpened(index.seq + 1, 60, 1, (2,), (pages[0],)))
    _assert_rejected(index, ev.LaneActivated(0, 1), "path node 4 has no device page")
    index.apply(ev.RestoreOpened(index.seq + 1, 61, 1, (4,), (pages[1],)))
    index.apply(ev.LaneActivated(index.seq + 1, 1))  # restores in flight are enough: pages are mapped
    check_integrity(index)
    assert index.lanes[1].activated


def test_a_restore_that_names_a_node_twice_is_rejected():
    cache = _cache_with_a_five_block_chain()
    _assert_rejected(cache.index, ev.RestoreOpened(0, 60, None, (1, 1), (40, 41)), "named twice")


def test_inserted_nodes_pack_their_tokens_only_when_a_match_first_reaches_them():
    cache = checked_cache()
    toks = tokens(4 * BLOCK_TOKENS + 10)
    run_request(cache, toks)
    blocks = [n for n in cache.index.nodes.values() if n.parent is not None]
    assert blocks and all(n.token_bytes is None for n in blocks), "apply packed tokens"
    assert match_depth(cache, toks) == 4
    for node in blocks[:4]:
        assert node.token_bytes == pack_tokens(node.tokens)
        assert node.packed_tokens() is node.token_bytes  # kept, not packed again


def test_a_node_packed_by_a_first_match_still_refuses_a_prompt_that_differs_in_one_token():
    cache = checked_cache()
    toks = tokens(3 * BLOCK_TOKENS + 1)
    run_request(cache, toks)
    changed = list(toks)
    changed[BLOCK_TOKENS + 5] += 1  # block 1 differs: a prompt reaching the tree for the first time
    assert match_depth(cache, changed) == 1
    assert match_depth(cache, toks) == 3


def test_a_checkpoint_leaves_the_cache_epoch_alone_and_every_other_event_bumps_it():
    cache = _cache_with_a_five_block_chain()
    index = cache.index
    epoch, seq = index.cache_epoch, index.seq
    cache.checkpoint()
    assert (index.seq, index.cache_epoch) == (seq + 1, epoch)
    quoted = cache.quote(prompt(tokens(300)))
    cache.stage(quoted, 1)
    assert index.cache_epoch - epoch == index.seq - seq - 1


def test_a_rejected_checkpoint_counts_nothing():
    cache = _cache_with_a_five_block_chain()
    index = cache.index
    epoch = index.cache_epoch
    _assert_rejected(index, ev.Checkpoint(0, index.digest() ^ 1), "digest differs")
    assert index.cache_epoch == epoch and index.checkpoints == 0


def test_the_lru_stores_a_list_member_even_when_given_its_int_and_refuses_a_non_list():
    lru = DeviceLru()
    node = BlockNode(7, None, 0, (), 0)  # type: ignore[arg-type]
    lru.push_mru(node, 1)  # type: ignore[arg-type]  # LruList.BACKED's value
    assert node.lru_list is LruList.BACKED and lru.count(LruList.BACKED) == 1
    other = BlockNode(8, None, 0, (), 0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="not a device LRU list"):
        lru.push_mru(other, LruList.NONE)
    assert other.lru_list is LruList.NONE and len(lru) == 1


def _snapshot_at(cache, frontier: int):
    return next(s for s in cache.index.snapshots.values() if s.frontier == frontier)


def test_a_snapshot_published_between_two_others_takes_over_the_deeper_one_as_its_dependent():
    cache = checked_cache(geometry(snapshot_slots=6))  # integrity (ancestry, liveness) after every event
    toks = tokens(12 * BLOCK_TOKENS + 20)
    run_request(cache, toks[: 10 * BLOCK_TOKENS + 5], taps=[2 * BLOCK_TOKENS, 8 * BLOCK_TOKENS])
    shallow, deep = _snapshot_at(cache, 2 * BLOCK_TOKENS), _snapshot_at(cache, 8 * BLOCK_TOKENS)
    assert deep.ancestor is shallow
    shorter = toks[: 5 * BLOCK_TOKENS + 10]  # resumes from ``shallow``; its endpoint lands above ``deep``
    _, staged, _ = run_request(cache, shorter, lane=1)
    assert staged.snapshot == shallow.id
    middle = _snapshot_at(cache, len(shorter))
    assert middle.ancestor is shallow and deep.ancestor is middle
    assert deep.id in middle.dependents and deep.id not in shallow.dependents
    index = cache.index
    # One chain: a node's count is its own snapshots plus its child's count capped at LIVE_BELOW_CAP.
    assert len(index.snapshots) == 4 and index.root.live_snapshots_below == LIVE_BELOW_CAP
    assert middle.anchor.live_snapshots_below == sum(
        1 for s in index.snapshots.values() if s.anchor.depth >= middle.anchor.depth
    )
    assert shallow.anchor.live_snapshots_below == 1 + LIVE_BELOW_CAP
