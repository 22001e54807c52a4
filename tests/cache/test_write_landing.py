"""Write-through landing (§7.6, §9.1, §9.4): blocks in flight are on no LRU list; when their write lands,
the unpinned ones join the host-backed list in the batch's order, and the dead list when no snapshot lies
below them. A lane still holding a block keeps it off both until it releases."""

import msgspec
from cache_factories import checked_cache, geometry, prompt, run_request, tokens

from hybridcache.cache import events as ev
from hybridcache.cache.records import LruList
from hybridcache.cache.write_back import HostWrite


def backed_ids(cache) -> list[int]:
    return [entry.id for entry in cache.index.lru.iter_lru_first(LruList.BACKED)]


def stage_and_commit(cache, toks, lane: int = 0, enabled: bool = False) -> None:
    quoted = msgspec.structs.replace(cache.quote(prompt(toks, 0, enabled=enabled)), enabled=True)
    cache.stage(quoted, lane)
    cache.activate(lane)
    cache.commit_blocks(lane, toks)


def test_a_landed_write_lists_its_blocks_in_batch_order_and_marks_them_dead_without_snapshots():
    journal: list = []
    cache = checked_cache(geometry(), journal, host_write=HostWrite.THROUGH)
    stage_and_commit(cache, tokens(4 * 64))
    written = cache.release(0).write
    assert written is not None
    in_flight = [n for n in cache.index.nodes.values() if n.parent is not None]
    assert all(n.lru_list is LruList.NONE and n.restore_pins == 1 for n in in_flight)
    assert not cache.index.dead_nodes and cache.index.num_evictable_pages == 0
    cache.host_write_done(written.batch)
    batch_order = next(e.nodes for e in reversed(journal) if isinstance(e, ev.HostWriteOpened))
    assert backed_ids(cache) == list(batch_order)
    assert set(cache.index.dead_nodes) == set(batch_order)  # nothing below them can be restored


def test_blocks_with_a_snapshot_below_land_live_and_a_holding_lane_keeps_them_off_the_lists():
    cache = checked_cache(geometry(), host_write=HostWrite.THROUGH)
    toks = tokens(3 * 64 + 10)
    _, _, finished = run_request(cache, toks, land=False)  # the endpoint snapshot lies below every block
    assert finished.write is not None
    stage_and_commit(cache, toks[: 2 * 64], lane=1)  # a second lane maps the first two blocks meanwhile
    cache.host_write_done(finished.write.batch)
    held = {node.id for node in cache.index.lanes[1].path}
    listed = backed_ids(cache)
    assert held and not held & set(listed)  # pinned blocks stay off the LRU
    assert not cache.index.dead_nodes
    cache.release(1)
    assert held <= set(backed_ids(cache))


def test_without_device_copies_a_landed_image_frees_its_slot_and_stays_on_the_host():
    journal: list = []
    cache = checked_cache(geometry(), journal, host_write=HostWrite.THROUGH, keep_backed_device_images=False)
    toks = tokens(3 * 64 + 10)
    _, _, finished = run_request(cache, toks, land=False)
    assert finished.write is not None and finished.write.images
    slot = finished.write.images[0].slot
    snap = next(s for s in cache.index.snapshots.values() if s.device_slot == slot)
    freed = cache.host_write_done(finished.write.batch)
    assert freed == [slot]
    assert snap.device_slot is None and snap.host_state.name == "RESIDENT"
    assert cache.index.slots.peek_free() is not None
    assert isinstance(journal[-1], ev.SnapshotDeviceDropped)  # the drop is an event like any other
    # the snapshot still serves its prefix, from the host
    quoted = cache.quote(prompt([*toks, 1, 2, 3], 0))
    assert quoted.reuse_tokens > 0


def test_by_default_a_landed_image_keeps_its_device_copy():
    cache = checked_cache(geometry(), host_write=HostWrite.THROUGH)
    _, _, finished = run_request(cache, tokens(3 * 64 + 10), land=False)
    slot = finished.write.images[0].slot
    snap = next(s for s in cache.index.snapshots.values() if s.device_slot == slot)
    assert cache.host_write_done(finished.write.batch) == []
    assert snap.device_slot is not None
