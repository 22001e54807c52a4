"""apply() handlers for lanes, blocks, restores, write-through and device/host copies of nodes.

Each handler validates everything first (raising EventRejected) and mutates only afterwards. Mixed into
``PrefixIndex``; the attributes it uses are declared there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybridcache.cache import events as ev
from hybridcache.cache.errors import EventRejected
from hybridcache.cache.ids import BLOCK_TOKENS, NodeId, PageId, SlotId
from hybridcache.cache.records import (
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
)

if TYPE_CHECKING:
    from hybridcache.cache.index import PrefixIndex

    _Base = PrefixIndex
else:
    _Base = object


class LaneHandlers(_Base):
    # ------------------------------------------------------------------ staging and restores
    def _apply_lane_staged(self, e: ev.LaneStaged) -> None:
        if LaneId(e.lane) in self.lanes:
            raise EventRejected(f"LaneStaged: lane {e.lane} is already staged")
        if not 0 <= e.slot < len(self.slots.roles) or self.slots.roles[e.slot] != SlotRole.FREE:
            raise EventRejected(f"LaneStaged: slot {e.slot} is not free")
        if not self.slots.can_add_active():
            raise EventRejected("LaneStaged: every active slot is in use")
        if not e.enabled and (e.path or e.snapshot is not None):
            raise EventRejected("LaneStaged: a disabled lane starts from the root")
        if len(e.path) != e.base // BLOCK_TOKENS:
            raise EventRejected(f"LaneStaged: base {e.base} needs {e.base // BLOCK_TOKENS} path blocks")
        nodes = self.nodes
        path = [nodes.get(n) for n in e.path]  # type: ignore[call-overload]
        parent = self.root
        resident = Residency.RESIDENT
        for node_id, node in zip(e.path, path):
            if node is None or node.parent is not parent:
                raise EventRejected(f"LaneStaged: node {node_id} is missing or does not continue the path")
            if node.device_page is None and node.host_state is not resident:
                raise EventRejected(f"LaneStaged: node {node.id} has no usable copy")
            parent = node
        source = None
        if e.snapshot is not None:
            source = self.snapshot(e.snapshot)
            if source.anchor is not parent or source.frontier != e.base:
                raise EventRejected(f"LaneStaged: snapshot {e.snapshot} is not at the end of the path")
        elif e.base != 0:
            raise EventRejected("LaneStaged: a nonzero base needs a snapshot")
        self._check_free_pages(e.private_pages, "LaneStaged")
        lane = Lane(LaneId(e.lane), e.enabled, SlotId(e.slot), e.base)
        self.lanes[lane.id] = lane
        self.slots.set_role(e.slot, SlotRole.ACTIVE, e.lane)
        lru_remove, dead_pop, seq = self.lru.remove, self.dead_nodes.pop, e.seq
        for node in path:  # the hot loop of admission: _pin_active inlined
            refs = node.active_refs = node.active_refs + 1
            node.last_access_tick = seq
            if refs == 1 and node.restore_pins == 0:
                lru_remove(node)
                dead_pop(node.id, None)
        lane.path = path
        self._grant_pages(lane, e.private_pages)
        if source is not None:
            source.restore_pins += 1
            self._refresh_tail(source)
            lane.source = source
            lane.resumed_from = source.id

    def _grant_pages(self, lane: Lane, pages: tuple[int, ...]) -> None:
        for page in pages:
            self.pages.assign(page, PageOwnerKind.LANE, lane.id)
            lane.table.append(PageId(page))
            lane.private[PageId(page)] = None

    def _apply_restore_opened(self, e: ev.RestoreOpened) -> None:
        self._check_new_batch(e.batch, "RestoreOpened")
        lane = self.lane(e.lane) if e.lane is not None else None
        if len(e.nodes) != len(e.pages):
            raise EventRejected("RestoreOpened: one destination page per node")
        nodes = [self.node(n) for n in e.nodes]
        for node in nodes:
            if node.device_state != Residency.ABSENT or node.host_state != Residency.RESIDENT:
                raise EventRejected(f"RestoreOpened: node {node.id} is not host-only")
            if lane is not None and (node.depth >= len(lane.path) or lane.path[node.depth] is not node):
                raise EventRejected(f"RestoreOpened: node {node.id} is not on lane {e.lane}'s path")
        pages = e.pages + ((e.tail_page,) if e.tail_page is not None else ())
        self._check_free_pages(pages, "RestoreOpened")
        snap = None
        if e.snapshot is not None:
            snap = self.snapshot(e.snapshot)
            if lane is None or lane.source is not snap:
                raise EventRejected("RestoreOpened: a snapshot is restored only into the lane staged from it")
        if (e.tail_page is not None or e.image) and snap is None:
            raise EventRejected("RestoreOpened: a tail or image restore names its snapshot")
        if e.tail_page is not None:
            assert snap is not None
            if snap.tail_device_state != Residency.ABSENT or snap.tail_host_state != Residency.RESIDENT:
                raise EventRejected(f"RestoreOpened: snapshot {snap.id}'s tail is not host-only")
        if e.image:
            assert snap is not None
            if snap.host_state != Residency.RESIDENT:
                raise EventRejected(f"RestoreOpened: snapshot {snap.id}'s image is not on the host")
        self.next_batch_id = max(self.next_batch_id, e.batch + 1)
        for node, page in zip(nodes, e.pages):
            self.pages.assign(page, PageOwnerKind.NODE, node.id)
            node.device_page = PageId(page)
            node.device_state = Residency.FILLING
            node.restore_pins += 1
            self._refresh_node(node)
        if snap is not None:
            snap.restore_pins += 1
            if e.tail_page is not None:
                self.pages.assign(e.tail_page, PageOwnerKind.TAIL, snap.id)
                snap.tail_device_page = PageId(e.tail_page)
                snap.tail_device_state = Residency.FILLING
            self._refresh_tail(snap)
        batch_lane = None if lane is None else lane.id
        self.restores[e.batch] = RestoreBatch(batch_lane, nodes, snap, e.tail_page is not None, e.image)

    def _check_new_batch(self, batch: int, what: str) -> None:
        if batch < 0 or batch in self.restores or batch in self.host_writes:
            raise EventRejected(f"{what}: batch id {batch} is in use")

    def _apply_restore_landed(self, e: ev.RestoreLanded) -> None:
        batch = self.restores.get(e.batch)
        if batch is None:
            raise EventRejected(f"RestoreLanded: no restore batch {e.batch}")
        del self.restores[e.batch]
        for node in batch.nodes:
            node.device_state = Residency.RESIDENT
            node.restore_pins -= 1
            self._refresh_node(node)
        snap = batch.snapshot
        if snap is not None:
            if batch.tail:
                snap.tail_device_state = Residency.RESIDENT
            snap.restore_pins -= 1
            self._refresh_tail(snap)

    def _apply_lane_activated(self, e: ev.LaneActivated) -> None:
        lane = self.lane(e.lane)
        if lane.activated:
            raise EventRejected(f"LaneActivated: lane {e.lane} is already active")
        for node in lane.path:
            if node.device_page is None:
                raise EventRejected(f"LaneActivated: path node {node.id} has no device page")
        lane.activated = True
        self._drop_source_pin(lane)

    def _drop_source_pin(self, lane: Lane) -> None:
        if lane.source is not None:
            lane.source.restore_pins -= 1
            self._refresh_tail(lane.source)
            lane.source = None

    def _apply_pages_granted(self, e: ev.LanePagesGranted) -> None:
        lane = self.lane(e.lane)
        self._check_free_pages(e.pages, "LanePagesGranted")
        self._grant_pages(lane, e.pages)

    def _apply_lane_released(self, e: ev.LaneReleased) -> None:
        lane = self.lane(e.lane)
        for tap in lane.pending_taps.values():
            self.slots.set_role(tap.slot, SlotRole.FREE, None)
        if lane.slot is not None:
            self.slots.set_role(lane.slot, SlotRole.FREE, None)
        self._drop_source_pin(lane)
        for page in lane.private:
            self.pages.release(page)
        refresh = self._refresh_node
        for node in reversed(lane.path):  # deepest first: joins the MRU end first, evicted first
            node.active_refs -= 1
            if node.active_refs == 0 and node.restore_pins == 0:
                refresh(node)
        for batch in self.restores.values():
            if batch.lane == lane.id:
                batch.lane = None
        del self.lanes[lane.id]

    # ------------------------------------------------------------------ block commit (§7.6)
    def _committing(self, lane_id: int, what: str) -> tuple[Lane, BlockNode, PageId]:
        lane = self.lane(lane_id)
        if not lane.enabled:
            raise EventRejected(f"{what}: lane {lane_id} is disabled (no prefix reuse)")
        if not lane.activated:
            raise EventRejected(f"{what}: lane {lane_id} is not active")
        block = len(lane.path)
        index = block - lane.base // BLOCK_TOKENS
        if index >= len(lane.table):
            raise EventRejected(f"{what}: lane {lane_id} has no page for block {block}")
        parent = lane.path[-1] if lane.path else self.root
        return lane, parent, lane.table[index]

    def _apply_block_inserted(self, e: ev.BlockInserted) -> None:
        lane, parent, page = self._committing(e.lane, "BlockInserted")
        if e.node <= 0 or NodeId(e.node) in self.nodes:
            raise EventRejected(f"BlockInserted: node id {e.node} is in use")
        if len(e.tokens) != BLOCK_TOKENS:
            raise EventRejected(f"BlockInserted: {len(e.tokens)} tokens, a block has {BLOCK_TOKENS}")
        if page not in lane.private:
            raise EventRejected(f"BlockInserted: page {page} is not private to lane {e.lane}")
        if parent.child(e.lookup_hash, e.tokens, e.extra) is not None:
            raise EventRejected(f"BlockInserted: node {parent.id} already has this child")
        node = BlockNode(NodeId(e.node), parent, e.lookup_hash, tuple(e.tokens), e.extra)
        parent.children.setdefault(e.lookup_hash, []).append(node)
        self.nodes[node.id] = node
        self.next_node_id = max(self.next_node_id, e.node + 1)
        del lane.private[page]
        self.pages.transfer(page, PageOwnerKind.NODE, node.id)
        node.device_page = page
        node.device_state = Residency.RESIDENT
        self._extend_path(lane, node, e.seq)

    def _extend_path(self, lane: Lane, node: BlockNode, tick: int) -> None:
        self._pin_active(node, tick)
        lane.path.append(node)
        self._refresh_node(node)

    def _existing_child(self, parent: BlockNode, node_id: int, what: str) -> BlockNode:
        node = self.node(node_id)
        if node.parent is not parent:
            raise EventRejected(f"{what}: node {node_id} is not a child of node {parent.id}")
        return node

    def _apply_block_adopted(self, e: ev.BlockAdopted) -> None:
        lane, parent, page = self._committing(e.lane, "BlockAdopted")
        node = self._existing_child(parent, e.node, "BlockAdopted")
        if node.device_state != Residency.ABSENT or node.host_state != Residency.RESIDENT:
            raise EventRejected(f"BlockAdopted: node {e.node} is not host-only")
        if page not in lane.private:
            raise EventRejected(f"BlockAdopted: page {page} is not private to lane {e.lane}")
        del lane.private[page]
        self.pages.transfer(page, PageOwnerKind.NODE, node.id)
        node.device_page = page
        node.device_state = Residency.RESIDENT
        self._extend_path(lane, node, e.seq)

    def _apply_block_duplicated(self, e: ev.BlockDuplicated) -> None:
        lane, parent, _page = self._committing(e.lane, "BlockDuplicated")
        node = self._existing_child(parent, e.node, "BlockDuplicated")
        if node.device_state == Residency.ABSENT:
            raise EventRejected(f"BlockDuplicated: node {e.node} has no device copy (adopt instead)")
        self._extend_path(lane, node, e.seq)

    # ------------------------------------------------------------------ eviction of node copies
    def _apply_device_copies_dropped(self, e: ev.DeviceCopiesDropped) -> None:
        nodes = [self.node(n) for n in e.nodes]
        tails = [self.snapshot(s) for s in e.tails]
        if len({n.id for n in nodes}) != len(nodes) or len({s.id for s in tails}) != len(tails):
            raise EventRejected("DeviceCopiesDropped: an entry is named twice")
        for entry in (*nodes, *tails):
            if entry.lru_list != LruList.BACKED:
                raise EventRejected(f"DeviceCopiesDropped: {entry.id} is not a host-backed LRU entry")
        for node in nodes:
            assert node.device_page is not None
            self.pages.release(node.device_page)
            node.device_page = None
            node.device_state = Residency.ABSENT
            self._refresh_node(node)
        for snap in tails:
            assert snap.tail_device_page is not None
            self.pages.release(snap.tail_device_page)
            snap.tail_device_page = None
            snap.tail_device_state = Residency.ABSENT
            self._refresh_tail(snap)

    def _apply_subtree_deleted(self, e: ev.SubtreeDeleted) -> None:
        top = self.node(e.node)
        self._check_subtree_removable(top, "SubtreeDeleted")
        self._delete_subtree(top)

    def _apply_node_host_dropped(self, e: ev.NodeHostDropped) -> None:
        node = self.node(e.node)
        if NodeId(e.node) not in self.dead_nodes:
            raise EventRejected(f"NodeHostDropped: node {e.node} is not dead KV")
        if node.device_state == Residency.ABSENT:
            self._check_subtree_removable(node, "NodeHostDropped")
            self._delete_subtree(node)
            return
        assert node.host_slab is not None
        self._release_slabs((node.host_slab,))
        node.host_slab = None
        node.host_state = Residency.ABSENT
        self._refresh_node(node)

    # ------------------------------------------------------------------ write-through
    def _apply_host_write_opened(self, e: ev.HostWriteOpened) -> None:
        self._check_new_batch(e.batch, "HostWriteOpened")
        nodes = [self.node(n) for n in e.nodes]
        images = [self.snapshot(s) for s in e.images]
        tails = [self.snapshot(s) for s in e.tails]
        if (
            len(e.node_slabs) != len(nodes)
            or len(e.image_slabs) != len(images)
            or len(e.tail_slabs) != len(tails)
        ):
            raise EventRejected("HostWriteOpened: one slab (or slab list) per entry")
        all_slabs = (*e.node_slabs, *(s for group in e.image_slabs for s in group), *e.tail_slabs)
        self._check_free_slabs(all_slabs, "HostWriteOpened")
        if len({n.id for n in nodes}) != len(nodes) or len({s.id for s in images}) != len(images):
            raise EventRejected("HostWriteOpened: an entry is named twice")
        for node in nodes:
            if node.device_state != Residency.RESIDENT or node.host_state != Residency.ABSENT:
                raise EventRejected(f"HostWriteOpened: node {node.id} is not device-only")
        for snap, group in zip(images, e.image_slabs):
            if snap.device_state != Residency.RESIDENT or snap.host_state != Residency.ABSENT:
                raise EventRejected(f"HostWriteOpened: snapshot {snap.id}'s image is not device-only")
            if len(group) != self.geometry.image_slabs:
                raise EventRejected(f"HostWriteOpened: an image takes {self.geometry.image_slabs} slabs")
        for snap in tails:
            if snap.tail_device_state != Residency.RESIDENT or snap.tail_host_state != Residency.ABSENT:
                raise EventRejected(f"HostWriteOpened: snapshot {snap.id}'s tail is not device-only")
        self.next_batch_id = max(self.next_batch_id, e.batch + 1)
        for node, slab in zip(nodes, e.node_slabs):
            self._take_slabs((slab,), SlabOwnerKind.NODE, node.id)
            node.host_slab = slab
            node.host_state = Residency.FILLING
            node.restore_pins += 1
            self._refresh_node(node)
        for snap, group in zip(images, e.image_slabs):
            self._take_slabs(group, SlabOwnerKind.IMAGE, snap.id)
            snap.host_slabs = tuple(group)
            snap.host_state = Residency.FILLING
            snap.restore_pins += 1
        for snap, slab in zip(tails, e.tail_slabs):
            self._take_slabs((slab,), SlabOwnerKind.TAIL, snap.id)
            snap.tail_host_slab = slab
            snap.tail_host_state = Residency.FILLING
            snap.restore_pins += 1
            self._refresh_tail(snap)
        self.host_writes[e.batch] = HostWriteBatch(nodes, images, tails)

    def _apply_host_write_landed(self, e: ev.HostWriteLanded) -> None:
        batch = self.host_writes.get(e.batch)
        if batch is None:
            raise EventRejected(f"HostWriteLanded: no write batch {e.batch}")
        del self.host_writes[e.batch]
        for node in batch.nodes:
            node.host_state = Residency.RESIDENT
            node.restore_pins -= 1
            self._refresh_node(node)
        for snap in batch.images:
            snap.host_state = Residency.RESIDENT
            snap.restore_pins -= 1
            self._refresh_tail(snap)
        for snap in batch.tails:
            snap.tail_host_state = Residency.RESIDENT
            snap.restore_pins -= 1
            self._refresh_tail(snap)
