"""The canonical encoding of the index state that ``PrefixIndex.digest`` hashes (replay checks).

``state_bytes(index, part, parts)`` encodes one of ``parts`` slices: the records whose id (or position,
for pages, slabs and list orders) is ``part`` modulo ``parts``, plus every small global field. Slice
``0`` of ``1`` is the whole state. The worker digests one slice per unit, so a checkpoint of a large
index never stalls it for longer than a slice takes (see ``CheckpointRound``); together the ``parts``
slices of a round cover every record once, each at the sequence number its Checkpoint event names.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, TypeVar

import msgspec

from hybridcache.cache.records import BlockNode, LruLinks, LruList, Snapshot

if TYPE_CHECKING:
    from hybridcache.cache.index import PrefixIndex

T = TypeVar("T")


def state_bytes(index: PrefixIndex, part: int = 0, parts: int = 1) -> bytes:
    """A canonical msgpack encoding of slice ``part`` of ``parts`` of every logical field of the index
    (pure; for digest()). Raises ValueError unless 0 <= part < parts."""
    if not 0 <= part < parts:
        raise ValueError(f"need 0 <= part < parts, got part {part} of {parts}")
    whole = parts == 1
    selected_nodes = _records_in_part(index.nodes, index.next_node_id, part, parts)
    selected_snaps = _records_in_part(index.snapshots, index.next_snapshot_id, part, parts)
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
        for n in selected_nodes
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
        for s in selected_snaps
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
    if whole:
        lru = [
            [(type(e).__name__, e.id) for e in index.lru.iter_lru_first(which)]  # type: ignore[attr-defined]
            for which in (LruList.BACKED, LruList.UNBACKED)
        ]
    else:  # a slice names each of its entries' list and neighbours: all slices together fix both lists
        lru = [[_lru_links(e) for e in selected_nodes], [_lru_links(e) for e in selected_snaps]]
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
        sorted(node for node in index.dead_nodes if node % parts == part),
        [None if o is None else (int(o[0]), o[1]) for o in index.pages.owners[part::parts]],
        index.pages.free_order()[part::parts],
        [(int(r), o) for r, o in zip(index.slots.roles, index.slots.owners)],
        [
            (k, int(v[0]), v[1])
            for k, v in _items_in_part(index.slab_owners, _slab_limit(index), part, parts)
        ],
        [] if index.host is None else index.host.free_slabs_slice(part, parts),
        sorted(
            (b, [n.id for n in r.nodes], None if r.snapshot is None else r.snapshot.id, r.tail, r.image)
            for b, r in index.restores.items()
        ),
        sorted(
            (b, [n.id for n in w.nodes], [s.id for s in w.images], [s.id for s in w.tails])
            for b, w in index.host_writes.items()
        ),
    )
    inexact_nodes = [n.id for n in selected_nodes if n.inexact]
    inexact_snaps = [s.id for s in selected_snaps if s.inexact]
    if inexact_nodes or inexact_snaps:  # appended only when set: an exact-only state keeps its digest
        state += (inexact_nodes, inexact_snaps)
    return msgspec.msgpack.encode(state)


def _keys_in_part(mapping: Mapping[int, object], id_limit: int, part: int, parts: int) -> list[int]:
    """The keys k of ``mapping`` with k % parts == part, ascending, by whichever is shorter: probing
    every candidate id below ``id_limit`` or scanning the mapping. Pure."""
    if parts == 1:
        return sorted(mapping)
    if -(-id_limit // parts) < len(mapping):
        return [k for k in range(part, id_limit, parts) if k in mapping]
    return sorted(k for k in mapping if k % parts == part)


def _records_in_part(mapping: Mapping[int, T], id_limit: int, part: int, parts: int) -> list[T]:
    return [mapping[k] for k in _keys_in_part(mapping, id_limit, part, parts)]  # type: ignore[index]


def _items_in_part(mapping: Mapping[int, T], id_limit: int, part: int, parts: int) -> list[tuple[int, T]]:
    return [(k, mapping[k]) for k in _keys_in_part(mapping, id_limit, part, parts)]


def _slab_limit(index: PrefixIndex) -> int:
    return 0 if index.host is None else index.host.num_slabs


def _lru_links(entry: LruLinks) -> tuple[int, object, object]:
    return int(entry.lru_list), _link_name(entry.lru_prev), _link_name(entry.lru_next)


def _link_name(entry: LruLinks | None) -> object:
    if entry is None:
        return None
    if isinstance(entry, BlockNode | Snapshot):
        return (type(entry).__name__, entry.id)
    return ("sentinel", 0)  # both lists end in their own sentinel; lru_list of the entry tells which
