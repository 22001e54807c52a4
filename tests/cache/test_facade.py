"""The Cache facade end to end: what the engine is told to copy, and the index it leaves."""

from cache_factories import (
    assert_reuses,
    checked_cache,
    geometry,
    node_count,
    prompt,
    run_request,
    tokens,
)

from hybridcache.cache.events import DeviceCopiesDropped, SnapshotDeviceDropped
from hybridcache.cache.facade_results import StateSourceKind
from hybridcache.cache.match import SourceKind
from hybridcache.cache.records import LruList
from hybridcache.cache.write_back import HostWrite


def test_disabled_requests_leave_no_nodes_or_snapshots():
    cache = checked_cache()
    toks = tokens(300)
    staged = cache.stage(cache.quote(prompt(toks, enabled=False)), 0)
    cache.activate(0)
    assert cache.take_tap(0, 128).slot is None
    assert cache.commit_blocks(0, toks).inserted == 0
    finished = cache.finish(0, toks + tokens(30, 1))
    assert finished.endpoint is None and finished.write is None
    assert node_count(cache) == 0 and not cache.index.snapshots
    assert cache.index.num_free_pages == cache.index.geometry.num_pages
    assert staged.state_source == StateSourceKind.RESET


def test_multi_turn_resume_uses_the_exact_endpoint_and_copies_its_tail():
    cache = checked_cache()
    turn_one = tokens(300)
    _, _, first = run_request(cache, turn_one, generated=tokens(25, 1))
    history = turn_one + tokens(25, 1)
    quoted, staged, _ = run_request(cache, history + tokens(90, 2), lane=1)
    endpoint = cache.index.snapshots[first.endpoint]
    assert quoted.reuse_tokens == len(history) == endpoint.frontier
    assert staged.state_source == StateSourceKind.COPY_SLOT
    assert staged.tail_copy is not None and staged.tail_copy.tokens == len(history) % 64
    assert staged.tail_copy.src == endpoint.tail_device_page
    assert staged.tail_copy.dst == staged.block_table[len(history) // 64]  # private, not shared
    assert staged.tail_copy.dst != staged.tail_copy.src


def test_a_host_only_snapshot_restores_blocks_tail_and_image_in_forward_order():
    cache = checked_cache(geometry(snapshot_slots=4), host_write=HostWrite.THROUGH)
    turn = tokens(300)
    _, _, first = run_request(cache, turn)
    index = cache.index
    endpoint = index.snapshots[first.endpoint]
    path_nodes = tuple(n.id for n in index.path_to(endpoint.anchor))
    cache._apply(DeviceCopiesDropped(0, path_nodes, (endpoint.id,)))
    cache._apply(SnapshotDeviceDropped(0, endpoint.id))
    quoted = cache.quote(prompt([*turn, 7]))
    assert quoted.source_kind == SourceKind.HOST and quoted.reuse_tokens == 300
    staged = cache.stage(quoted, 1)
    restore = staged.restore
    assert [copy.slab for copy in restore.blocks] == [index.nodes[n].host_slab for n in path_nodes]
    assert restore.tail.slab == endpoint.tail_host_slab and restore.image_slabs == endpoint.host_slabs
    assert staged.state_source == StateSourceKind.RESTORE
    assert staged.block_table[:4] == tuple(copy.page for copy in restore.blocks)
    cache.activate(1)
    cache.restore_done(restore.batch)
    assert all(index.nodes[n].device_page is not None for n in path_nodes)
    cache.finish(1, [*turn, 7])


def test_active_growth_evicts_cache_but_never_an_active_page():
    cache = checked_cache(geometry(num_pages=12, host_slabs=0))
    run_request(cache, tokens(400, seed=1), lane=0, output_tokens=0)
    index = cache.index
    cached_before = index.lru.count(LruList.UNBACKED)
    assert cached_before > 0
    staged = cache.stage(cache.quote(prompt(tokens(100, seed=2), 0)), 1)
    cache.activate(1)
    own = set(staged.block_table)
    grown = cache.allocate_growth_pages(1, index.num_free_pages + cached_before)
    assert grown is not None and not own & set(grown)
    assert index.lru.count(LruList.UNBACKED) == 0
    assert cache.allocate_growth_pages(1, 1) is None  # nothing evictable is left, nothing active taken


def test_host_cache_zero_keeps_a_device_only_cache_that_still_hits():
    cache = checked_cache(geometry(host_slabs=0))
    turn = tokens(300)
    _, _, first = run_request(cache, turn)
    assert first.write is None and cache.index.host is None
    assert_reuses(cache, [*turn, 1], 300)
