"""Admission arithmetic (§6.2, §6.3, §13.1): fallback order, Blocked vs Infeasible, staleness, Filling."""

import pytest
from cache_factories import checked_cache, geometry, prompt, run_request, tokens

from hybridcache.cache.events import DeviceCopiesDropped, SnapshotDeviceDropped
from hybridcache.cache.facade_results import StaleQuote
from hybridcache.cache.match import Readiness, SourceKind, match, source_options
from hybridcache.cache.write_back import HostWrite


def test_the_cheapest_source_is_the_deepest_snapshot_and_device_then_root_follow():
    cache = checked_cache(geometry(snapshot_slots=4))
    history = tokens(256, seed=1)
    _, _, first = run_request(cache, history, lane=0)
    _, _, second = run_request(cache, history + tokens(128, seed=2), lane=1)
    # The deeper snapshot's image leaves the device: it now restores from the host.
    cache._apply(SnapshotDeviceDropped(0, second.endpoint))
    request = prompt(history + tokens(128, seed=2) + tokens(50, seed=3))
    found = match(cache.index, request)
    best, order = source_options(cache.index, found, request, cache.cost)
    assert best.snapshot.id == second.endpoint and best.image_restore
    assert [o.snapshot.id if o.snapshot else None for o in order] == [second.endpoint, first.endpoint, None]
    quoted = cache.quote(request)
    assert quoted.readiness == Readiness.READY and quoted.source_kind == SourceKind.HOST
    assert quoted.reuse_tokens == 384 and quoted.restored_host_bytes == cache.index.geometry.image_bytes


def test_when_the_cheapest_source_does_not_fit_the_device_resident_one_is_staged():
    cache = checked_cache(geometry(num_pages=16, snapshot_slots=4))
    history, reply = tokens(256, seed=1), tokens(130, seed=2)
    _, _, first = run_request(cache, history, lane=0, output_tokens=0)  # E1 at 256
    _, _, second = run_request(cache, history + reply, lane=1, output_tokens=0)  # E2 at 386, 2-token tail
    cache._apply(DeviceCopiesDropped(0, (), (second.endpoint,)))  # E2's tail page now restores from host
    request = prompt(history + reply + tokens(50, seed=3), 0)  # 7 blocks
    assert cache.quote(request).snapshot == second.endpoint  # cheapest: 50 tokens + a one-page restore
    # A lane holding 9 of the 10 free pages: E2 needs 2 (tail + 1 private), E1 needs 3 but may evict
    # E2's 2 unpinned blocks.
    cache.stage(cache.quote(prompt(tokens(9 * 64, seed=9), 0)), 0)
    cache.activate(0)
    quoted = cache.quote(request)
    assert quoted.readiness == Readiness.READY and quoted.snapshot == first.endpoint
    assert quoted.source_kind == SourceKind.DEVICE and quoted.need_pages == 3


def test_blocked_while_active_lanes_hold_the_pages_infeasible_when_the_pool_is_too_small():
    cache = checked_cache(geometry(num_pages=8))
    assert cache.quote(prompt(tokens(9 * 64), 0)).readiness == Readiness.PERMANENTLY_INFEASIBLE
    holder = cache.quote(prompt(tokens(6 * 64, seed=1), 0))
    cache.stage(holder, 0)
    cache.activate(0)
    waiting = prompt(tokens(4 * 64, seed=2), 0)
    assert cache.quote(waiting).readiness == Readiness.TEMPORARILY_BLOCKED
    cache.release(0)
    assert cache.quote(waiting).readiness == Readiness.READY


def test_no_free_active_slot_blocks_admission():
    cache = checked_cache(geometry(concurrency=1))
    cache.stage(cache.quote(prompt(tokens(100, seed=1))), 0)
    assert cache.quote(prompt(tokens(100, seed=2))).readiness == Readiness.TEMPORARILY_BLOCKED


def test_a_quote_goes_stale_when_the_index_changes_before_staging():
    cache = checked_cache()
    first = cache.quote(prompt(tokens(100, seed=1)))
    second = cache.quote(prompt(tokens(100, seed=2)))
    assert first.cache_epoch == second.cache_epoch == cache.index.cache_epoch
    cache.stage(first, 0)
    with pytest.raises(StaleQuote):
        cache.stage(second, 1)
    assert 1 not in cache.index.lanes


def test_candidates_with_a_filling_block_are_skipped():
    cache = checked_cache(geometry(num_pages=16, snapshot_slots=4), host_write=HostWrite.THROUGH)
    history = tokens(256, seed=1)
    _, _, first = run_request(cache, history, lane=0)
    index = cache.index
    for node in index.path_to(index.snapshots[first.endpoint].anchor):
        cache._apply(DeviceCopiesDropped(0, (node.id,)))
    resumed = cache.stage(cache.quote(prompt([*history, 1, 2])), 0)  # restores the path: Filling
    assert resumed.restore is not None and len(resumed.restore.blocks) == 4
    other = cache.quote(prompt([*history, 3, 4]))
    assert other.snapshot is None and other.reuse_tokens == 0
    cache.restore_done(resumed.restore.batch)
    assert cache.quote(prompt([*history, 3, 4])).snapshot == first.endpoint


def test_the_fork_point_is_the_exact_token_where_a_cached_sibling_continues_differently():
    cache = checked_cache()
    context = tokens(200, seed=1)
    run_request(cache, context + tokens(100, seed=2), lane=0)  # the first sub-agent: blocks 0-3 cached
    second = context + tokens(90, seed=3)  # leaves the tree inside block 3, 8 tokens in
    assert cache.quote(prompt(second)).fork_tokens == 200
    assert cache.quote(prompt(context + tokens(100, seed=2) + tokens(40, seed=4))).fork_tokens == 0
    assert cache.quote(prompt(tokens(300, seed=5))).fork_tokens == 0  # nothing shared: no fork
