"""Read-only summaries of the cache for metrics: host tier composition, LRU and slot counts."""

from __future__ import annotations

from hybridcache.cache.index import PrefixIndex
from hybridcache.cache.records import LruList, Residency, SlotRole


def host_tier_composition(index: PrefixIndex) -> dict[str, int]:
    """Host bytes by kind: live KV blocks, dead KV (no snapshot can reach them), snapshot images,
    tails, and the bytes of superseded snapshots. O(nodes + snapshots); reads only."""
    geometry = index.geometry
    slab = geometry.slab_bytes
    kv = dead = 0
    for node in index.nodes.values():
        if node.parent is not None and node.host_state == Residency.RESIDENT:
            if node.live_snapshots_below > 0:
                kv += slab
            else:
                dead += slab
    images = tails = superseded = 0
    image_bytes = geometry.image_slabs * slab
    for snap in index.snapshots.values():
        size = 0
        if snap.host_state == Residency.RESIDENT:
            images += image_bytes
            size += image_bytes
        if snap.tail_tokens and snap.tail_host_state == Residency.RESIDENT:
            tails += slab
            size += slab
        if snap.superseded:
            superseded += size
    return {
        "kv": kv + dead,
        "snapshot": images + tails,
        "kv_live": kv,
        "kv_dead": dead,
        "images": images,
        "tails": tails,
        "superseded": superseded,
    }


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
