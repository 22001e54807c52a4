"""ContentsSink: the cache-event sink that turns host-tier changes into contents records (`--cache-dir`).

It subscribes to the facade's event stream like the event journal (`append(event)`, called on the worker
right after the event is applied, so the index already shows its effect). Its work per event is a dict
lookup; the few events that touch the host tier build small records from the index (no bytes are read
here) and queue them for the `ContentsWriter` thread, which hashes, fsyncs and writes them.

Slab generations: every `HostWriteOpened` bumps the generation of the slabs it takes, before the engine
starts copying into them. A store queued at landing carries the generations it saw; the writer hashes the
slabs and then compares, so bytes of a slab that was freed and reused in the meantime are never recorded
under the old entry.
"""

from __future__ import annotations

from array import array
from typing import TYPE_CHECKING

from hybridcache.cache import events as ev
from hybridcache.cache.ids import NodeId, SnapshotId
from hybridcache.persistence.contents_records import (
    BlockReleased,
    BlockStored,
    ContentsRecord,
    ImageStored,
    NodeRemoved,
    SnapshotRemoved,
    SnapshotState,
    TailStored,
)
from hybridcache.persistence.contents_writer import ContentsWriter, PendingStore

if TYPE_CHECKING:
    from hybridcache.cache.index import PrefixIndex


class ContentsSink:
    """`append(event)` on the worker thread; `generation(slab)` and `clean_seq` are read by the writer."""

    def __init__(self, index: PrefixIndex, num_slabs: int, stored_snapshots: set[int] | None = None) -> None:
        self.index = index
        self.writer: ContentsWriter | None = None  # attached once the directory is open
        self._generations = array("Q", bytes(8 * num_slabs))
        self._open_batches: dict[int, ev.HostWriteOpened] = {}
        self._stored_snapshots: set[int] = set(stored_snapshots or ())
        self.clean_seq = 0  # the last event seq after which no host write was in flight
        self._handlers = {
            ev.HostWriteOpened: self._opened,
            ev.HostWriteLanded: self._landed,
            ev.NodeHostDropped: self._node_host_dropped,
            ev.PinnedHostCopiesDropped: self._pinned_host_copies_dropped,
            ev.BlockMadeExact: self._block_made_exact,
            ev.SubtreeDeleted: self._subtree_deleted,
            ev.SnapshotHostDropped: self._snapshot_removed,
            ev.SnapshotDeleted: self._snapshot_removed,
            ev.SnapshotHit: self._snapshot_state,
            ev.SnapshotSuperseded: self._snapshot_state,
            ev.SnapshotRetained: self._snapshot_state,
        }

    def generation(self, slab: int) -> int:
        return self._generations[slab]

    def append(self, event: ev.CacheEvent) -> None:
        handler = self._handlers.get(type(event))
        if handler is not None:
            items = handler(event)  # type: ignore[operator]
            if items and self.writer is not None:
                self.writer.append(items)
        if not self._open_batches:
            self.clean_seq = event.seq

    def _opened(self, event: ev.HostWriteOpened) -> None:
        generations = self._generations
        for slab in event.node_slabs:
            generations[slab] += 1
        for group in event.image_slabs:
            for slab in group:
                generations[slab] += 1
        for slab in event.tail_slabs:
            generations[slab] += 1
        self._open_batches[event.batch] = event
        return None

    def _landed(self, event: ev.HostWriteLanded) -> list[PendingStore]:
        opened = self._open_batches.pop(event.batch, None)
        if opened is None:
            return []
        index, generations, stores = self.index, self._generations, []
        for node_id, slab in zip(opened.nodes, opened.node_slabs):
            node = index.nodes.get(NodeId(node_id))
            if node is None or node.host_slab != slab or node.parent is None:
                continue  # gone
            record = BlockStored(
                node.id, node.parent.id, node.lookup_hash, node.tokens, node.extra, slab, 0, node.inexact
            )
            stores.append(PendingStore(record, (slab,), (generations[slab],)))
        for snapshot_id, slabs in zip(opened.images, opened.image_slabs):
            snap = index.snapshots.get(SnapshotId(snapshot_id))
            if snap is None or snap.host_slabs != tuple(slabs):
                continue
            record = ImageStored(
                snap.id, snap.anchor.id, int(snap.kind), snap.tail_tokens, tuple(slabs), 0, snap.hits,
                snap.superseded, snap.inexact,
            )
            stores.append(PendingStore(record, tuple(slabs), tuple(generations[s] for s in slabs)))
            self._stored_snapshots.add(snap.id)
        for snapshot_id, slab in zip(opened.tails, opened.tail_slabs):
            snap = index.snapshots.get(SnapshotId(snapshot_id))
            if snap is None or snap.tail_host_slab != slab:
                continue
            stores.append(PendingStore(TailStored(snap.id, slab, 0), (slab,), (generations[slab],)))
        return stores

    def _node_host_dropped(self, event: ev.NodeHostDropped) -> list[ContentsRecord]:
        if NodeId(event.node) in self.index.nodes:
            return [BlockReleased(event.node)]
        return [NodeRemoved(event.node)]

    def _pinned_host_copies_dropped(self, event: ev.PinnedHostCopiesDropped) -> list[ContentsRecord]:
        """The host slabs were freed and the nodes stay (on the device): a restart must not find them."""
        return [BlockReleased(node) for node in event.nodes]

    def _block_made_exact(self, event: ev.BlockMadeExact) -> list[ContentsRecord]:
        """The node's inexact host copy was freed (its exact bytes are stored again when the host write
        of its new device copy lands): a restart must not find the old record."""
        return [BlockReleased(event.node)]

    def _subtree_deleted(self, event: ev.SubtreeDeleted) -> list[ContentsRecord]:
        return [NodeRemoved(event.node)]

    def _snapshot_removed(self, event: ev.SnapshotHostDropped | ev.SnapshotDeleted) -> list[ContentsRecord]:
        self._stored_snapshots.discard(event.snapshot)
        return [SnapshotRemoved(event.snapshot)]

    def _snapshot_state(
        self, event: ev.SnapshotHit | ev.SnapshotSuperseded | ev.SnapshotRetained
    ) -> list[ContentsRecord]:
        if event.snapshot not in self._stored_snapshots:
            return []
        snap = self.index.snapshots.get(SnapshotId(event.snapshot))
        if snap is None:
            return []
        return [SnapshotState(snap.id, snap.hits, snap.superseded)]
