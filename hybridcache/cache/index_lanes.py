"""apply() handlers for lanes, blocks, restores, write-through and device/host copies of nodes.

Each handler validates everything first (raising EventRejected) and mutates only afterwards. Mixed into
``PrefixIndex``; the attributes it uses are declared there.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybridcache.cache import events as ev
from hybridcache.cache.errors import EventRejected
from hybridcache.cache.ids import BLOCK_TOKENS, NodeId, PageId, SlotId
from hybridcache.cache.lru import spans_without
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


# Enum members bound once: reading a member off its Enum class costs ~100 ns in CPython 3.11.
_ABSENT = Residency.ABSENT
_RESIDENT = Residency.RESIDENT
_FILLING = Residency.FILLING
_SLOT_FREE = SlotRole.FREE
_SLOT_ACTIVE = SlotRole.ACTIVE
_BACKED = LruList.BACKED
_PAGE_LANE = PageOwnerKind.LANE
_PAGE_NODE = PageOwnerKind.NODE
_PAGE_TAIL = PageOwnerKind.TAIL
_SLAB_NODE = SlabOwnerKind.NODE
_SLAB_IMAGE = SlabOwnerKind.IMAGE
_SLAB_TAIL = SlabOwnerKind.TAIL


def _named_twice(ids: tuple[int, ...]) -> bool:
    return len(ids) > 1 and len(set(ids)) != len(ids)


class LaneHandlers(_Base):
    # ------------------------------------------------------------------ staging and restores
    def _apply_lane_staged(self, e: ev.LaneStaged) -> None:
        if LaneId(e.lane) in self.lanes:
            raise EventRejected(f"LaneStaged: lane {e.lane} is already staged")
        if not 0 <= e.slot < len(self.slots.roles) or self.slots.roles[e.slot] != _SLOT_FREE:
            raise EventRejected(f"LaneStaged: slot {e.slot} is not free")
        if not self.slots.can_add_active():
            raise EventRejected("LaneStaged: every active slot is in use")
        if not e.enabled and (e.path_end is not None or e.snapshot is not None):
            raise EventRejected("LaneStaged: a disabled lane starts from the root")
        blocks = e.base // BLOCK_TOKENS
        end = self._path_end(e.path_end, blocks, e.base)
        source = None
        if e.snapshot is not None:
            source = self.snapshot(e.snapshot)
            if source.anchor is not (end or self.root) or source.frontier != e.base:
                raise EventRejected(f"LaneStaged: snapshot {e.snapshot} is not at the end of the path")
        elif e.base != 0:
            raise EventRejected("LaneStaged: a nonzero base needs a snapshot")
        if e.private_pages:
            self._check_free_pages(e.private_pages, "LaneStaged")
        lane = Lane(LaneId(e.lane), e.enabled, SlotId(e.slot), e.base)
        self.lanes[lane.id] = lane
        self.slots.set_role(e.slot, _SLOT_ACTIVE, e.lane)
        lane.path = self.lru.pin_chain(
            end, blocks, e.seq, self.dead_nodes, lane.unlisted_when_staged, lane.backed_spans
        )
        if e.private_pages:
            self._grant_pages(lane, e.private_pages)
        if source is not None:
            source.restore_pins += 1
            self._refresh_tail(source)
            lane.source = source
            lane.resumed_from = source.id

    def _path_end(self, node_id: int | None, blocks: int, base: int) -> BlockNode | None:
        """The deepest node of a staged path of ``blocks`` blocks (None for an empty path). Pure; raises
        EventRejected when it is missing or ends a path of another length.

        Every node in the tree has a device or a host copy (§9.4: a node that loses its last copy is
        deleted; ``check_integrity`` verifies it), so existing is enough to be usable; a node at depth
        ``blocks - 1`` has exactly ``blocks - 1`` ancestors below the root, so the depth checks the length.
        """
        if node_id is None:
            if blocks:
                raise EventRejected(f"LaneStaged: base {base} needs {blocks} path blocks, the path is empty")
            return None
        node = self.nodes.get(node_id)  # type: ignore[call-overload]  # NodeId is an int
        if node is None or node.parent is None:
            raise EventRejected(f"LaneStaged: path end {node_id} is not a block of the tree")
        if node.depth != blocks - 1:
            raise EventRejected(
                f"LaneStaged: base {base} needs {blocks} path blocks, node {node_id} ends {node.depth + 1}"
            )
        return node

    def _grant_pages(self, lane: Lane, pages: tuple[int, ...]) -> None:
        """Free pages become the lane's private pages, appended to its block table. Mutates."""
        self.pages.assign_run(pages, _PAGE_LANE, lane.id)
        lane.table.extend(pages)  # type: ignore[arg-type]  # PageId is an int
        lane.private.update(dict.fromkeys(pages))  # type: ignore[arg-type]

    def _apply_restore_opened(self, e: ev.RestoreOpened) -> None:
        self._check_new_batch(e.batch, "RestoreOpened")
        lane = self.lane(e.lane) if e.lane is not None else None
        if len(e.nodes) != len(e.pages):
            raise EventRejected("RestoreOpened: one destination page per node")
        nodes = self._nodes_named(e.nodes) if e.nodes else []
        if _named_twice(e.nodes):
            raise EventRejected("RestoreOpened: a node is named twice")
        absent, resident = _ABSENT, _RESIDENT
        path = None if lane is None else lane.path
        for node in nodes:
            if node.device_state is not absent or node.host_state is not resident:
                raise EventRejected(f"RestoreOpened: node {node.id} is not host-only")
            if path is not None and (node.depth >= len(path) or path[node.depth] is not node):
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
            if snap.tail_device_state != _ABSENT or snap.tail_host_state != _RESIDENT:
                raise EventRejected(f"RestoreOpened: snapshot {snap.id}'s tail is not host-only")
        if e.image:
            assert snap is not None
            if snap.host_state != _RESIDENT:
                raise EventRejected(f"RestoreOpened: snapshot {snap.id}'s image is not on the host")
        self.next_batch_id = max(self.next_batch_id, e.batch + 1)
        assign, unlist_dead, filling = self.pages.assign, self.dead_nodes.pop, _FILLING
        for node, page in zip(nodes, e.pages):
            assign(page, _PAGE_NODE, node.id)
            node.device_page = page  # type: ignore[assignment]  # PageId is an int
            node.device_state = filling
            node.restore_pins += 1
            unlist_dead(node.id, None)  # pinned now; device ABSENT before, so it was on no LRU list
        if snap is not None:
            snap.restore_pins += 1
            if e.tail_page is not None:
                self.pages.assign(e.tail_page, _PAGE_TAIL, snap.id)
                snap.tail_device_page = PageId(e.tail_page)
                snap.tail_device_state = _FILLING
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
        resident, refresh = _RESIDENT, self._refresh_node
        for node in batch.nodes:
            node.device_state = resident
            pins = node.restore_pins = node.restore_pins - 1
            if pins or node.active_refs:  # still pinned: stays on no list and off the dead list
                continue
            refresh(node)
        snap = batch.snapshot
        if snap is not None:
            if batch.tail:
                snap.tail_device_state = _RESIDENT
            snap.restore_pins -= 1
            self._refresh_tail(snap)

    def _apply_lane_activated(self, e: ev.LaneActivated) -> None:
        lane = self.lane(e.lane)
        if lane.activated:
            raise EventRejected(f"LaneActivated: lane {e.lane} is already active")
        for node in reversed(lane.unlisted_when_staged):  # in block order: name the first one
            if node.device_page is None:
                raise EventRejected(f"LaneActivated: path node {node.id} has no device page")
        lane.activated = True
        lane.unlisted_when_staged = []
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
            self.slots.set_role(tap.slot, _SLOT_FREE, None)
        if lane.slot is not None:
            self.slots.set_role(lane.slot, _SLOT_FREE, None)
        self._drop_source_pin(lane)
        release = self.pages.release
        for page in lane.private:
            release(page)
        self.lru.unpin_path(lane.path, self.dead_nodes, lane.backed_spans)
        for batch in self.restores.values():
            if batch.lane == lane.id:
                batch.lane = None
        del self.lanes[lane.id]

    # ------------------------------------------------------------------ block commit (§7.6)
    def _committing(self, lane_id: int, what: str) -> tuple[Lane, BlockNode, PageId]:
        lane = self.lanes.get(lane_id)  # type: ignore[call-overload]  # self.lane(), inlined: once per block
        if lane is None:
            raise EventRejected(f"lane {lane_id} is not staged")
        if not lane.enabled:
            raise EventRejected(f"{what}: lane {lane_id} is disabled (no prefix reuse)")
        if not lane.activated:
            raise EventRejected(f"{what}: lane {lane_id} is not active")
        path = lane.path
        block = len(path)
        index = block - lane.base // BLOCK_TOKENS
        if index >= len(lane.table):
            raise EventRejected(f"{what}: lane {lane_id} has no page for block {block}")
        return lane, path[-1] if path else self.root, lane.table[index]

    def _apply_block_inserted(self, e: ev.BlockInserted) -> None:
        lane, parent, page = self._committing(e.lane, "BlockInserted")
        node_id, tokens, lookup_hash = e.node, tuple(e.tokens), e.lookup_hash
        if node_id <= 0 or node_id in self.nodes:
            raise EventRejected(f"BlockInserted: node id {node_id} is in use")
        if len(tokens) != BLOCK_TOKENS:
            raise EventRejected(f"BlockInserted: {len(tokens)} tokens, a block has {BLOCK_TOKENS}")
        if page not in lane.private:
            raise EventRejected(f"BlockInserted: page {page} is not private to lane {e.lane}")
        children = parent.children
        siblings = children.get(lookup_hash)
        if siblings is not None and parent.child(lookup_hash, tokens, e.extra) is not None:
            raise EventRejected(f"BlockInserted: node {parent.id} already has this child")
        node = BlockNode(node_id, parent, lookup_hash, tokens, e.extra)  # type: ignore[arg-type]
        if siblings is None:
            children[lookup_hash] = node  # ``BlockNode.add_child``, inlined: once per block
        else:
            parent.add_child(node)
        self.nodes[node.id] = node
        if node_id >= self.next_node_id:
            self.next_node_id = node_id + 1
        del lane.private[page]
        self.pages.owners[page] = (_PAGE_NODE, node_id)  # DevicePages.transfer, inlined: once per block
        node.device_page = page
        node.device_state = _RESIDENT
        node.inexact = e.inexact
        node.active_refs = 1  # pinned by the lane from birth: never on the LRU or the dead list
        node.last_access_tick = e.seq
        lane.path.append(node)

    def _extend_path(self, lane: Lane, node: BlockNode, tick: int) -> None:
        """The lane pins an existing node as its next block (it leaves the LRU and dead list). Mutates."""
        self._pin_active(node, tick)
        lane.path.append(node)

    def _existing_child(self, parent: BlockNode, node_id: int, what: str) -> BlockNode:
        node = self.node(node_id)
        if node.parent is not parent:
            raise EventRejected(f"{what}: node {node_id} is not a child of node {parent.id}")
        return node

    def _apply_block_adopted(self, e: ev.BlockAdopted) -> None:
        lane, parent, page = self._committing(e.lane, "BlockAdopted")
        node = self._existing_child(parent, e.node, "BlockAdopted")
        if node.device_state != _ABSENT or node.host_state != _RESIDENT:
            raise EventRejected(f"BlockAdopted: node {e.node} is not host-only")
        if page not in lane.private:
            raise EventRejected(f"BlockAdopted: page {page} is not private to lane {e.lane}")
        del lane.private[page]
        self.pages.transfer(page, _PAGE_NODE, node.id)
        node.device_page = page
        node.device_state = _RESIDENT
        self._extend_path(lane, node, e.seq)

    def _apply_block_duplicated(self, e: ev.BlockDuplicated) -> None:
        lane, parent, _page = self._committing(e.lane, "BlockDuplicated")
        node = self._existing_child(parent, e.node, "BlockDuplicated")
        if node.device_state == _ABSENT:
            raise EventRejected(f"BlockDuplicated: node {e.node} has no device copy (adopt instead)")
        self._extend_path(lane, node, e.seq)

    def _apply_block_made_exact(self, e: ev.BlockMadeExact) -> None:
        lane, parent, page = self._committing(e.lane, "BlockMadeExact")
        node = self._existing_child(parent, e.node, "BlockMadeExact")
        if not node.inexact:
            raise EventRejected(f"BlockMadeExact: node {e.node} is exact already")
        if node.active_refs or node.restore_pins:
            raise EventRejected(f"BlockMadeExact: node {e.node} is pinned (mapped or being copied)")
        if page not in lane.private:
            raise EventRejected(f"BlockMadeExact: page {page} is not private to lane {e.lane}")
        if node.lru_list is not LruList.NONE:
            self.lru.remove(node)
        self.dead_nodes.pop(node.id, None)
        if node.device_state is _RESIDENT:
            self.pages.release(node.device_page)  # type: ignore[arg-type]  # resident => has a page
        if node.host_state is _RESIDENT:
            self._release_slabs((node.host_slab,))  # type: ignore[arg-type]  # resident => has a slab
            node.host_slab = None
            node.host_state = _ABSENT
        del lane.private[page]
        self.pages.transfer(page, _PAGE_NODE, node.id)
        node.device_page = page
        node.device_state = _RESIDENT
        node.inexact = False
        self._extend_path(lane, node, e.seq)

    # ------------------------------------------------------------------ eviction of node copies
    def _apply_device_copies_dropped(self, e: ev.DeviceCopiesDropped) -> None:
        nodes = self._nodes_named(e.nodes) if e.nodes else []
        tails = self._snapshots_named(e.tails) if e.tails else []
        if _named_twice(e.nodes) or _named_twice(e.tails):
            raise EventRejected("DeviceCopiesDropped: an entry is named twice")
        backed = _BACKED
        for entry in (*nodes, *tails):
            if entry.lru_list is not backed:
                raise EventRejected(f"DeviceCopiesDropped: {entry.id} is not a host-backed LRU entry")
        release, unlist = self.pages.release, self.lru.remove
        absent = _ABSENT
        for node in nodes:  # unpinned and host resident: only LRU membership follows the device copy
            release(node.device_page)  # type: ignore[arg-type]  # listed => device resident
            node.device_page = None
            node.device_state = absent
            unlist(node)
        for snap in tails:
            release(snap.tail_device_page)  # type: ignore[arg-type]
            snap.tail_device_page = None
            snap.tail_device_state = absent
            unlist(snap)

    def _apply_subtree_deleted(self, e: ev.SubtreeDeleted) -> None:
        top = self.node(e.node)
        self._check_subtree_removable(top, "SubtreeDeleted")
        self._delete_subtree(top)

    def _apply_node_host_dropped(self, e: ev.NodeHostDropped) -> None:
        node = self.node(e.node)
        if NodeId(e.node) not in self.dead_nodes:
            raise EventRejected(f"NodeHostDropped: node {e.node} is not dead KV")
        if node.device_state == _ABSENT:
            self._check_subtree_removable(node, "NodeHostDropped")
            self._delete_subtree(node)
            return
        assert node.host_slab is not None
        self._release_slabs((node.host_slab,))
        node.host_slab = None
        node.host_state = _ABSENT
        self._refresh_node(node)

    def _apply_pinned_host_copies_dropped(self, e: ev.PinnedHostCopiesDropped) -> None:
        nodes = self._nodes_named(e.nodes)
        if _named_twice(e.nodes):
            raise EventRejected("PinnedHostCopiesDropped: a node is named twice")
        resident = _RESIDENT
        for node in nodes:
            if not node.active_refs:
                raise EventRejected(f"PinnedHostCopiesDropped: node {node.id} is not pinned by a lane")
            if node.restore_pins:
                raise EventRejected(f"PinnedHostCopiesDropped: node {node.id} has a restore in flight")
            if node.device_state is not resident or node.host_state is not resident:
                raise EventRejected(f"PinnedHostCopiesDropped: node {node.id} is not on both tiers")
        self._release_slabs(tuple(node.host_slab for node in nodes))  # type: ignore[misc]
        for node in nodes:
            node.host_slab = None
            node.host_state = _ABSENT
        # A lane's backed spans promise host copies (``DeviceLru.unpin_path``): take these blocks out.
        for lane in self.lanes.values():
            path = lane.path
            blocks = {n.depth for n in nodes if n.depth < len(path) and path[n.depth] is n}
            if blocks and lane.backed_spans:
                lane.backed_spans = spans_without(lane.backed_spans, blocks)

    # ------------------------------------------------------------------ write-through
    def _apply_host_write_opened(self, e: ev.HostWriteOpened) -> None:
        batch = e.batch
        if batch < 0 or batch in self.restores or batch in self.host_writes:
            raise EventRejected(f"HostWriteOpened: batch id {batch} is in use")
        nodes = self._nodes_named(e.nodes) if e.nodes else []
        images = self._snapshots_named(e.images) if e.images else []
        tails = self._snapshots_named(e.tails) if e.tails else []
        if (
            len(e.node_slabs) != len(nodes)
            or len(e.image_slabs) != len(images)
            or len(e.tail_slabs) != len(tails)
        ):
            raise EventRejected("HostWriteOpened: one slab (or slab list) per entry")
        if _named_twice(e.nodes) or (images and _named_twice(e.images)) or (tails and _named_twice(e.tails)):
            raise EventRejected("HostWriteOpened: an entry is named twice")
        self._check_write_sources(nodes, images, tails, e.image_slabs)
        if images or tails:
            all_slabs = list(e.node_slabs)
            for group in e.image_slabs:
                all_slabs += group
            all_slabs += e.tail_slabs
            self._take_free_slabs(all_slabs, "HostWriteOpened")  # the first mutation; all or nothing
        else:
            self._take_free_slabs(e.node_slabs, "HostWriteOpened")  # (take copies what it is given)
        if batch >= self.next_batch_id:
            self.next_batch_id = batch + 1
        owners, filling = self.slab_owners, _FILLING
        for node, slab in zip(nodes, e.node_slabs):
            owners[slab] = (_SLAB_NODE, node.id)
            node.host_slab = slab
            node.host_state = filling
            node.restore_pins += 1
        self.lru.remove_all(nodes)  # pinned: off the LRU; host ABSENT before, so never on the dead list
        if images:
            for snap, group in zip(images, e.image_slabs):
                owned = (_SLAB_IMAGE, snap.id)
                for slab in group:
                    owners[slab] = owned
                snap.host_slabs = tuple(group)
                snap.host_state = filling
                snap.restore_pins += 1
        if tails:
            for snap, slab in zip(tails, e.tail_slabs):
                owners[slab] = (_SLAB_TAIL, snap.id)
                snap.tail_host_slab = slab
                snap.tail_host_state = filling
                snap.restore_pins += 1
            self.lru.remove_all(tails)  # pinned tails leave the LRU (``_refresh_tail`` with a pin held)
        self.host_writes[batch] = HostWriteBatch(nodes, images, tails)

    def _check_write_sources(
        self, nodes: list[BlockNode], images: list, tails: list, image_slabs: tuple[tuple[int, ...], ...]
    ) -> None:
        """Nodes, images and tails of a write batch are device-only; an image names its slab count. Pure;
        raises EventRejected naming the first bad entry."""
        resident, absent = _RESIDENT, _ABSENT
        for node in nodes:
            if node.device_state is not resident or node.host_state is not absent:
                raise EventRejected(f"HostWriteOpened: node {node.id} is not device-only")
        slab_count = self.geometry.image_slabs
        for snap, group in zip(images, image_slabs):
            if snap.device_state is not resident or snap.host_state is not absent:
                raise EventRejected(f"HostWriteOpened: snapshot {snap.id}'s image is not device-only")
            if len(group) != slab_count:
                raise EventRejected(f"HostWriteOpened: an image takes {slab_count} slabs")
        for snap in tails:
            if snap.tail_device_state is not resident or snap.tail_host_state is not absent:
                raise EventRejected(f"HostWriteOpened: snapshot {snap.id}'s tail is not device-only")

    def _apply_host_write_landed(self, e: ev.HostWriteLanded) -> None:
        batch = self.host_writes.get(e.batch)
        if batch is None:
            raise EventRejected(f"HostWriteLanded: no write batch {e.batch}")
        del self.host_writes[e.batch]
        resident, unpinned, dead = _RESIDENT, [], self.dead_nodes
        for node in batch.nodes:  # ``_refresh_node`` for a node that was pinned (so on no list), inlined
            node.host_state = resident
            pins = node.restore_pins = node.restore_pins - 1
            if pins or node.active_refs or node.parent is None:  # the root is never listed
                continue
            if node.device_state is resident:
                unpinned.append(node)  # joins the host-backed list, in batch order
            if node.live_snapshots_below == 0:
                dead[node.id] = node
        if unpinned:
            self.lru.extend_mru(unpinned, _BACKED)
        for snap in batch.images:
            snap.host_state = _RESIDENT
            snap.restore_pins -= 1
            self._refresh_tail(snap)
        for snap in batch.tails:
            snap.tail_host_state = _RESIDENT
            snap.restore_pins -= 1
            self._refresh_tail(snap)
