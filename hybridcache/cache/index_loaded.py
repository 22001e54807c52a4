"""apply() handlers for entries rebuilt from a prefix-cache file (§5.5): host-only blocks and snapshots.

Each handler validates everything first (raising EventRejected) and mutates only afterwards. Mixed into
``PrefixIndex``. A loaded entry has a host copy only; its first request restores it through the ordinary
host restore path. Loading never evicts: the caller names free slabs.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybridcache.cache import events as ev
from hybridcache.cache.errors import EventRejected
from hybridcache.cache.ids import BLOCK_TOKENS, NodeId, SlabId, SnapshotId
from hybridcache.cache.records import BlockNode, Residency, SlabOwnerKind, Snapshot, SnapshotKind

if TYPE_CHECKING:
    from hybridcache.cache.index import PrefixIndex

    _Base = PrefixIndex
else:
    _Base = object

_KINDS = frozenset(int(kind) for kind in SnapshotKind)


class LoadedHandlers(_Base):
    def _apply_block_loaded(self, e: ev.BlockLoaded) -> None:
        if e.node <= 0 or NodeId(e.node) in self.nodes:
            raise EventRejected(f"BlockLoaded: node id {e.node} is in use")
        if len(e.tokens) != BLOCK_TOKENS:
            raise EventRejected(f"BlockLoaded: {len(e.tokens)} tokens, a block has {BLOCK_TOKENS}")
        parent = self.node(e.parent)
        if parent.child(e.lookup_hash, tuple(e.tokens), e.extra) is not None:
            raise EventRejected(f"BlockLoaded: node {parent.id} already has this child")
        self._check_free_slabs((e.slab,), "BlockLoaded")
        node = BlockNode(NodeId(e.node), parent, e.lookup_hash, tuple(e.tokens), e.extra)
        node.inexact = e.inexact
        parent.add_child(node)
        self.nodes[node.id] = node
        self.next_node_id = max(self.next_node_id, e.node + 1)
        self._take_slabs((e.slab,), SlabOwnerKind.NODE, node.id)
        node.host_slab = SlabId(e.slab)
        node.host_state = Residency.RESIDENT
        node.last_access_tick = e.seq
        self._refresh_node(node)  # dead KV until a snapshot below it is loaded

    def _apply_snapshot_loaded(self, e: ev.SnapshotLoaded) -> None:
        if e.snapshot < 0 or SnapshotId(e.snapshot) in self.snapshots:
            raise EventRejected(f"SnapshotLoaded: snapshot id {e.snapshot} is in use")
        if e.kind not in _KINDS:
            raise EventRejected(f"SnapshotLoaded: unknown kind {e.kind}")
        if e.hits < 0:
            raise EventRejected(f"SnapshotLoaded: hits {e.hits} is negative")
        anchor = self.node(e.anchor)
        tail = tuple(e.tail_tokens)
        if len(tail) >= BLOCK_TOKENS:
            raise EventRejected("SnapshotLoaded: a tail holds fewer than 64 tokens")
        if (anchor.id, tail) in self.snapshot_by_key:
            raise EventRejected("SnapshotLoaded: a snapshot with this anchor and tail exists")
        if len(e.image_slabs) != self.geometry.image_slabs:
            raise EventRejected(f"SnapshotLoaded: an image takes {self.geometry.image_slabs} slabs")
        if (e.tail_slab is not None) != bool(tail):
            raise EventRejected("SnapshotLoaded: a tail slab exactly when there are tail tokens")
        tail_slabs = () if e.tail_slab is None else (e.tail_slab,)
        self._check_free_slabs((*e.image_slabs, *tail_slabs), "SnapshotLoaded")
        snap = Snapshot(SnapshotId(e.snapshot), anchor, tail, SnapshotKind(e.kind))
        snap.inexact = e.inexact
        self.next_snapshot_id = max(self.next_snapshot_id, e.snapshot + 1)
        self._take_slabs(tuple(e.image_slabs), SlabOwnerKind.IMAGE, snap.id)
        snap.host_slabs = tuple(SlabId(s) for s in e.image_slabs)
        snap.host_state = Residency.RESIDENT
        if e.tail_slab is not None:
            self._take_slabs(tail_slabs, SlabOwnerKind.TAIL, snap.id)
            snap.tail_host_slab = SlabId(e.tail_slab)
            snap.tail_host_state = Residency.RESIDENT
        snap.hits = e.hits
        snap.published_tick = snap.last_hit_tick = e.seq
        snap.base_l = self.gdsf_l
        anchor.snapshots += (snap,)
        self.snapshots[snap.id] = snap
        self.snapshot_by_key[(anchor.id, tail)] = snap
        self._attach_snapshot(snap)
        self._refresh_tail(snap)
