"""Read-only summaries of the cache for metrics: host tier composition, LRU and slot counts."""

from __future__ import annotations

from collections.abc import Iterable

from hybridcache.cache.ids import SnapshotId
from hybridcache.cache.index import PrefixIndex
from hybridcache.cache.records import LruList, Residency, SlotRole, Snapshot


def host_tier_composition(index: PrefixIndex) -> dict[str, int]:
    """Host bytes in use by kind; the kinds do not overlap, so they add up to the bytes in use:
    live KV blocks (a snapshot can reach them), dead KV (none can), snapshot images and tails.
    O(nodes + snapshots); reads only."""
    geometry = index.geometry
    slab = geometry.slab_bytes
    live = dead = 0
    for node in index.nodes.values():
        if node.parent is not None and node.host_state == Residency.RESIDENT:
            if node.live_snapshots_below > 0:
                live += slab
            else:
                dead += slab
    images = tails = 0
    for snap in index.snapshots.values():
        images += _snapshot_image_bytes(index, snap)
        tails += _snapshot_tail_bytes(index, snap)
    return {"kv_live": live, "kv_dead": dead, "snapshot_images": images, "snapshot_tails": tails}


def superseded_snapshot_bytes(index: PrefixIndex) -> int:
    """Host bytes (images and tails) of snapshots a later snapshot superseded. Reads only."""
    return sum(
        _snapshot_image_bytes(index, snap) + _snapshot_tail_bytes(index, snap)
        for snap in index.snapshots.values()
        if snap.superseded
    )


def snapshot_host_bytes(index: PrefixIndex, snapshots: Iterable[SnapshotId]) -> int:
    """Host bytes (images and tails) of those of `snapshots` still in the index. Reads only."""
    live = [snap for snap in (index.snapshots.get(sid) for sid in snapshots) if snap is not None]
    return sum(_snapshot_image_bytes(index, snap) + _snapshot_tail_bytes(index, snap) for snap in live)


def host_images(index: PrefixIndex) -> int:
    """Snapshot images resident on the host. Reads only."""
    return sum(1 for snap in index.snapshots.values() if snap.host_state == Residency.RESIDENT)


def _snapshot_image_bytes(index: PrefixIndex, snap: Snapshot) -> int:
    if snap.host_state != Residency.RESIDENT:
        return 0
    return index.geometry.image_slabs * index.geometry.slab_bytes


def _snapshot_tail_bytes(index: PrefixIndex, snap: Snapshot) -> int:
    if not snap.tail_tokens or snap.tail_host_state != Residency.RESIDENT:
        return 0
    return index.geometry.slab_bytes


def device_counts(index: PrefixIndex) -> dict[str, int]:
    """Device LRU lengths, host writes in flight and state-slot roles."""
    return {
        "lru_backed": index.lru.count(LruList.BACKED),
        "lru_unbacked": index.lru.count(LruList.UNBACKED),
        "host_writes_in_flight": len(index.host_writes),
        "slots_snapshot": index.slots.count(SlotRole.SNAPSHOT),
        "slots_staging": index.slots.count(SlotRole.STAGING),
        "slots_active": index.slots.count(SlotRole.ACTIVE),
    }
