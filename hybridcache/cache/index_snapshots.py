"""apply() handlers for taps and snapshots, and the ancestor/dependents links of §9.3.

Each handler validates everything first (raising EventRejected) and mutates only afterwards. Mixed into
``PrefixIndex``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from hybridcache.cache import events as ev
from hybridcache.cache.errors import EventRejected
from hybridcache.cache.ids import BLOCK_TOKENS, PageId, SlotId
from hybridcache.cache.records import (
    LIVE_BELOW_CAP,
    BlockNode,
    PageOwnerKind,
    PendingTap,
    Residency,
    SlotRole,
    Snapshot,
    SnapshotKind,
)

if TYPE_CHECKING:
    from hybridcache.cache.index import PrefixIndex

    _Base = PrefixIndex
else:
    _Base = object


# Enum members bound once: reading a member off its Enum class costs ~100 ns in CPython 3.11.
_ABSENT = Residency.ABSENT
_RESIDENT = Residency.RESIDENT
_SLOT_FREE = SlotRole.FREE
_SLOT_SNAPSHOT = SlotRole.SNAPSHOT
_SLOT_STAGING = SlotRole.STAGING
_PAGE_TAIL = PageOwnerKind.TAIL

_KIND_BY_VALUE = {int(kind): kind for kind in SnapshotKind}  # SnapshotKind(value) without the Enum call


def _is_prefix(short: tuple[int, ...], long: tuple[int, ...]) -> bool:
    return len(short) <= len(long) and long[: len(short)] == short


def _deepest_above(
    candidates: Sequence[Snapshot], snap: Snapshot, following: tuple[int, ...]
) -> Snapshot | None:
    """Among ``candidates`` (anchored on one node of ``snap``'s path), the deepest one strictly before
    ``snap`` whose tail is a prefix of ``following`` (the tokens after that node on ``snap``'s path)."""
    best = None
    frontier = snap.frontier
    for other in candidates:
        if other is snap or other.frontier >= frontier:
            continue
        if _is_prefix(other.tail_tokens, following) and (best is None or other.frontier > best.frontier):
            best = other
    return best


class SnapshotHandlers(_Base):
    # ------------------------------------------------------------------ taps (§7.4)
    def _apply_tap_taken(self, e: ev.TapTaken) -> None:
        lane = self.lane(e.lane)
        if not lane.enabled or not lane.activated:
            raise EventRejected(f"TapTaken: lane {e.lane} is disabled or not active")
        if e.position in lane.pending_taps or e.position <= 0:
            raise EventRejected(f"TapTaken: position {e.position} is invalid or already pending")
        if not 0 <= e.slot < len(self.slots.roles) or self.slots.roles[e.slot] != _SLOT_FREE:
            raise EventRejected(f"TapTaken: slot {e.slot} is not free")
        if not self.slots.can_add_snapshot_class():
            raise EventRejected("TapTaken: every snapshot slot is in use")
        self.slots.set_role(e.slot, _SLOT_STAGING, e.lane)
        lane.pending_taps[e.position] = PendingTap(e.position, SlotId(e.slot), e.boundary, e.hedge)

    def _apply_tap_dropped(self, e: ev.TapDropped) -> None:
        lane = self.lane(e.lane)
        tap = lane.pending_taps.get(e.position)
        if tap is None:
            raise EventRejected(f"TapDropped: lane {e.lane} has no pending tap at {e.position}")
        self.slots.set_role(tap.slot, _SLOT_FREE, None)
        del lane.pending_taps[e.position]

    # ------------------------------------------------------------------ publication
    def _apply_snapshot_published(self, e: ev.SnapshotPublished) -> None:
        lane = self.lane(e.lane)
        if not lane.enabled:
            raise EventRejected(f"SnapshotPublished: lane {e.lane} is disabled (no prefix reuse)")
        if e.snapshot < 0 or e.snapshot in self.snapshots:
            raise EventRejected(f"SnapshotPublished: snapshot id {e.snapshot} is in use")
        kind = _KIND_BY_VALUE.get(e.kind)
        if kind is None:
            raise EventRejected(f"SnapshotPublished: unknown kind {e.kind}")
        anchor = self.node(e.anchor)
        on_path = anchor is self.root or (anchor.depth < len(lane.path) and lane.path[anchor.depth] is anchor)
        if not on_path:
            raise EventRejected(f"SnapshotPublished: anchor {e.anchor} is not on lane {e.lane}'s path")
        tail = tuple(e.tail_tokens)
        if len(tail) >= BLOCK_TOKENS:
            raise EventRejected("SnapshotPublished: a tail holds fewer than 64 tokens")
        if (anchor.id, tail) in self.snapshot_by_key:
            raise EventRejected("SnapshotPublished: a snapshot with this anchor and tail exists")
        frontier = BLOCK_TOKENS * (anchor.depth + 1) + len(tail)
        tail_moves = self._check_tail_page(e, lane, tail)
        if e.position is None:
            if lane.slot is None:
                raise EventRejected(f"SnapshotPublished: lane {e.lane} has no active image left")
            if not self.slots.can_add_snapshot_class():
                raise EventRejected("SnapshotPublished: every snapshot slot is in use")
            slot = lane.slot
        else:
            tap = lane.pending_taps.get(e.position)
            if tap is None or e.position != frontier:
                raise EventRejected(f"SnapshotPublished: no pending tap of lane {e.lane} at {frontier}")
            slot = tap.slot
        snap = Snapshot(e.snapshot, anchor, tail, kind)  # type: ignore[arg-type]  # SnapshotId is an int
        snap.inexact = e.inexact
        self.next_snapshot_id = max(self.next_snapshot_id, e.snapshot + 1)
        if e.position is None:
            lane.slot = None
        else:
            del lane.pending_taps[e.position]
            lane.lineage = snap.id
        self.slots.set_role(slot, _SLOT_SNAPSHOT, snap.id)
        snap.device_slot = slot
        snap.device_state = _RESIDENT
        if e.tail_page is not None:
            page: PageId = e.tail_page  # type: ignore[assignment]
            if tail_moves:
                del lane.private[page]
                self.pages.transfer(page, _PAGE_TAIL, snap.id)
            else:
                self.pages.assign(page, _PAGE_TAIL, snap.id)
            snap.tail_device_page = page
            snap.tail_device_state = _RESIDENT
        snap.published_tick = snap.last_hit_tick = e.seq
        snap.base_l = self.gdsf_l
        snap.gdsf_h = e.gdsf_h
        anchor.snapshots += (snap,)
        self.snapshots[snap.id] = snap
        self.snapshot_by_key[(anchor.id, tail)] = snap
        self._attach_snapshot(snap)
        self._refresh_tail(snap)

    def _check_tail_page(self, e: ev.SnapshotPublished, lane, tail: tuple[int, ...]) -> bool:
        """Validate the tail page; True when it is a lane page that moves (no copy)."""
        if not tail:
            if e.tail_page is not None:
                raise EventRejected("SnapshotPublished: a snapshot without tail tokens has no tail page")
            return False
        if e.tail_page is None:
            raise EventRejected("SnapshotPublished: a tailed snapshot needs a tail page")
        if e.tail_page in lane.private:
            return True
        if not self.pages.is_free(e.tail_page):
            raise EventRejected(f"SnapshotPublished: tail page {e.tail_page} is neither private nor free")
        return False

    # ------------------------------------------------------------------ retention and value (§9.3)
    def _apply_snapshot_hit(self, e: ev.SnapshotHit) -> None:
        snap = self.snapshot(e.snapshot)
        snap.hits += 1
        snap.base_l = self.gdsf_l
        snap.last_hit_tick = e.seq

    def _apply_snapshot_superseded(self, e: ev.SnapshotSuperseded) -> None:
        snap = self.snapshot(e.snapshot)
        if snap.superseded:
            raise EventRejected(f"SnapshotSuperseded: snapshot {e.snapshot} is already superseded")
        snap.superseded = True
        snap.superseded_tick = e.seq

    def _apply_snapshot_retained(self, e: ev.SnapshotRetained) -> None:
        snap = self.snapshot(e.snapshot)
        if not snap.superseded:
            raise EventRejected(f"SnapshotRetained: snapshot {e.snapshot} is not superseded")
        snap.superseded = False
        snap.superseded_tick = 0

    def _apply_snapshots_valued(self, e: ev.SnapshotsValued) -> None:
        if len(e.snapshots) != len(e.values):
            raise EventRejected("SnapshotsValued: one value per snapshot")
        snaps = self._snapshots_named(e.snapshots)
        for snap, value in zip(snaps, e.values):
            snap.gdsf_h = value

    def _apply_gdsf_inflated(self, e: ev.GdsfInflated) -> None:
        if e.inflation < self.gdsf_l:
            raise EventRejected(f"GdsfInflated: L would fall from {self.gdsf_l} to {e.inflation}")
        self.gdsf_l = e.inflation

    # ------------------------------------------------------------------ dropping copies
    def _apply_snapshot_device_dropped(self, e: ev.SnapshotDeviceDropped) -> None:
        snap = self.snapshot(e.snapshot)
        if snap.device_state != _RESIDENT or snap.host_state != _RESIDENT:
            raise EventRejected(f"SnapshotDeviceDropped: snapshot {e.snapshot} has no host image to keep")
        if snap.restore_pins > 0:
            raise EventRejected(f"SnapshotDeviceDropped: snapshot {e.snapshot} is pinned")
        assert snap.device_slot is not None
        self.slots.set_role(snap.device_slot, _SLOT_FREE, None)
        snap.device_slot = None
        snap.device_state = _ABSENT

    def _apply_snapshot_host_dropped(self, e: ev.SnapshotHostDropped) -> None:
        snap = self.snapshot(e.snapshot)
        if snap.host_state != _RESIDENT or not snap.device_complete:
            raise EventRejected(f"SnapshotHostDropped: snapshot {e.snapshot} is not complete on the device")
        if snap.restore_pins > 0:
            raise EventRejected(f"SnapshotHostDropped: snapshot {e.snapshot} is pinned")
        self._release_slabs(snap.host_slabs)
        snap.host_slabs = ()
        snap.host_state = _ABSENT
        if snap.tail_host_slab is not None:
            self._release_slabs((snap.tail_host_slab,))
            snap.tail_host_slab = None
            snap.tail_host_state = _ABSENT
        self._refresh_tail(snap)

    def _apply_snapshot_deleted(self, e: ev.SnapshotDeleted) -> None:
        snap = self.snapshot(e.snapshot)
        self._check_snapshot_removable(snap, "SnapshotDeleted")
        self._remove_snapshot(snap)

    # ------------------------------------------------------------------ ancestry (§9.3)
    def is_above(self, upper: Snapshot, lower: Snapshot) -> bool:
        """True when ``upper`` lies on ``lower``'s path strictly before it. Pure."""
        if upper.frontier >= lower.frontier or upper.anchor.depth > lower.anchor.depth:
            return False
        if upper.anchor is lower.anchor:
            return _is_prefix(upper.tail_tokens, lower.tail_tokens)
        node: BlockNode = lower.anchor
        while node.depth > upper.anchor.depth + 1:
            assert node.parent is not None
            node = node.parent
        return node.parent is upper.anchor and _is_prefix(upper.tail_tokens, node.tokens)

    def find_ancestor(self, snap: Snapshot) -> Snapshot | None:
        """The nearest snapshot above ``snap`` on its path (any retention state). Pure."""
        node: BlockNode | None = snap.anchor
        following = snap.tail_tokens
        while node is not None:
            best = _deepest_above(node.snapshots, snap, following)
            if best is not None:
                return best
            following = node.tokens
            node = node.parent
        return None

    def _attach_snapshot(self, snap: Snapshot) -> None:
        """A new snapshot (already in its anchor's list) counts as live from its anchor up (see
        ``BlockNode.live_snapshots_below``) and gets its ancestry links (§9.3), in one walk up the path.
        Mutates.

        A node's count rises by one while its child's capped count rose (it was below LIVE_BELOW_CAP).
        Only nodes below the nearest node that already had a live snapshot can go from 0 to 1 (and so
        change dead-list membership); the walk to the ancestor covers them (a node holding the ancestor
        is live), and above the ancestor the counts only rise, in a loop that does nothing else and stops
        at the first node that was saturated already."""
        refresh, cap = self._refresh_node, LIVE_BELOW_CAP
        child = anchor = snap.anchor
        live = anchor.live_snapshots_below
        anchor.live_snapshots_below = live + 1
        if live == 0 and not (anchor.active_refs or anchor.restore_pins):  # as in the loop below
            refresh(anchor)
        rising = live < cap  # the capped count of the node below rose: this one's count rises
        ancestor = None
        if len(anchor.snapshots) > 1:  # snap itself is listed already
            ancestor = _deepest_above(anchor.snapshots, snap, snap.tail_tokens)
        node = anchor.parent
        while node is not None and ancestor is None:  # one step per block: find_ancestor, fused
            if rising:
                live = node.live_snapshots_below
                node.live_snapshots_below = live + 1
                if live == 0 and not (node.active_refs or node.restore_pins):  # pinned: on no list, not dead
                    refresh(node)
                rising = live < cap
            if node.snapshots:
                ancestor = _deepest_above(node.snapshots, snap, child.tokens)
            child, node = node, node.parent
        while rising and node is not None:  # above the ancestor every count is >= 1 already: no refresh
            live = node.live_snapshots_below
            node.live_snapshots_below = live + 1
            rising = live < cap
            node = node.parent
        self._link_below(snap, ancestor)

    def _link_below(self, snap: Snapshot, ancestor: Snapshot | None) -> None:
        """``snap`` records ``ancestor`` and takes over the dependents of it that lie below ``snap``."""
        pool = self.root_dependents if ancestor is None else ancestor.dependents
        snap.ancestor = ancestor
        if pool:
            frontier = snap.frontier
            for dependent in list(pool.values()):
                if dependent.frontier > frontier and self.is_above(snap, dependent):
                    del pool[dependent.id]
                    dependent.ancestor = snap
                    snap.dependents[dependent.id] = dependent
        pool[snap.id] = snap

    def _unlink_ancestry(self, snap: Snapshot) -> None:
        ancestor = snap.ancestor
        pool = self.root_dependents if ancestor is None else ancestor.dependents
        del pool[snap.id]
        for dependent in snap.dependents.values():
            dependent.ancestor = ancestor
            pool[dependent.id] = dependent
        snap.dependents = {}
        snap.ancestor = None
