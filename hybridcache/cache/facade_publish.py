"""Cache facade, second half: taps (§7.4, §9.2), finish / cancel / release (§7.7) and host writes.

Mixed into ``Cache`` (facade.py); uses its event plumbing (``_apply``, ``_apply_valued``, ``_revalue``,
``_free_device_pages``, ``_free_host_slabs``). Every public call mutates the index through events.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from hybridcache.cache import events as ev
from hybridcache.cache.exactness import endpoint_is_exact, snapshot_is_exact
from hybridcache.cache.facade_results import (
    FinishResult,
    HostWritePlan,
    PageCopy,
    PageToSlab,
    PublishedTap,
    PublishResult,
    SlotToSlabs,
    TapResult,
)
from hybridcache.cache.hedge_admission import hedge_image_bytes, plan_hedge_budget
from hybridcache.cache.host_eviction import (
    density_term,
    estimate_new_priority,
    plan_host_room,
    plan_supersession,
)
from hybridcache.cache.ids import BLOCK_TOKENS, PageId, SlabId, SnapshotId
from hybridcache.cache.recency_floor import finished_unit
from hybridcache.cache.records import BlockNode, Lane, LaneId, Residency, Snapshot, SnapshotKind
from hybridcache.cache.slots import plan_snapshot_slot
from hybridcache.cache.write_back import HostWrite, WriteBackPlan, blocks_to_flush, plan_write_back

if TYPE_CHECKING:
    from hybridcache.cache.facade import Cache

    _Base = Cache
else:
    _Base = object


class PublicationCalls(_Base):
    # ------------------------------------------------------------------ taps (§7.4, §9.2)
    def _previous_frontier(self, la: Lane) -> int:
        lineage = None if la.lineage is None else self.index.snapshots.get(la.lineage)
        return max(la.base, 0 if lineage is None else lineage.frontier)

    def take_tap(self, lane: int, position: int, boundary: bool = False, hedge: bool = False) -> TapResult:
        """Reserve a staging slot for a tap at ``position`` (supersedes the lineage first). Mutates.
        The engine copies the lane's state into the returned slot; ``slot`` None means skipped. A
        ``hedge`` tap publishes a ``SnapshotKind.HEDGE`` (hedge_admission.py)."""
        la = self.index.lanes[LaneId(lane)]
        if not la.enabled:
            return TapResult(None, "disabled")
        if position <= self._previous_frontier(la) or position in la.pending_taps:
            return TapResult(None, "not deeper than the lane's snapshots")
        self._apply_valued(plan_supersession(self.index, [la.resumed_from, la.lineage], position))
        value = estimate_new_priority(
            self.index, self.cost, position, self._previous_frontier(la), position % BLOCK_TOKENS != 0
        )
        if not self._make_slot_room(value, needs_free_slot=True, hedge=hedge):
            self.stats.taps_skipped_no_slot += 1
            return TapResult(None, "no snapshot slot")
        slot = self.index.slots.peek_free()
        assert slot is not None
        self._apply(ev.TapTaken(0, lane, position, slot, boundary, hedge))
        return TapResult(slot)

    def _make_slot_room(self, value: float, needs_free_slot: bool, hedge: bool = False) -> bool:
        while True:
            events = plan_snapshot_slot(self.index, value, needs_free_slot, hedge)
            if events is None:
                return False
            if not events:
                return True
            self._apply_valued(events)

    def _lane_page(self, la: Lane, block: int) -> PageId:
        first_private = la.base // BLOCK_TOKENS
        if block < first_private:
            page = la.path[block].device_page
            assert page is not None
            return page
        return la.table[block - first_private]

    def publish_ready_taps(
        self, lane: int, tokens: Sequence[int], exact_tokens: int | None = None
    ) -> PublishResult:
        """Publish every pending tap whose anchor blocks are committed, then write their images (and
        tails) through to the host. ``exact_tokens`` as for ``commit_blocks``. Mutates."""
        la = self.index.lanes[LaneId(lane)]
        published: list[PublishedTap] = []
        dropped: list[int] = []
        snaps: list[Snapshot] = []
        for position in sorted(la.pending_taps):
            outcome = self._publish_tap(la, position, tokens, exact_tokens)
            if outcome is None:
                continue
            if isinstance(outcome, int):
                dropped.append(outcome)
                continue
            published.append(outcome)
            snaps.append(self.index.snapshots[outcome.snapshot])
        write = self._plan_write([], snaps)
        return PublishResult(tuple(published), tuple(dropped), write)

    def _publish_tap(
        self, la: Lane, position: int, tokens: Sequence[int], exact_tokens: int | None
    ) -> PublishedTap | int | None:
        index = self.index
        full, tail_len = divmod(position, BLOCK_TOKENS)
        if len(la.path) < full or len(tokens) < position:
            return None  # anchor blocks not committed yet
        # A tail (p % 64 != 0) is copied from the lane's own page for block p/64, whose first p % 64
        # rows are computed: the block itself need not be complete (the exact prompt-tail tap at n-1).
        anchor = la.path[full - 1] if full else index.root
        tail = tuple(tokens[full * BLOCK_TOKENS : position])
        tap = la.pending_taps[position]
        exact = snapshot_is_exact(position, exact_tokens)
        if not self._key_free(anchor, tail, exact) or (tail_len and not self._free_device_pages(1)):
            self._apply(ev.TapDropped(0, la.id, position))
            return position
        tail_page = None
        copy = None
        if tail_len:
            pages = index.pages.peek_free(1)
            assert pages is not None
            tail_page = pages[0]
            copy = PageCopy(self._lane_page(la, full), tail_page, tail_len)
        self._apply_valued(plan_supersession(index, [la.resumed_from, la.lineage], position))
        value = estimate_new_priority(index, self.cost, position, self._previous_frontier(la), tail_len > 0)
        kind = SnapshotKind.HEDGE if tap.hedge else SnapshotKind.TAP
        kind = SnapshotKind.BOUNDARY if tap.boundary else kind
        sid = index.next_snapshot_id
        self._apply(
            ev.SnapshotPublished(
                0, sid, la.id, int(kind), anchor.id, tail, tail_page, position, value, not exact
            )
        )
        self._revalue([index.snapshots[SnapshotId(sid)]])
        return PublishedTap(SnapshotId(sid), position, copy)

    # ------------------------------------------------------------------ finish (§7.7)
    def finish(
        self,
        lane: int,
        tokens: Sequence[int],
        block_hashes: Sequence[int] | None = None,
        extras: Sequence[int] | None = None,
        exact_tokens: int | None = None,
        inexact_endpoint: bool = True,
    ) -> FinishResult:
        """Terminal settlement: commit, publish ready taps, take the endpoint snapshot (the lane's image
        by role change, its partial last page as the tail), write the endpoint (and, in THROUGH mode,
        the lane's device-only blocks) to the host, and release the lane. ``tokens``: every committed
        token; ``exact_tokens`` as for ``commit_blocks``; an inexact endpoint is skipped unless
        ``inexact_endpoint`` (an engine that resumes only exactly never uses one). Mutates."""
        la = self.index.lanes.get(LaneId(lane))
        if la is None:
            raise KeyError(f"lane {lane} is not staged")
        if la.activated:
            self.commit_blocks(lane, tokens, block_hashes, extras, exact_tokens)
        taps = PublishResult((), (), None)
        if la.enabled:
            taps = self.publish_ready_taps(lane, tokens, exact_tokens)
        endpoint, skipped = self._publish_endpoint(la, tokens, exact_tokens, inexact_endpoint)
        snaps = [] if endpoint is None else [self.index.snapshots[endpoint]]
        if self.now is not None and snaps:
            self.recency_floor.finished(finished_unit(snaps[0], la.base), self.now)
        write = self._plan_write(self._written_through(la), snaps)
        self._apply(ev.LaneReleased(0, lane))
        return FinishResult(endpoint, skipped, taps, write)

    def cancel(
        self,
        lane: int,
        tokens: Sequence[int],
        exact_tokens: int | None = None,
        inexact_endpoint: bool = True,
    ) -> FinishResult:
        """Cancel: finish semantics after at least one committed unit, else a plain release. Mutates."""
        la = self.index.lanes[LaneId(lane)]
        if la.activated and len(tokens) > la.base:
            return self.finish(
                lane, tokens, exact_tokens=exact_tokens, inexact_endpoint=inexact_endpoint
            )
        return self.release(lane)

    def release(self, lane: int) -> FinishResult:
        """Release without an endpoint or tap publication; in THROUGH mode device-only path blocks are
        still written to the host. Mutates."""
        la = self.index.lanes[LaneId(lane)]
        write = self._plan_write(self._written_through(la), [])
        self._apply(ev.LaneReleased(0, lane))
        return FinishResult(None, "released", PublishResult((), (), None), write)

    def _deepest_on_path(self, la: Lane, tokens: Sequence[int], frontier: int, exact: bool) -> int:
        """The deepest snapshot frontier on the lane's path up to ``frontier`` (the base at least); an
        exact one counts only exact snapshots. Pure."""
        deepest = la.base
        for anchor in (self.index.root, *la.path):
            for snap in anchor.snapshots:
                if snap.inexact and exact:
                    continue
                if deepest < snap.frontier <= frontier:
                    start = snap.frontier - len(snap.tail_tokens)
                    if tuple(tokens[start : snap.frontier]) == snap.tail_tokens:
                        deepest = snap.frontier
        return deepest

    def _publish_endpoint(
        self, la: Lane, tokens: Sequence[int], exact_tokens: int | None, inexact_endpoint: bool
    ) -> tuple[SnapshotId | None, str | None]:
        index = self.index
        frontier = len(tokens)
        full, tail_len = divmod(frontier, BLOCK_TOKENS)
        if not la.enabled or la.slot is None or not la.activated:
            return None, "disabled or inactive"
        exact = endpoint_is_exact(frontier, exact_tokens)
        if not exact and not inexact_endpoint:
            return None, "inexact (exact resumes only)"
        deepest = self._deepest_on_path(la, tokens, frontier, exact)
        if frontier - deepest < BLOCK_TOKENS or len(la.path) < full:
            return None, "within 64 tokens of a snapshot"
        anchor = la.path[full - 1] if full else index.root
        tail = tuple(tokens[full * BLOCK_TOKENS : frontier])
        if tail_len and full - la.base // BLOCK_TOKENS >= len(la.table):
            return None, "no page holds the last tokens"
        tail_page = self._lane_page(la, full) if tail_len else None
        if tail_page is not None and tail_page not in la.private:
            return None, "the last page is not private"
        if not self._key_free(anchor, tail, exact):
            return None, "an inexact snapshot at this point is in use"
        self._apply_valued(plan_supersession(index, [la.resumed_from], frontier))
        value = estimate_new_priority(index, self.cost, frontier, deepest, tail_len > 0)
        if not self._make_slot_room(value, needs_free_slot=False):
            self.stats.endpoints_skipped += 1
            return None, "no snapshot slot"
        sid = index.next_snapshot_id
        self._apply(
            ev.SnapshotPublished(
                0, sid, la.id, int(SnapshotKind.ENDPOINT), anchor.id, tail, tail_page, None, value, not exact
            )
        )
        self._revalue([index.snapshots[SnapshotId(sid)]])
        return SnapshotId(sid), None

    def _key_free(self, anchor: BlockNode, tail: tuple[int, ...], exact: bool) -> bool:
        """Whether a snapshot can be published at (anchor, tail): none is there, or an exact one replaces
        an inexact one that nothing pins or copies (deleted here). Mutates only to delete it."""
        existing = self.index.snapshot_by_key.get((anchor.id, tail))
        if existing is None:
            return True
        copies = (existing.device_state, existing.host_state)
        tails = (existing.tail_device_state, existing.tail_host_state)
        if not exact or not existing.inexact or existing.restore_pins or Residency.FILLING in copies + tails:
            return False
        self._apply_valued([ev.SnapshotDeleted(0, existing.id)])
        return True

    # ------------------------------------------------------------------ host writes
    def _written_through(self, la: Lane) -> Sequence[BlockNode]:
        return la.path if self.host_write is HostWrite.THROUGH else ()

    def _write_back(self, pages_needed: int) -> None:
        """BACK mode, before evicting toward ``pages_needed`` free pages (``write_back.plan_write_back``):
        delete the unreachable unbacked subtrees among the coldest entries, and write the reachable ones
        to the host, copied now through ``host_copy`` and landed, so eviction drops host-backed copies
        and loses nothing a snapshot can reach. Mutates."""
        chosen = self._plan_write_back(pages_needed)
        for node in chosen.delete:
            if self.index.nodes.get(node.id) is node:  # not inside an earlier deleted subtree
                self.stats.evicted_device_events += 1
                self._apply_valued([ev.SubtreeDeleted(0, node.id)])
        plan = self._write_blocks(chosen.write)
        if plan is None:
            return
        if self.host_copy is not None:
            self.host_copy(plan)
        self.stats.written_back_blocks += len(plan.blocks)
        self._apply(ev.HostWriteLanded(0, plan.batch))

    def _plan_write_back(self, pages_needed: int) -> WriteBackPlan:
        """The policy hook of ``_write_back`` (the simulator's plain-LRU baseline overrides it). Pure."""
        return plan_write_back(self.index, pages_needed)

    def flush_to_host(self) -> HostWritePlan | None:
        """Open one host write for every device-only block a live snapshot can reach, parents first, as
        far as the host can make room (before saving the prefix-cache file). Mutates; None if none."""
        return self._write_blocks(blocks_to_flush(self.index))

    def _write_blocks(self, nodes: list[BlockNode]) -> HostWritePlan | None:
        index = self.index
        if not nodes or index.host is None:
            return None
        if not self._free_host_slabs(len(nodes)):
            nodes = nodes[: index.host.num_free]  # as many as the tier can hold
        # Making host room may have deleted a chosen node with its host-only ancestor's subtree.
        nodes = [n for n in nodes if index.nodes.get(n.id) is n]
        return self._open_write(nodes, [], [], len(nodes))

    def _plan_write(self, nodes: Sequence[BlockNode], snaps: Sequence[Snapshot]) -> HostWritePlan | None:
        """Open one host write batch for the device-only ``nodes`` (THROUGH mode passes a released path,
        BACK mode none), images and tails that fit. Mutates."""
        index = self.index
        if index.host is None:
            return None
        chosen_nodes = [
            n for n in nodes if n.device_state == Residency.RESIDENT and n.host_state == Residency.ABSENT
        ]
        if chosen_nodes and not self._free_host_slabs(len(chosen_nodes)):
            chosen_nodes = chosen_nodes[: index.host.num_free]  # as many as the tier can hold
        total = len(chosen_nodes)
        images: list[Snapshot] = []
        tails: list[Snapshot] = []
        hedge_bytes = 0  # hedge bytes chosen for this batch (hedge_admission.py)
        # Hedges last: an ordinary snapshot's write is never refused, a hedge's only goes where room is.
        for snap in sorted(snaps, key=lambda s: s.kind == SnapshotKind.HEDGE):
            if index.snapshots.get(snap.id) is not snap:
                continue
            image = snap.device_state == Residency.RESIDENT and snap.host_state == Residency.ABSENT
            tail = (
                bool(snap.tail_tokens)
                and snap.tail_device_state == Residency.RESIDENT
                and (snap.tail_host_state == Residency.ABSENT)
            )
            need = index.geometry.image_slabs * image + tail
            if need == 0:
                continue
            if snap.kind == SnapshotKind.HEDGE:
                if not self._admit_hedge(snap, total + need, hedge_bytes):
                    self.stats.hedge_writes_refused += 1
                    continue
                hedge_bytes += need * index.geometry.slab_bytes
            elif not self._free_host_slabs(total + need):
                continue
            total += need
            if image:
                images.append(snap)
            if tail:
                tails.append(snap)
        return self._open_write(chosen_nodes, images, tails, total)

    def _admit_hedge(self, snap: Snapshot, slabs: int, pending_bytes: int) -> bool:
        """Make room for a hedge's host write of ``slabs`` (with what the batch already holds) within the
        hedge budget, only over victims worth less than the hedge (hedge_admission.py). Mutates; False
        when the hedge is not to be written."""
        budget = self.hedge_budget_bytes
        if budget is not None:
            nbytes = hedge_image_bytes(self.index, snap)
            while True:
                events = plan_hedge_budget(self.index, nbytes, pending_bytes, budget, snap.gdsf_h)
                if events is None:
                    return False
                if not events:
                    break
                self.stats.evicted_host_events += len(events)
                self._apply_valued(events)
            if self.index.snapshots.get(snap.id) is not snap:
                return False
        return self._free_host_slabs_below(slabs, snap)

    def _free_host_slabs_below(self, count: int, snap: Snapshot | None) -> bool:
        """Free ``count`` host slabs, over victims worth less per byte than ``snap`` only (any victim when
        None; the policy hook the simulator's baselines override). Mutates; False when the room cannot be
        made so."""
        release_pinned = snap is None and self.host_write is HostWrite.BACK
        while True:
            denser_than = None if snap is None else density_term(snap)
            events = self._host_room_step(count, denser_than, release_pinned)
            if events is None:
                return False
            if not events:
                return True
            self.stats.evicted_host_events += len(events)
            self._apply_valued(events)

    def _host_room_step(
        self, count: int, denser_than: float | None, release_pinned: bool
    ) -> list[ev.CacheEvent] | None:
        """One step toward ``count`` free host slabs (``plan_host_room``, the recency floor's rule
        included); the hook the simulator's hindsight runs override (sim/told_cache.py). Pure."""
        return plan_host_room(self.index, count, denser_than, release_pinned, self._spared())

    def _spared(self) -> Callable[[Snapshot], bool] | None:
        """The recency floor's rule for host victims now (recency_floor.py); None while it is off or
        while the owner gives no time."""
        return None if self.now is None else self.recency_floor.spared(self.now)

    def _open_write(
        self, nodes: list[BlockNode], images: list[Snapshot], tails: list[Snapshot], total: int
    ) -> HostWritePlan | None:
        if total == 0:
            return None
        index = self.index
        assert index.host is not None
        slabs = index.host.peek_free(total)
        assert slabs is not None
        per_image = index.geometry.image_slabs
        node_slabs = tuple(slabs[: len(nodes)])
        cursor = len(nodes)
        image_slabs: list[tuple[SlabId, ...]] = []
        for _ in images:
            image_slabs.append(tuple(slabs[cursor : cursor + per_image]))
            cursor += per_image
        tail_slabs = tuple(slabs[cursor : cursor + len(tails)])
        batch = index.next_batch_id
        self._apply(
            ev.HostWriteOpened(
                0,
                batch,
                tuple(n.id for n in nodes),
                node_slabs,
                tuple(s.id for s in images),
                tuple(image_slabs),
                tuple(s.id for s in tails),
                tail_slabs,
            )
        )
        return HostWritePlan(
            batch,
            tuple(PageToSlab(n.device_page, slab) for n, slab in zip(nodes, node_slabs)),  # type: ignore[arg-type]
            tuple(SlotToSlabs(s.device_slot, group) for s, group in zip(images, image_slabs)),  # type: ignore[arg-type]
            tuple(PageToSlab(s.tail_device_page, slab) for s, slab in zip(tails, tail_slabs)),  # type: ignore[arg-type]
        )
