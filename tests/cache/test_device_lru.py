"""Device LRU (§9.1, §13.1): tail-first release, hits to MRU, backed before unbacked, pins respected."""

from cache_factories import checked_cache, geometry, insert_path, prompt, tokens

from hybridcache.cache.device_eviction import plan_device_eviction
from hybridcache.cache.events import DeviceCopiesDropped, SubtreeDeleted
from hybridcache.cache.records import LruList
from hybridcache.cache.write_back import HostWrite


def lru_depths(cache, which: LruList) -> list[int]:
    return [entry.depth for entry in cache.index.lru.iter_lru_first(which)]


def lru_ids(cache, which: LruList) -> list[int]:
    return [entry.id for entry in cache.index.lru.iter_lru_first(which)]


def test_released_blocks_join_the_lru_tail_first():
    cache = checked_cache(geometry(host_slabs=0))
    insert_path(cache, tokens(5 * 64))
    assert lru_depths(cache, LruList.UNBACKED) == [4, 3, 2, 1, 0]  # the deepest block is evicted first


def test_a_hit_moves_the_whole_path_to_the_mru_end():
    cache = checked_cache(geometry(host_slabs=0))
    first, second = tokens(3 * 64, seed=1), tokens(3 * 64, seed=2)
    insert_path(cache, first, lane=0)
    insert_path(cache, second, lane=1)
    first_nodes = lru_ids(cache, LruList.UNBACKED)[:3]
    insert_path(cache, first, lane=0)  # the same blocks again: every one is a Duplicate hit
    assert lru_ids(cache, LruList.UNBACKED)[-3:] == first_nodes


def test_host_backed_entries_are_consumed_before_unbacked_ones():
    cache = checked_cache(geometry(num_pages=16), host_write=HostWrite.THROUGH)
    backed_tokens, unbacked_tokens = tokens(4 * 64, seed=1), tokens(4 * 64, seed=2)
    insert_path(cache, backed_tokens, lane=0)  # written through and landed
    insert_path(cache, unbacked_tokens, lane=1, write=False)  # as if the host were full
    backed = set(lru_ids(cache, LruList.BACKED))
    assert len(backed) == 4 and len(lru_ids(cache, LruList.UNBACKED)) == 4
    events = plan_device_eviction(cache.index, cache.index.num_free_pages + 4)
    assert events == [DeviceCopiesDropped(0, tuple(lru_ids(cache, LruList.BACKED)), ())]
    for event in events:
        cache._apply(event)
    assert cache.index.lru.count(LruList.BACKED) == 0
    assert all(cache.index.nodes[n].host_slab is not None for n in backed)  # kept their host copy
    next_events = plan_device_eviction(cache.index, cache.index.num_free_pages + 1)
    assert next_events == [SubtreeDeleted(0, lru_ids(cache, LruList.UNBACKED)[0])]


def test_pinned_entries_are_never_returned():
    cache = checked_cache(geometry(num_pages=24, host_slabs=0))
    shared = tokens(4 * 64, seed=3)
    insert_path(cache, shared, lane=0)
    insert_path(cache, tokens(4 * 64, seed=4), lane=1)
    # A lane resumes over the shared blocks: they are pinned while it runs.
    holder = cache.stage(cache.quote(prompt([*shared, 1])), 2)
    cache.activate(2)
    cache.commit_blocks(2, shared)
    pinned = {n.id for n in cache.index.lanes[2].path}
    assert len(pinned) == 4 and holder.reuse_tokens == 0
    while True:
        events = plan_device_eviction(cache.index, cache.index.geometry.num_pages)
        if not events:
            break
        for event in events:
            named = set(getattr(event, "nodes", ())) | {getattr(event, "node", -1)}
            assert not named & pinned
            cache._apply(event)
    assert all(cache.index.nodes[n].device_page is not None for n in pinned)
    assert cache.index.num_evictable_pages == 0
