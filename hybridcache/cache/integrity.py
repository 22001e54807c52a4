"""check_integrity: rebuild every derived counter and membership from scratch and compare (§10).

Covers invariants 1 (one owner per page, slab and slot), 2/5 (tree shape and exact keys), 3 (active paths
pinned and device resident), 4 (snapshots valid), 6 (Filling copies pinned) and the derived state:
active_refs, restore_pins, live_snapshots_below, LRU and dead-list membership, ancestor links.
Pure: reads the index, raises ``IntegrityError`` naming the first violation.
"""

from __future__ import annotations

from collections import Counter
from typing import TYPE_CHECKING

from hybridcache.cache.errors import IntegrityError
from hybridcache.cache.ids import BLOCK_TOKENS
from hybridcache.cache.records import (
    LIVE_BELOW_CAP,
    BlockNode,
    LruList,
    PageOwnerKind,
    Residency,
    SlabOwnerKind,
    SlotRole,
    Snapshot,
)

if TYPE_CHECKING:
    from hybridcache.cache.index import PrefixIndex


def _fail(message: str) -> None:
    raise IntegrityError(message)


def check_integrity(index: PrefixIndex) -> None:
    """Raise IntegrityError at the first derived value that differs from a rebuild. Pure."""
    _check_tree(index)
    _check_pins(index)
    _check_live_below(index)
    _check_lru_and_dead(index)
    _check_pages(index)
    _check_slabs(index)
    _check_slots(index)
    _check_snapshots(index)
    _check_lanes(index)


def _check_tree(index: PrefixIndex) -> None:
    for node in index.nodes.values():
        if node.parent is None:
            if node is not index.root:
                _fail(f"node {node.id} has no parent but is not the root")
            continue
        if index.nodes.get(node.parent.id) is not node.parent:
            _fail(f"node {node.id}: parent {node.parent.id} is not in the index")
        if node not in node.parent.children_under(node.lookup_hash):
            _fail(f"node {node.id} is missing from its parent's child map under its lookup hash")
        if node.depth != node.parent.depth + 1 or len(node.tokens) != BLOCK_TOKENS:
            _fail(f"node {node.id}: depth {node.depth} or token count {len(node.tokens)} is wrong")
        has_page = node.device_page is not None
        if has_page != (node.device_state != Residency.ABSENT):
            _fail(f"node {node.id}: device page {node.device_page} disagrees with {node.device_state.name}")
        if (node.host_slab is not None) != (node.host_state != Residency.ABSENT):
            _fail(f"node {node.id}: host slab {node.host_slab} disagrees with {node.host_state.name}")
        if not has_page and node.host_state == Residency.ABSENT:
            _fail(f"node {node.id} has neither a device nor a host copy (§9.4)")
        for child in node.iter_children():
            if index.nodes.get(child.id) is not child:
                _fail(f"node {node.id} lists child {child.id}, which is not in the index")
        keys = [(c.tokens, c.extra) for c in node.iter_children()]
        if len(set(keys)) != len(keys):
            _fail(f"node {node.id} has two children with identical tokens and extra key")


def _check_pins(index: PrefixIndex) -> None:
    refs: Counter[int] = Counter()
    node_pins: Counter[int] = Counter()
    snap_pins: Counter[int] = Counter()
    for lane in index.lanes.values():
        for node in lane.path:
            refs[node.id] += 1
        if lane.source is not None:
            snap_pins[lane.source.id] += 1
    for batch in index.restores.values():
        for node in batch.nodes:
            node_pins[node.id] += 1
            if node.device_state != Residency.FILLING:
                _fail(f"node {node.id} is in a restore batch but not device FILLING")
        if batch.snapshot is not None:
            snap_pins[batch.snapshot.id] += 1
    for write in index.host_writes.values():
        for node in write.nodes:
            node_pins[node.id] += 1
            if node.host_state != Residency.FILLING:
                _fail(f"node {node.id} is in a write batch but not host FILLING")
        for snap in (*write.images, *write.tails):
            snap_pins[snap.id] += 1
    for node in index.nodes.values():
        if node.active_refs != refs[node.id]:
            _fail(f"node {node.id}: active_refs {node.active_refs}, lanes map it {refs[node.id]} times")
        if node.restore_pins != node_pins[node.id]:
            _fail(f"node {node.id}: restore_pins {node.restore_pins}, transfers hold {node_pins[node.id]}")
        filling = Residency.FILLING in (node.device_state, node.host_state)
        if filling and node.restore_pins == 0:
            _fail(f"node {node.id} is FILLING without a transfer pinning it (§10.6)")
    for snap in index.snapshots.values():
        if snap.restore_pins != snap_pins[snap.id]:
            _fail(f"snapshot {snap.id}: restore_pins {snap.restore_pins}, holders {snap_pins[snap.id]}")


def _check_live_below(index: PrefixIndex) -> None:
    """Rebuild ``live_snapshots_below`` bottom-up from the snapshot anchors: the snapshots anchored at a
    node plus its children's values capped at LIVE_BELOW_CAP (see ``BlockNode``)."""
    expected: Counter[int] = Counter()
    for snap in index.snapshots.values():
        expected[snap.anchor.id] += 1
    for node in sorted(index.nodes.values(), key=lambda n: n.depth, reverse=True):  # children first
        if node.parent is not None:
            expected[node.parent.id] += min(expected[node.id], LIVE_BELOW_CAP)
    for node in index.nodes.values():
        if node.live_snapshots_below != expected[node.id]:
            _fail(
                f"node {node.id}: live_snapshots_below {node.live_snapshots_below}, "
                f"rebuilt {expected[node.id]}"
            )


def _expected_node_list(node: BlockNode) -> LruList:
    if node.parent is None or node.device_state != Residency.RESIDENT or node.pinned:
        return LruList.NONE
    return LruList.BACKED if node.host_state == Residency.RESIDENT else LruList.UNBACKED


def _expected_tail_list(snap: Snapshot) -> LruList:
    if snap.tail_device_state != Residency.RESIDENT or snap.restore_pins > 0:
        return LruList.NONE
    return LruList.BACKED if snap.tail_host_state == Residency.RESIDENT else LruList.UNBACKED


def _check_lru_and_dead(index: PrefixIndex) -> None:
    for which in (LruList.BACKED, LruList.UNBACKED):
        listed = list(index.lru.iter_lru_first(which))
        if len(listed) != index.lru.count(which):
            _fail(f"LRU {which.name}: count {index.lru.count(which)} but {len(listed)} entries linked")
        for entry in listed:
            if entry.lru_list != which:
                _fail(f"LRU {which.name}: entry {entry.id} says it is on {entry.lru_list.name}")  # type: ignore[attr-defined]
    for node in index.nodes.values():
        if node.lru_list != _expected_node_list(node):
            _fail(f"node {node.id}: on LRU {node.lru_list.name}, expected {_expected_node_list(node).name}")
        unlinked = node.lru_prev is None and node.lru_next is None
        if node.lru_list == LruList.NONE and not node.active_refs and not unlinked:
            _fail(f"node {node.id} is on no LRU list and pinned by no lane but keeps list links")
        dead = (
            node.parent is not None
            and node.host_state == Residency.RESIDENT
            and node.live_snapshots_below == 0
            and not node.pinned
        )
        if dead != (node.id in index.dead_nodes):
            _fail(f"node {node.id}: dead-list membership is {not dead}, expected {dead}")
    for snap in index.snapshots.values():
        expected = _expected_tail_list(snap)
        if snap.lru_list != expected:
            _fail(f"snapshot {snap.id}: tail on LRU {snap.lru_list.name}, expected {expected.name}")
    if len(index.dead_nodes) != sum(1 for n in index.dead_nodes.values() if index.nodes.get(n.id) is n):
        _fail("the dead list holds a node that is not in the index")


def _check_pages(index: PrefixIndex) -> None:
    expected: dict[int, tuple[PageOwnerKind, int]] = {}

    def own(page: int, owner: tuple[PageOwnerKind, int]) -> None:
        if page in expected:
            _fail(f"page {page} is owned by both {expected[page]} and {owner}")
        expected[page] = owner

    for node in index.nodes.values():
        if node.device_page is not None:
            own(node.device_page, (PageOwnerKind.NODE, node.id))
    for snap in index.snapshots.values():
        if snap.tail_device_page is not None:
            own(snap.tail_device_page, (PageOwnerKind.TAIL, snap.id))
    for lane in index.lanes.values():
        for page in lane.private:
            own(page, (PageOwnerKind.LANE, lane.id))
    for page, owner in enumerate(index.pages.owners):
        if owner != expected.get(page):
            _fail(f"page {page}: ledger owner {owner}, rebuilt {expected.get(page)}")
    free = set(index.pages.free_order())
    if free != {p for p in range(index.pages.num_pages) if p not in expected}:
        _fail("the free page set disagrees with the page owners")


def _check_slabs(index: PrefixIndex) -> None:
    expected: dict[int, tuple[SlabOwnerKind, int]] = {}
    for node in index.nodes.values():
        if node.host_slab is not None:
            expected[node.host_slab] = (SlabOwnerKind.NODE, node.id)
    for snap in index.snapshots.values():
        for slab in snap.host_slabs:
            expected[slab] = (SlabOwnerKind.IMAGE, snap.id)
        if snap.tail_host_slab is not None:
            expected[snap.tail_host_slab] = (SlabOwnerKind.TAIL, snap.id)
    if expected != index.slab_owners:
        diff = set(expected.items()) ^ set(index.slab_owners.items())
        _fail(f"slab owners differ from a rebuild, first: {sorted(diff)[:1]}")
    if index.host is None:
        if expected:
            _fail("slabs are owned but there is no host tier")
        return
    used = index.host.num_slabs - index.host.num_free
    if used != len(expected):
        _fail(f"host pool has {used} slabs taken but {len(expected)} owned")
    for slab in expected:
        if index.host.is_free(slab):
            _fail(f"slab {slab} is owned but free in the pool")


def _check_slots(index: PrefixIndex) -> None:
    expected: dict[int, tuple[SlotRole, int]] = {}
    for lane in index.lanes.values():
        if lane.slot is not None:
            expected[lane.slot] = (SlotRole.ACTIVE, lane.id)
        for tap in lane.pending_taps.values():
            expected[tap.slot] = (SlotRole.STAGING, lane.id)
    for snap in index.snapshots.values():
        if (snap.device_slot is not None) != (snap.device_state == Residency.RESIDENT):
            _fail(f"snapshot {snap.id}: slot {snap.device_slot} disagrees with {snap.device_state.name}")
        if snap.device_slot is not None:
            if snap.device_slot in expected:
                _fail(
                    f"slot {snap.device_slot} is held by snapshot {snap.id} and {expected[snap.device_slot]}"
                )
            expected[snap.device_slot] = (SlotRole.SNAPSHOT, snap.id)
    for slot, (role, owner) in enumerate(zip(index.slots.roles, index.slots.owners)):
        want = expected.get(slot, (SlotRole.FREE, None))
        if (role, owner) != want:
            _fail(f"slot {slot}: role {role.name} owner {owner}, rebuilt {want[0].name} {want[1]}")
    recount = Counter(index.slots.roles)
    for role in SlotRole:
        if index.slots.role_counts[role] != recount[role]:
            _fail(f"slot role {role.name}: count {index.slots.role_counts[role]}, rebuilt {recount[role]}")
    if index.slots.num_active > index.slots.max_active:
        _fail(f"{index.slots.num_active} active slots exceed C = {index.slots.max_active}")
    if index.slots.num_snapshot_class > index.slots.max_snapshot:
        _fail(f"{index.slots.num_snapshot_class} snapshot slots exceed D = {index.slots.max_snapshot}")


def _check_snapshots(index: PrefixIndex) -> None:
    dependents: dict[int | None, set[int]] = {}
    for snap in index.snapshots.values():
        if index.nodes.get(snap.anchor.id) is not snap.anchor or snap not in snap.anchor.snapshots:
            _fail(f"snapshot {snap.id}: anchor {snap.anchor.id} is gone or does not list it")
        if index.snapshot_by_key.get((snap.anchor.id, snap.tail_tokens)) is not snap:
            _fail(f"snapshot {snap.id} is not under its (anchor, tail) key")
        if snap.frontier != BLOCK_TOKENS * (snap.anchor.depth + 1) + len(snap.tail_tokens):
            _fail(f"snapshot {snap.id}: frontier {snap.frontier} disagrees with its anchor and tail")
        image_copy = snap.device_state == Residency.RESIDENT or snap.host_state != Residency.ABSENT
        tail_copy = (
            not snap.tail_tokens or snap.tail_device_page is not None or snap.tail_host_slab is not None
        )
        if not (image_copy and tail_copy):
            _fail(f"snapshot {snap.id} is invalid: its image or tail has no copy (§5.3)")
        if (snap.tail_device_page is not None) != (snap.tail_device_state != Residency.ABSENT):
            _fail(f"snapshot {snap.id}: tail page disagrees with {snap.tail_device_state.name}")
        if len(snap.host_slabs) not in (0, index.geometry.image_slabs):
            _fail(f"snapshot {snap.id}: {len(snap.host_slabs)} image slabs")
        ancestor = index.find_ancestor(snap)
        if snap.ancestor is not ancestor:
            got = None if snap.ancestor is None else snap.ancestor.id
            _fail(f"snapshot {snap.id}: ancestor {got}, rebuilt {None if ancestor is None else ancestor.id}")
        dependents.setdefault(None if ancestor is None else ancestor.id, set()).add(snap.id)
    if set(index.root_dependents) != dependents.get(None, set()):
        _fail("root dependents differ from a rebuild")
    for snap in index.snapshots.values():
        if set(snap.dependents) != dependents.get(snap.id, set()):
            _fail(f"snapshot {snap.id}: dependents {sorted(snap.dependents)} differ from a rebuild")


def _check_lanes(index: PrefixIndex) -> None:
    for lane in index.lanes.values():
        parent = index.root
        for node in lane.path:
            if node.parent is not parent or index.nodes.get(node.id) is not node:
                _fail(f"lane {lane.id}: path node {node.id} does not continue its path")
            if lane.activated and node.device_page is None:
                _fail(f"lane {lane.id}: active path node {node.id} has no device copy (§10.3)")
            parent = node
        if not set(lane.private) <= set(lane.table):
            _fail(f"lane {lane.id}: a private page is not in its block table")
        if not lane.enabled and (lane.path or lane.pending_taps):
            _fail(f"disabled lane {lane.id} maps tree nodes or holds taps (§10.8)")
