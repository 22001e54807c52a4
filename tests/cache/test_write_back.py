"""Write-back (cache/write_back.py): blocks reach the host when eviction would lose them, not at release.

Eviction writes the least recently used unbacked blocks that a live snapshot can reach, hands the write
to ``host_copy`` while their pages still hold them, lands it, and only then drops the device copies;
unreachable blocks are evicted without a copy. Release writes snapshot images and tails only. The
stop-time flush writes every reachable device-only block, parents first.
"""

import pytest
from cache_factories import checked_cache, flush_and_land, geometry, insert_path, prompt, run_request, tokens

from hybridcache.cache import events as ev
from hybridcache.cache.match import SourceKind
from hybridcache.cache.records import LruList, PageOwnerKind, Residency
from hybridcache.cache.write_back import HostWrite, plan_write_back


def host_resident_blocks(cache) -> set[int]:
    nodes = cache.index.nodes.values()
    return {n.id for n in nodes if n.parent is not None and n.host_state == Residency.RESIDENT}


def path_ids(cache, snapshot_id) -> list[int]:
    index = cache.index
    return [n.id for n in index.path_to(index.snapshots[snapshot_id].anchor)]


def test_a_release_writes_snapshot_copies_but_no_blocks():
    cache = checked_cache(geometry(num_pages=32))
    _, _, finished = run_request(cache, tokens(4 * 64 + 10), generated=tokens(20, seed=9))
    assert finished.endpoint is not None and finished.write is not None
    assert finished.write.blocks == () and len(finished.write.tails) == 1 and len(finished.write.images) == 1
    assert host_resident_blocks(cache) == set()

    through = checked_cache(geometry(num_pages=32), host_write=HostWrite.THROUGH)
    _, _, written = run_request(through, tokens(4 * 64 + 10), generated=tokens(20, seed=9))
    assert len(written.write.blocks) == 4  # write-through: every full block of the 286 committed tokens


def test_eviction_writes_the_reachable_path_back_before_dropping_it_and_it_restores_from_the_host():
    journal: list = []
    cache = checked_cache(geometry(num_pages=16, snapshot_slots=4), journal)
    first = tokens(4 * 64 + 10, seed=1)
    _, _, a = run_request(cache, first, output_tokens=0)
    a_path = path_ids(cache, a.endpoint)
    assert len(a_path) == 4 and host_resident_blocks(cache) == set()
    start = len(journal)
    # 14 pages: the 11 free ones, the endpoint tail's (host-backed), and two of the first path's blocks
    run_request(cache, tokens(14 * 64, seed=2), lane=1, output_tokens=0)
    events = journal[start:]
    opened = [e for e in events if isinstance(e, ev.HostWriteOpened) and e.nodes]
    assert opened and set(opened[0].nodes) <= set(a_path)
    batch = opened[0].batch
    landed = next(i for i, e in enumerate(events) if isinstance(e, ev.HostWriteLanded) and e.batch == batch)
    written = set(opened[0].nodes)
    dropped = next(
        i for i, e in enumerate(events) if isinstance(e, ev.DeviceCopiesDropped) and written & set(e.nodes)
    )
    assert landed < dropped  # written and landed before their device copies go
    assert not any(isinstance(e, ev.SubtreeDeleted) for e in events)  # nothing reachable was lost
    assert cache.stats.written_back_blocks == len(host_resident_blocks(cache)) > 0

    quoted = cache.quote(prompt([*first, 5]))
    assert quoted.snapshot == a.endpoint and quoted.reuse_tokens == len(first)
    assert any(cache.index.nodes[n].device_state == Residency.ABSENT for n in a_path)  # dropped after
    assert quoted.source_kind == SourceKind.HOST
    _, staged, _ = run_request(cache, [*first, 5], output_tokens=0)
    assert staged.reuse_tokens == len(first)


def test_unreachable_blocks_are_evicted_without_a_host_copy():
    journal: list = []
    cache = checked_cache(geometry(num_pages=16, snapshot_slots=4), journal)
    insert_path(cache, tokens(6 * 64, seed=3), lane=0)  # no snapshot below: nothing could resume there
    _, _, kept = run_request(cache, tokens(4 * 64 + 10, seed=1), output_tokens=0)
    dead = {n.id for n in cache.index.nodes.values() if n.parent is not None and not n.live_snapshots_below}
    assert len(dead) == 6
    start = len(journal)
    run_request(cache, tokens(8 * 64, seed=4), lane=1, output_tokens=0)  # 8 pages: 5 free, 3 evicted
    events = journal[start:]
    deleted = [e.node for e in events if isinstance(e, ev.SubtreeDeleted)]
    assert deleted and set(deleted) <= dead  # the two coldest, then the endpoint tail's host-backed copy
    assert not any(isinstance(e, ev.HostWriteOpened) and e.nodes for e in events)
    assert host_resident_blocks(cache) == set() and cache.stats.written_back_blocks == 0
    assert cache.quote(prompt([*tokens(4 * 64 + 10, seed=1), 3])).snapshot == kept.endpoint


def test_host_copy_sees_each_write_back_while_its_pages_still_hold_the_blocks():
    seen = []

    def host_copy(plan):
        index = cache.index
        for copy in plan.blocks:
            kind, node_id = index.pages.owners[copy.page]
            node = index.nodes[node_id]
            assert kind == PageOwnerKind.NODE and node.device_page == copy.page
            assert node.host_slab == copy.slab and node.host_state == Residency.FILLING
        seen.append(plan)

    cache = checked_cache(geometry(num_pages=16, snapshot_slots=4))
    cache.host_copy = host_copy
    run_request(cache, tokens(4 * 64 + 10, seed=1), output_tokens=0)
    run_request(cache, tokens(14 * 64, seed=2), lane=1, output_tokens=0)
    assert seen and sum(len(plan.blocks) for plan in seen) == cache.stats.written_back_blocks
    assert all(plan.images == () and plan.tails == () for plan in seen)


def test_the_least_recently_used_reachable_blocks_are_written_first_deepest_first():
    cache = checked_cache(geometry(num_pages=24, snapshot_slots=4))
    _, _, old = run_request(cache, tokens(4 * 64 + 10, seed=5), output_tokens=0)
    _, _, new = run_request(cache, tokens(4 * 64 + 10, seed=6), lane=1, output_tokens=0)
    index = cache.index
    wanted = index.num_free_pages + index.lru.count(LruList.BACKED) + 3  # 3 short of free + host-backed
    chosen = plan_write_back(index, wanted)
    old_path = path_ids(cache, old.endpoint)
    assert chosen.delete == []
    assert [n.id for n in chosen.write] == old_path[::-1][:3]  # the older path, its deepest block first
    assert not set(path_ids(cache, new.endpoint)) & {n.id for n in chosen.write}


def test_the_stop_flush_writes_every_reachable_device_only_block_parents_first():
    journal: list = []
    cache = checked_cache(geometry(num_pages=48, snapshot_slots=4), journal)
    shared = tokens(2 * 64, seed=7)
    _, _, a = run_request(cache, shared + tokens(2 * 64 + 5, seed=8), output_tokens=0)
    _, _, b = run_request(cache, shared + tokens(3 * 64 + 5, seed=9), lane=1, output_tokens=0)
    insert_path(cache, tokens(3 * 64, seed=10), lane=0)  # unreachable: stays device-only
    reachable = set(path_ids(cache, a.endpoint)) | set(path_ids(cache, b.endpoint))
    assert flush_and_land(cache) == len(reachable) == 7
    assert host_resident_blocks(cache) == reachable
    opened = next(e for e in reversed(journal) if isinstance(e, ev.HostWriteOpened))
    depths = [cache.index.nodes[n].depth for n in opened.nodes]
    assert depths == sorted(depths)  # parents before children
    assert cache.flush_to_host() is None  # nothing left to write


def test_a_failed_copy_leaves_no_lane_staged_and_the_write_in_flight():
    cache = checked_cache(geometry(num_pages=16, snapshot_slots=4))
    run_request(cache, tokens(4 * 64 + 10, seed=1), output_tokens=0)

    def broken(plan):
        raise OSError("copy failed")

    cache.host_copy = broken
    quoted = cache.quote(prompt(tokens(14 * 64, seed=2), 0))
    with pytest.raises(OSError, match="copy failed"):
        cache.stage(quoted, 1)
    assert not cache.index.lanes and cache.stats.written_back_blocks == 0
    (batch,) = cache.index.host_writes.values()  # opened, never landed: its blocks stay on the device
    assert batch.nodes and all(n.device_state == Residency.RESIDENT for n in batch.nodes)


def test_without_dead_kv_reclaim_unreachable_blocks_are_passed_over_not_deleted():
    cache = checked_cache(geometry(num_pages=16, snapshot_slots=4))
    _, _, kept = run_request(cache, tokens(4 * 64 + 10, seed=1), output_tokens=0)
    insert_path(cache, tokens(6 * 64, seed=3), lane=0)  # newer than the reachable path, unreachable
    index = cache.index
    wanted = index.num_free_pages + index.lru.count(LruList.BACKED) + 2
    ours = plan_write_back(index, wanted)
    baseline = plan_write_back(index, wanted, delete_unreachable=False)
    reachable = path_ids(cache, kept.endpoint)
    assert ours.delete == [] and [n.id for n in ours.write] == reachable[::-1][:2]  # the colder path
    assert baseline == ours  # nothing unreachable is colder here

    cache = checked_cache(geometry(num_pages=16, snapshot_slots=4))
    insert_path(cache, tokens(6 * 64, seed=3), lane=0)  # now the unreachable path is the colder one
    _, _, kept = run_request(cache, tokens(4 * 64 + 10, seed=1), output_tokens=0)
    index = cache.index
    wanted = index.num_free_pages + index.lru.count(LruList.BACKED) + 2
    ours = plan_write_back(index, wanted)
    baseline = plan_write_back(index, wanted, delete_unreachable=False)
    assert len(ours.delete) == 2 and ours.write == []
    assert baseline.delete == []
    assert [n.id for n in baseline.write] == path_ids(cache, kept.endpoint)[::-1][:2]
