"""The canonical encoding of the index state that ``PrefixIndex.digest`` hashes (replay checks)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from hybridcache.cache.records import LruList

if TYPE_CHECKING:
    from hybridcache.cache.index import PrefixIndex


def state_bytes(index: PrefixIndex) -> bytes:
    """A canonical msgpack encoding of every logical field of the index (pure; for digest())."""
    nodes = [
        (
            n.id,
            -1 if n.parent is None else n.parent.id,
            n.lookup_hash,
            n.tokens,
            n.extra,
            n.device_page,
            n.host_slab,
            int(n.device_state),
            int(n.host_state),
            n.active_refs,
            n.restore_pins,
            n.live_snapshots_below,
            n.last_access_tick,
        )
        for n in sorted(index.nodes.values(), key=lambda n: n.id)
    ]
    snaps = [
        (
            s.id,
            s.anchor.id,
            s.tail_tokens,
            int(s.kind),
            s.tail_device_page,
            s.tail_host_slab,
            int(s.tail_device_state),
            int(s.tail_host_state),
            s.device_slot,
            s.host_slabs,
            int(s.device_state),
            int(s.host_state),
            s.restore_pins,
            s.superseded,
            s.superseded_tick,
            s.gdsf_h,
            s.base_l,
            s.hits,
            s.last_hit_tick,
            s.published_tick,
            None if s.ancestor is None else s.ancestor.id,
            sorted(s.dependents),
        )
        for s in sorted(index.snapshots.values(), key=lambda s: s.id)
    ]
    lanes = [
        (
            la.id,
            la.enabled,
            la.slot,
            la.base,
            [n.id for n in la.path],
            la.table,
            list(la.private),
            None if la.source is None else la.source.id,
            la.resumed_from,
            la.lineage,
            sorted((p.position, p.slot, p.boundary) for p in la.pending_taps.values()),
            la.activated,
        )
        for la in sorted(index.lanes.values(), key=lambda la: la.id)
    ]
    lru = [
        [(type(e).__name__, e.id) for e in index.lru.iter_lru_first(which)]  # type: ignore[attr-defined]
        for which in (LruList.BACKED, LruList.UNBACKED)
    ]
    state = (
        index.seq,
        index.cache_epoch,
        index.gdsf_l,
        index.next_node_id,
        index.next_snapshot_id,
        index.next_batch_id,
        nodes,
        snaps,
        lanes,
        lru,
        sorted(index.dead_nodes),
        [None if o is None else (int(o[0]), o[1]) for o in index.pages.owners],
        index.pages.free_order(),
        [(int(r), o) for r, o in zip(index.slots.roles, index.slots.owners)],
        sorted((k, int(v[0]), v[1]) for k, v in index.slab_owners.items()),
        [] if index.host is None else [int(slab) for slab in index.host.free_slabs()],
        sorted(
            (b, [n.id for n in r.nodes], None if r.snapshot is None else r.snapshot.id, r.tail, r.image)
            for b, r in index.restores.items()
        ),
        sorted(
            (b, [n.id for n in w.nodes], [s.id for s in w.images], [s.id for s in w.tails])
            for b, w in index.host_writes.items()
        ),
    )
    return msgspec.msgpack.encode(state)
