"""PrefixIndex: the block tree, snapshots, device/host ledgers and LRU, mutated only by ``apply``.

``apply(event)`` checks the sequence number, validates the event against the current state, and only
then changes anything: a rejected event raises ``EventRejected`` and leaves the index (and its digest)
unchanged. Handlers live in ``index_lanes`` and ``index_snapshots`` (mixins); shared structural helpers
(LRU / dead-list refresh, subtree and snapshot removal) live here.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

from hybridcache.cache import events as ev
from hybridcache.cache.digest import state_bytes
from hybridcache.cache.errors import EventRejected
from hybridcache.cache.geometry import CacheGeometry
from hybridcache.cache.hashing import HASH_SEED
from hybridcache.cache.ids import ROOT_NODE, NodeId, SnapshotId
from hybridcache.cache.index_lanes import LaneHandlers
from hybridcache.cache.index_loaded import LoadedHandlers
from hybridcache.cache.index_snapshots import SnapshotHandlers
from hybridcache.cache.ledger import DevicePages, StateSlots
from hybridcache.cache.lru import DeviceLru
from hybridcache.cache.records import (
    LIVE_BELOW_CAP,
    BlockNode,
    HostWriteBatch,
    Lane,
    LaneId,
    LruList,
    PageOwnerKind,
    Residency,
    RestoreBatch,
    SlabOwnerKind,
    SlotRole,
    Snapshot,
)
from hybridcache.cache.slab_pool import HostSlabPool

# Enum members bound once: reading a member off its Enum class costs ~100 ns in CPython 3.11.
_RESIDENT, _FILLING = Residency.RESIDENT, Residency.FILLING
_NONE, _BACKED, _UNBACKED = LruList.NONE, LruList.BACKED, LruList.UNBACKED
_SLOT_FREE = SlotRole.FREE


class PrefixIndex(LaneHandlers, SnapshotHandlers, LoadedHandlers):
    """The whole logical cache state. Read freely; mutate only with ``apply``."""

    def __init__(self, geometry: CacheGeometry) -> None:
        self.geometry = geometry
        self.seq = 0
        self.checkpoints = 0  # Checkpoint events applied: the only events that leave cache_epoch alone
        self._digest_memo: tuple[tuple[int, int, int], int] | None = None  # see checkpoint_digest()
        self.gdsf_l = 0.0
        self.root = BlockNode(ROOT_NODE, None, HASH_SEED, (), 0)
        self.root.device_state = _RESIDENT
        self.nodes: dict[NodeId, BlockNode] = {ROOT_NODE: self.root}
        self.snapshots: dict[SnapshotId, Snapshot] = {}
        self.snapshot_by_key: dict[tuple[NodeId, tuple[int, ...]], Snapshot] = {}
        self.root_dependents: dict[SnapshotId, Snapshot] = {}
        self.next_node_id = 1
        self.next_snapshot_id = 0
        self.next_batch_id = 0
        self.lanes: dict[LaneId, Lane] = {}
        self.pages = DevicePages(geometry.num_pages)
        self.slots = StateSlots(geometry.max_concurrency, geometry.device_snapshot_slots)
        self.lru = DeviceLru()
        self.dead_nodes: dict[NodeId, BlockNode] = {}
        self.host: HostSlabPool | None = (
            HostSlabPool(geometry.slab_bytes, geometry.host_cache_bytes, geometry.chunk_bytes)
            if geometry.has_host_tier
            else None
        )
        self.slab_owners: dict[int, tuple[SlabOwnerKind, int]] = {}
        self.restores: dict[int, RestoreBatch] = {}
        self.host_writes: dict[int, HostWriteBatch] = {}
        self._handlers = {
            ev.Checkpoint: self._apply_checkpoint,
            ev.RestoreOpened: self._apply_restore_opened,
            ev.RestoreLanded: self._apply_restore_landed,
            ev.LaneStaged: self._apply_lane_staged,
            ev.LaneActivated: self._apply_lane_activated,
            ev.LanePagesGranted: self._apply_pages_granted,
            ev.LaneReleased: self._apply_lane_released,
            ev.BlockInserted: self._apply_block_inserted,
            ev.BlockAdopted: self._apply_block_adopted,
            ev.BlockDuplicated: self._apply_block_duplicated,
            ev.BlockMadeExact: self._apply_block_made_exact,
            ev.DeviceCopiesDropped: self._apply_device_copies_dropped,
            ev.SubtreeDeleted: self._apply_subtree_deleted,
            ev.NodeHostDropped: self._apply_node_host_dropped,
            ev.PinnedHostCopiesDropped: self._apply_pinned_host_copies_dropped,
            ev.TapTaken: self._apply_tap_taken,
            ev.TapDropped: self._apply_tap_dropped,
            ev.SnapshotPublished: self._apply_snapshot_published,
            ev.SnapshotHit: self._apply_snapshot_hit,
            ev.SnapshotSuperseded: self._apply_snapshot_superseded,
            ev.SnapshotRetained: self._apply_snapshot_retained,
            ev.SnapshotsValued: self._apply_snapshots_valued,
            ev.GdsfInflated: self._apply_gdsf_inflated,
            ev.SnapshotDeviceDropped: self._apply_snapshot_device_dropped,
            ev.SnapshotHostDropped: self._apply_snapshot_host_dropped,
            ev.SnapshotDeleted: self._apply_snapshot_deleted,
            ev.HostWriteOpened: self._apply_host_write_opened,
            ev.HostWriteLanded: self._apply_host_write_landed,
            ev.BlockLoaded: self._apply_block_loaded,
            ev.SnapshotLoaded: self._apply_snapshot_loaded,
        }

    # ------------------------------------------------------------------ the one mutator
    def apply(self, event: ev.CacheEvent) -> None:
        """Apply one event. Mutates. Raises EventRejected (index unchanged) when out of sequence or
        inconsistent with the current state."""
        seq = event.seq
        if seq != self.seq + 1:
            raise EventRejected(f"{type(event).__name__}: seq {seq} but the index is at {self.seq}")
        try:
            handler = self._handlers[type(event)]
        except KeyError:
            raise EventRejected(f"unknown event type {type(event).__name__}") from None
        handler(event)  # validates fully before its first mutation
        self.seq = seq

    @property
    def cache_epoch(self) -> int:
        """Bumps on every applied event but a Checkpoint (which changes nothing); quotes carry it. Pure."""
        return self.seq - self.checkpoints

    def _apply_checkpoint(self, event: ev.Checkpoint) -> None:
        if not 0 <= event.part < event.parts:
            raise EventRejected(f"Checkpoint at seq {event.seq}: part {event.part} of {event.parts}")
        if event.digest != self._checkpoint_state_digest(event.part, event.parts):
            raise EventRejected(f"Checkpoint at seq {event.seq}: digest differs from the index state")
        self.checkpoints += 1

    # ------------------------------------------------------------------ read helpers
    @property
    def tick(self) -> int:
        return self.seq

    @property
    def num_free_pages(self) -> int:
        return self.pages.num_free

    @property
    def num_evictable_pages(self) -> int:
        """Device pages the LRU can free: every listed entry owns exactly one page (§6.3)."""
        return len(self.lru)

    def node(self, node_id: int) -> BlockNode:
        """The node with this id. Raises EventRejected if absent."""
        node = self.nodes.get(node_id)  # type: ignore[call-overload]  # NodeId is an int
        if node is None:
            raise EventRejected(f"node {node_id} does not exist")
        return node

    def snapshot(self, snapshot_id: int) -> Snapshot:
        snap = self.snapshots.get(snapshot_id)  # type: ignore[call-overload]
        if snap is None:
            raise EventRejected(f"snapshot {snapshot_id} does not exist")
        return snap

    def lane(self, lane_id: int) -> Lane:
        lane = self.lanes.get(lane_id)  # type: ignore[call-overload]
        if lane is None:
            raise EventRejected(f"lane {lane_id} is not staged")
        return lane

    def _nodes_named(self, node_ids: tuple[int, ...]) -> list[BlockNode]:
        """The nodes with these ids, in order. Pure; raises EventRejected naming the first absent one."""
        found = list(map(self.nodes.get, node_ids))  # type: ignore[arg-type]
        if None in found:
            raise EventRejected(f"node {node_ids[found.index(None)]} does not exist")
        return found  # type: ignore[return-value]

    def _snapshots_named(self, snapshot_ids: tuple[int, ...]) -> list[Snapshot]:
        """The snapshots with these ids, in order. Pure; raises EventRejected naming the first absent one."""
        found = list(map(self.snapshots.get, snapshot_ids))  # type: ignore[arg-type]
        if None in found:
            raise EventRejected(f"snapshot {snapshot_ids[found.index(None)]} does not exist")
        return found  # type: ignore[return-value]

    def path_to(self, node: BlockNode) -> list[BlockNode]:
        """Nodes from block 0 to ``node`` (root excluded). Pure."""
        path: list[BlockNode] = []
        while node.parent is not None:
            path.append(node)
            node = node.parent
        path.reverse()
        return path

    # ------------------------------------------------------------------ derived membership
    def _refresh_node(self, node: BlockNode) -> None:
        """Bring ``node``'s LRU and dead-list membership in line with its fields. Mutates."""
        if node.parent is None:
            return
        want, dead = _NONE, False
        if not (node.active_refs or node.restore_pins):
            host_resident = node.host_state is _RESIDENT
            if node.device_state is _RESIDENT:
                want = _BACKED if host_resident else _UNBACKED
            dead = host_resident and node.live_snapshots_below == 0
        listed = node.lru_list
        if listed is not want:
            if listed is not _NONE:
                self.lru.remove(node)
            if want is not _NONE:
                self.lru.push_mru(node, want)
        if dead:
            self.dead_nodes[node.id] = node
        else:
            self.dead_nodes.pop(node.id, None)

    def _pin_active(self, node: BlockNode, tick: int) -> None:
        """active_refs + 1 (a lane maps the node): leaves the LRU and the dead list. Mutates."""
        refs = node.active_refs = node.active_refs + 1
        node.last_access_tick = tick
        if refs == 1 and node.restore_pins == 0:
            if node.lru_list is not _NONE:
                self.lru.remove(node)
            if node.host_state is _RESIDENT:
                self.dead_nodes.pop(node.id, None)

    def _refresh_tail(self, snap: Snapshot) -> None:
        """Bring the snapshot tail's LRU membership in line with its fields. Mutates."""
        want = _NONE
        if snap.tail_device_state is _RESIDENT and snap.restore_pins == 0:
            want = _BACKED if snap.tail_host_state is _RESIDENT else _UNBACKED
        listed = snap.lru_list
        if listed is not want:
            if listed is not _NONE:
                self.lru.remove(snap)
            if want is not _NONE:
                self.lru.push_mru(snap, want)

    def _adjust_live_below(self, anchor: BlockNode, delta: int) -> None:
        """A snapshot anchored at ``anchor`` is added (``delta`` +1) or removed (-1): live_snapshots_below
        moves by ``delta`` from ``anchor`` up while the capped value of the node below changed (see
        ``BlockNode.live_snapshots_below``); a node whose count crosses 0 <-> 1 moves on or off the dead
        list. Mutates."""
        node: BlockNode | None = anchor
        refresh, cap = self._refresh_node, LIVE_BELOW_CAP
        while node is not None:
            live = node.live_snapshots_below
            moved = node.live_snapshots_below = live + delta
            if not live or not moved:  # one of them is 0: the node crossed the 0 <-> 1 edge
                refresh(node)
            if live >= cap and moved >= cap:  # its capped value stayed: nothing changes above
                break
            node = node.parent

    # ------------------------------------------------------------------ structural removal
    def _subtree(self, top: BlockNode) -> list[BlockNode]:
        out, stack = [], [top]
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.iter_children())
        return out

    def _check_subtree_removable(self, top: BlockNode, what: str) -> list[BlockNode]:
        if top.parent is None:
            raise EventRejected(f"{what}: the root is never deleted")
        nodes = self._subtree(top)
        for node in nodes:
            if node.pinned or node.device_state == _FILLING or node.host_state == _FILLING:
                raise EventRejected(f"{what}: node {node.id} in the subtree of {top.id} is pinned or filling")
            for snap in node.snapshots:
                self._check_snapshot_removable(snap, what)
        return nodes

    def _check_snapshot_removable(self, snap: Snapshot, what: str) -> None:
        if snap.restore_pins > 0:
            raise EventRejected(f"{what}: snapshot {snap.id} is pinned by a transfer or an admission")
        filling = (snap.device_state, snap.host_state, snap.tail_device_state, snap.tail_host_state)
        if _FILLING in filling:
            raise EventRejected(f"{what}: snapshot {snap.id} has a copy in flight")

    def _delete_subtree(self, top: BlockNode) -> None:
        """Remove ``top``, its subtree and their snapshots (§9.4). Mutates; caller validated."""
        nodes = self._subtree(top)
        for node in nodes:
            for snap in node.snapshots:  # a tuple: removal replaces it, this loop keeps the old one
                self._remove_snapshot(snap)
        parent = top.parent
        assert parent is not None
        parent.remove_child(top)
        for node in nodes:
            self.lru.remove(node)
            self.dead_nodes.pop(node.id, None)
            if node.device_page is not None:
                self.pages.release(node.device_page)
            if node.host_slab is not None:
                self._release_slabs((node.host_slab,))
            del self.nodes[node.id]
        self._refresh_node(parent)

    def _remove_snapshot(self, snap: Snapshot) -> None:
        """Delete a snapshot with every copy it has. Mutates; caller validated."""
        self.lru.remove(snap)
        if snap.tail_device_page is not None:
            self.pages.release(snap.tail_device_page)
        if snap.tail_host_slab is not None:
            self._release_slabs((snap.tail_host_slab,))
        if snap.host_slabs:
            self._release_slabs(snap.host_slabs)
        if snap.device_slot is not None:
            self.slots.set_role(snap.device_slot, _SLOT_FREE, None)
        anchor = snap.anchor
        anchor.snapshots = tuple(other for other in anchor.snapshots if other is not snap)
        del self.snapshot_by_key[(anchor.id, snap.tail_tokens)]
        del self.snapshots[snap.id]
        self._unlink_ancestry(snap)
        self._adjust_live_below(snap.anchor, -1)

    def _take_slabs(self, slabs: tuple[int, ...], kind: SlabOwnerKind, owner: int) -> None:
        assert self.host is not None
        self.host.take(list(slabs))
        for slab in slabs:
            self.slab_owners[slab] = (kind, owner)

    def _release_slabs(self, slabs: tuple[int, ...]) -> None:
        assert self.host is not None
        self.host.release(list(slabs))
        for slab in slabs:
            del self.slab_owners[slab]

    def _take_free_slabs(self, slabs: Sequence[int], what: str) -> None:
        """Take ``slabs`` from the host pool, all or nothing. Mutates only on success; raises
        EventRejected (nothing taken) when there is no host tier or a slab is repeated, out of range or
        not free. The owners are the caller's to record."""
        if self.host is None:
            raise EventRejected(f"{what}: there is no host tier")
        try:
            self.host.take(slabs)
        except ValueError as error:
            raise EventRejected(f"{what}: {error}") from None

    def _check_free_slabs(self, slabs: tuple[int, ...], what: str) -> None:
        if self.host is None:
            raise EventRejected(f"{what}: there is no host tier")
        if len(set(slabs)) != len(slabs):
            raise EventRejected(f"{what}: a slab is named twice")
        for slab in slabs:
            if slab < 0 or slab >= self.host.num_slabs or not self.host.is_free(slab):
                raise EventRejected(f"{what}: slab {slab} is not free")

    def _check_free_pages(self, pages: tuple[int, ...], what: str) -> None:
        """Every page is in range, free and named once. Pure; raises EventRejected naming the first bad."""
        if len(pages) > 1 and len(set(pages)) != len(pages):
            raise EventRejected(f"{what}: a page is named twice")
        owners = self.pages.owners
        count = len(owners)
        for page in pages:
            if not 0 <= page < count or owners[page] is not None:
                raise EventRejected(f"{what}: page {page} is not free")

    # ------------------------------------------------------------------ digest
    def digest(self, part: int = 0, parts: int = 1) -> int:
        """A stable 64-bit hash of slice ``part`` of ``parts`` of the logical state (the whole state by
        default; replay checks). Pure."""
        return int.from_bytes(
            hashlib.blake2b(state_bytes(self, part, parts), digest_size=8).digest(), "little"
        )

    def checkpoint_digest(self, part: int = 0, parts: int = 1) -> int:
        """``digest(part, parts)``, remembered for the Checkpoint event about to be applied at this
        ``seq``, so the live index digests each slice once (replay has no memo and recomputes).
        Mutates only the memo."""
        value = self.digest(part, parts)
        self._digest_memo = ((self.seq, part, parts), value)
        return value

    def _checkpoint_state_digest(self, part: int, parts: int) -> int:
        memo, self._digest_memo = self._digest_memo, None
        if memo is not None and memo[0] == (self.seq, part, parts):
            return memo[1]
        return self.digest(part, parts)


__all__ = ["EventRejected", "PageOwnerKind", "PrefixIndex"]
