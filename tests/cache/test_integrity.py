"""check_integrity names the first derived value that disagrees with a rebuild."""

import pytest
from cache_factories import checked_cache, run_request, tokens

from hybridcache.cache.errors import IntegrityError
from hybridcache.cache.integrity import check_integrity
from hybridcache.cache.records import LruList, PageOwnerKind, SlotRole


@pytest.fixture
def cache():
    cache = checked_cache()
    run_request(cache, tokens(300), generated=tokens(20, 1), taps=[128])
    check_integrity(cache.index)
    return cache


def _some_node(cache):
    return next(n for n in cache.index.nodes.values() if n.parent is not None)


def test_a_wrong_active_ref_count_is_named(cache):
    _some_node(cache).active_refs += 1
    with pytest.raises(IntegrityError, match="active_refs"):
        check_integrity(cache.index)


def test_a_wrong_live_snapshot_count_is_named(cache):
    _some_node(cache).live_snapshots_below += 1
    with pytest.raises(IntegrityError, match="live_snapshots_below"):
        check_integrity(cache.index)


def test_an_entry_missing_from_the_lru_is_named(cache):
    node = next(n for n in cache.index.nodes.values() if n.lru_list != LruList.NONE)
    cache.index.lru.remove(node)
    with pytest.raises(IntegrityError, match=f"node {node.id}: on LRU NONE"):
        check_integrity(cache.index)


def test_a_page_with_two_owners_is_named(cache):
    node = _some_node(cache)
    snapshot = next(iter(cache.index.snapshots.values()))
    snapshot.tail_device_page = node.device_page
    with pytest.raises(IntegrityError, match="owned by both"):
        check_integrity(cache.index)


def test_a_ledger_owner_that_disagrees_is_named(cache):
    node = _some_node(cache)
    cache.index.pages.owners[node.device_page] = (PageOwnerKind.LANE, 3)
    with pytest.raises(IntegrityError, match=f"page {node.device_page}: ledger owner"):
        check_integrity(cache.index)


def test_a_wrong_slot_role_is_named(cache):
    snapshot = next(iter(cache.index.snapshots.values()))
    cache.index.slots.roles[snapshot.device_slot] = SlotRole.FREE
    with pytest.raises(IntegrityError, match=f"slot {snapshot.device_slot}"):
        check_integrity(cache.index)


def test_a_broken_ancestor_link_is_named(cache):
    deeper = max(cache.index.snapshots.values(), key=lambda s: s.frontier)
    deeper.ancestor = None
    with pytest.raises(IntegrityError, match="ancestor"):
        check_integrity(cache.index)


def test_a_lost_slab_owner_is_named(cache):
    cache.index.slab_owners.popitem()
    with pytest.raises(IntegrityError, match="slab owners"):
        check_integrity(cache.index)


def test_stale_list_links_on_an_unpinned_unlisted_node_are_named(cache):
    root = cache.index.root  # on no list by definition, never pinned
    root.lru_next = _some_node(cache)
    with pytest.raises(IntegrityError, match="keeps list links"):
        check_integrity(cache.index)
