"""Cache: the engine's one entry point to the prefix index (called from the single worker task).

Every call plans events with the pure policy functions, applies them through ``PrefixIndex.apply``
(appending each to ``journal`` when one is given), and returns a small frozen result naming the copies
the engine must issue. Nothing here touches bytes: gpu/ moves them, then reports back with
``restore_done`` / ``host_write_done``.

Request flow: ``quote`` -> ``stage`` -> ``activate`` -> (``commit_blocks`` / ``take_tap`` /
``publish_ready_taps`` / ``allocate_growth_pages``)* -> ``finish`` | ``cancel`` | ``release``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import msgspec

from hybridcache.cache import events as ev
from hybridcache.cache.cost_model import CacheCostModel
from hybridcache.cache.device_eviction import plan_device_eviction
from hybridcache.cache.exactness import block_is_exact
from hybridcache.cache.facade_publish import PublicationCalls
from hybridcache.cache.facade_results import (
    CommitResult,
    HostWritePlan,
    NotReady,
    PageCopy,
    RestorePlan,
    SlabToPage,
    Staged,
    StaleQuote,
    StateSourceKind,
)
from hybridcache.cache.flush import plan_flush
from hybridcache.cache.geometry import CacheGeometry
from hybridcache.cache.hashing import block_hash
from hybridcache.cache.host_eviction import (
    path_sharers,
    plan_revalue,
)
from hybridcache.cache.ids import BLOCK_TOKENS, PageId, SlotId, SnapshotId
from hybridcache.cache.index import PrefixIndex
from hybridcache.cache.match import PromptInput, Quote, Readiness, match, quote, source_options
from hybridcache.cache.recency_floor import RecencyFloor
from hybridcache.cache.records import BlockNode, Lane, LaneId, LruList, Residency, Snapshot
from hybridcache.cache.write_back import HostWrite

PREFETCH_MAX_BLOCKS = 256  # one prefetch batch (§6.6: about 550 MB of 27B INT8 KV)


class CacheStats:
    """Counters for metrics (not logical state: not in the digest, not replayed)."""

    __slots__ = (
        "endpoints_skipped",
        "evicted_device_events",
        "evicted_host_events",
        "hedge_writes_refused",
        "taps_skipped_no_slot",
        "written_back_blocks",
    )

    def __init__(self) -> None:
        self.written_back_blocks = 0
        self.taps_skipped_no_slot = 0
        self.endpoints_skipped = 0
        self.evicted_device_events = 0
        self.evicted_host_events = 0
        self.hedge_writes_refused = 0  # hedge images kept off the host (hedge_admission.py)


_SNAPSHOT_EVENTS = (
    ev.SnapshotDeleted,
    ev.SnapshotHostDropped,
    ev.SnapshotSuperseded,
    ev.SnapshotRetained,
    ev.SnapshotHit,
)


class Cache(PublicationCalls):
    """The facade. Not thread-safe: one worker owns it. Methods mutate the index through events.

    ``host_write`` picks when device-only blocks are written to the host (``cache/write_back.py``):
    BACK when eviction would lose them, THROUGH when a lane releases them (spec §7.6). In BACK mode
    ``host_copy`` is called with each write-back before its blocks' device pages are freed: it must copy
    them at once (None: the copies are bookkeeping only, as in the simulator and the unit tests).

    ``keep_backed_device_images`` False drops a snapshot's device copy as soon as its host image has
    landed. That is for a CPU device, whose "device" slots and host slabs are the same memory: a resume
    copies a host image into the lane's slot as fast as it copies a device one, so a second copy would
    only hold memory (spec §14.2's D = C + 1 resident snapshots assume device copies are faster)."""

    def __init__(
        self,
        geometry: CacheGeometry,
        cost: CacheCostModel | None = None,
        journal: list | None = None,
        host_write: HostWrite = HostWrite.BACK,
        host_copy: Callable[[HostWritePlan], None] | None = None,
        keep_backed_device_images: bool = True,
        hedge_budget_bytes: int | None = None,
    ) -> None:
        self.index = PrefixIndex(geometry)
        self.hedge_budget_bytes = hedge_budget_bytes  # None: no budget (hedge_admission.py)
        self.cost = cost or CacheCostModel.default()
        self.journal = journal
        self.stats = CacheStats()
        self.host_write = HostWrite(host_write)
        self.host_copy = host_copy
        self.keep_backed_device_images = keep_backed_device_images
        self.now: float | None = None  # seconds, set by the owner (the cache reads no clock); None: no floor
        self.recency_floor = RecencyFloor()

    # ------------------------------------------------------------------ event plumbing
    def _apply(self, event: ev.CacheEvent) -> None:
        event = msgspec.structs.replace(event, seq=self.index.seq + 1)
        if self.now is not None and isinstance(event, ev.SnapshotDeleted):
            deleted = self.index.snapshots.get(SnapshotId(event.snapshot))
            if deleted is not None:  # (an unknown id is apply()'s error to raise)
                self.recency_floor.deleted(deleted, self.now)
        self.index.apply(event)
        if self.journal is not None:
            self.journal.append(event)

    def _apply_valued(self, events: Sequence[ev.CacheEvent]) -> None:
        """Apply, then recompute H for every snapshot whose value the events may change."""
        related: list[Snapshot] = []
        anchors: list[BlockNode] = []
        for event in events:
            if isinstance(event, _SNAPSHOT_EVENTS):
                snap = self.index.snapshots.get(SnapshotId(event.snapshot))
                if snap is not None:
                    related.append(snap)
                    if snap.ancestor is not None:
                        related.append(snap.ancestor)
                    related.extend(snap.dependents.values())
                    anchors.append(snap.anchor)
        for event in events:
            self._apply(event)
        for anchor in anchors:
            if self.index.nodes.get(anchor.id) is anchor:
                related.extend(path_sharers(anchor, 1))
        self._revalue(related)

    def _revalue(self, snaps: list[Snapshot]) -> None:
        for event in plan_revalue(self.index, snaps, self.cost):
            self._apply(event)

    def checkpoint(self, part: int = 0, parts: int = 1) -> ev.Checkpoint:
        """Apply (and journal) a Checkpoint of the digest of slice ``part`` of ``parts`` of the state (the
        whole state by default; see ``checkpoint_round``), digested once. Mutates seq only."""
        digest = self.index.checkpoint_digest(part, parts)
        event = ev.Checkpoint(self.index.seq + 1, digest, part, parts)
        self.index.apply(event)
        if self.journal is not None:
            self.journal.append(event)
        return event

    def _free_device_pages(self, count: int) -> bool:
        """Evict from the device LRU until ``count`` pages are free; in BACK mode the reachable blocks
        that would be lost are written to the host first. Mutates; False if impossible."""
        while self.index.num_free_pages < count:
            if self.host_write is HostWrite.BACK:
                self._write_back(count)
                if self.index.num_free_pages >= count:  # unreachable subtrees deleted were enough
                    break
            events = plan_device_eviction(self.index, count)
            if not events:
                return False
            self.stats.evicted_device_events += len(events)
            self._apply_valued(events)
        return True

    def _free_host_slabs(self, count: int) -> bool:
        return self._free_host_slabs_below(count, None)

    def flush_unpinned(self) -> int:
        """Delete every cached prefix no running request holds (``flush.plan_flush``). Mutates; returns
        how many subtrees went."""
        events = plan_flush(self.index)
        self._apply_valued(events)
        return len(events)

    # ------------------------------------------------------------------ admission (§6)
    def quote(self, prompt: PromptInput) -> Quote:
        """Lookup, choice and capacity for ``prompt`` (§6.1–§6.3). Pure."""
        return quote(self.index, prompt, self.cost)

    def stage(self, quoted: Quote, lane: int) -> Staged:
        """Pin the quoted path, evict for pages, reserve the slot and pages, open the restore batch.

        Mutates. Raises StaleQuote when the index changed since ``quoted``; NotReady when the quote is
        not Ready or ``lane`` is already in use; whatever ``host_copy`` raises (the lane released).
        """
        index = self.index
        if quoted.cache_epoch != index.cache_epoch:
            raise StaleQuote(f"quote at epoch {quoted.cache_epoch}, index at {index.cache_epoch}")
        if quoted.readiness != Readiness.READY or LaneId(lane) in index.lanes:
            raise NotReady(f"quote is {quoted.readiness.name} or lane {lane} is in use")
        slot = index.slots.peek_free()
        assert slot is not None
        snap = None if quoted.snapshot is None else index.snapshots[quoted.snapshot]
        if snap is not None:
            hit: list[ev.CacheEvent] = [ev.SnapshotRetained(0, snap.id)] if snap.superseded else []
            self._apply_valued([*hit, ev.SnapshotHit(0, snap.id)])
        self._apply(
            ev.LaneStaged(
                0,
                lane,
                quoted.enabled,
                slot,
                quoted.reuse_tokens,
                quoted.path[-1] if quoted.path else None,
                (),
                None if snap is None else snap.id,
            )
        )
        restore_pages = len(quoted.host_only_nodes) + quoted.tail_restore
        try:
            freed = self._free_device_pages(restore_pages + quoted.private_pages)
        except BaseException:  # a write-back copy failed (host_copy raised): the lane is not left staged
            self._apply(ev.LaneReleased(0, lane))
            raise
        if not freed:
            self._apply(ev.LaneReleased(0, lane))
            raise StaleQuote("the pages the quote counted are no longer available")
        pages = index.pages.peek_free(restore_pages + quoted.private_pages)
        assert pages is not None
        private = tuple(pages[restore_pages:])
        self._apply(ev.LanePagesGranted(0, lane, private))
        restore = self._open_restore(quoted, lane, snap, tuple(pages[:restore_pages]))
        return self._staged(quoted, index.lanes[LaneId(lane)], snap, restore)

    def _open_restore(self, quoted: Quote, lane: int, snap: Snapshot | None, pages: tuple[PageId, ...]):
        nodes = quoted.host_only_nodes
        if not nodes and not quoted.tail_restore and not quoted.image_restore:
            return None
        batch = self.index.next_batch_id
        tail_page = pages[-1] if quoted.tail_restore else None
        node_pages = pages[: len(nodes)]
        with_snap = quoted.tail_restore or quoted.image_restore
        self._apply(
            ev.RestoreOpened(
                0,
                batch,
                lane,
                nodes,
                node_pages,
                snap.id if with_snap and snap else None,
                tail_page,
                quoted.image_restore,
            )
        )
        restored = [self.index.nodes[n] for n in nodes]
        blocks = tuple(SlabToPage(n.host_slab, n.device_page) for n in restored)  # type: ignore[arg-type]
        tail = None
        if tail_page is not None and snap is not None:
            tail = SlabToPage(snap.tail_host_slab, tail_page)  # type: ignore[arg-type]
        image = snap.host_slabs if quoted.image_restore and snap is not None else ()
        return RestorePlan(batch, blocks, tail, tuple(image))

    def _staged(
        self, quoted: Quote, lane: Lane, snap: Snapshot | None, restore: RestorePlan | None
    ) -> Staged:
        assert lane.slot is not None
        table = self.block_table(lane.id)
        tail_copy = None
        if snap is not None and snap.tail_tokens:
            assert snap.tail_device_page is not None
            tail_copy = PageCopy(snap.tail_device_page, lane.table[0], len(snap.tail_tokens))
        if snap is None:
            source, source_slot = StateSourceKind.RESET, None
        elif quoted.image_restore:
            source, source_slot = StateSourceKind.RESTORE, None
        else:
            source, source_slot = StateSourceKind.COPY_SLOT, snap.device_slot
        return Staged(
            lane.id,
            lane.slot,
            quoted.source_kind,
            None if snap is None else snap.id,
            quoted.reuse_tokens,
            table,
            source,
            source_slot,
            tail_copy,
            restore,
            quoted.restored_host_bytes,
        )

    def prefetch(
        self, prompt: PromptInput, max_blocks: int = PREFETCH_MAX_BLOCKS, keep_free: int = 0
    ) -> RestorePlan | None:
        """§6.6: for a blocked FIFO head, copy up to ``max_blocks`` host-only path blocks of the source
        admission would choose into device pages: free ones (leaving ``keep_free``), then host-backed
        cached pages (in BACK mode after writing back reachable unbacked ones), least recently used
        first, never one on the head's own path. One lane-less restore batch: the blocks are Filling
        until ``restore_done``, then ordinary cached blocks at the MRU end. Never drops a last copy.
        Mutates; None when there is nothing to copy or no room."""
        index = self.index
        if not prompt.enabled:
            return None
        found = match(index, prompt)
        best, _ = source_options(index, found, prompt, self.cost)
        wanted = [n for n in best.host_only_nodes if n.device_state == Residency.ABSENT][:max_blocks]
        if not wanted:
            return None
        shortfall = len(wanted) - (index.num_free_pages - keep_free)
        if shortfall > 0:
            if self.host_write is HostWrite.BACK:  # cached blocks make room only once on the host
                self._write_back(len(wanted) + keep_free)
            self._drop_backed_copies(shortfall, protected={id(n) for n in found.path})
        room = max(0, index.num_free_pages - keep_free)
        # Writing back needed host room: host eviction may have deleted some wanted blocks meanwhile.
        still = [n for n in wanted if index.nodes.get(n.id) is n and n.device_state == Residency.ABSENT]
        nodes = still[:room]
        if not nodes:
            return None
        pages = index.pages.peek_free(len(nodes))
        assert pages is not None
        batch = index.next_batch_id
        self._apply(ev.RestoreOpened(0, batch, None, tuple(n.id for n in nodes), tuple(pages)))
        blocks = tuple(SlabToPage(n.host_slab, n.device_page) for n in nodes)  # type: ignore[arg-type]
        return RestorePlan(batch, blocks, None, ())

    def _drop_backed_copies(self, count: int, protected: set[int]) -> None:
        """Drop up to ``count`` host-backed device copies (LRU first), skipping ``protected`` entries."""
        nodes: list[int] = []
        tails: list[int] = []
        for entry in self.index.lru.iter_lru_first(LruList.BACKED):
            if len(nodes) + len(tails) == count:
                break
            if id(entry) in protected:
                continue
            (tails if isinstance(entry, Snapshot) else nodes).append(entry.id)  # type: ignore[attr-defined]
        if nodes or tails:
            self.stats.evicted_device_events += 1
            self._apply_valued([ev.DeviceCopiesDropped(0, tuple(nodes), tuple(tails))])

    def activate(self, lane: int) -> None:
        """The engine enqueued the fork: drop the staging pin on the source snapshot. Mutates."""
        self._apply(ev.LaneActivated(0, lane))

    def restore_done(self, batch: int) -> None:
        """Every copy of restore ``batch`` landed: its nodes and tail become device resident. Mutates."""
        self._apply(ev.RestoreLanded(0, batch))

    def host_write_done(self, batch: int) -> list[SlotId]:
        """Every copy of write batch ``batch`` landed: host copies become resident. Without
        ``keep_backed_device_images``, the device copies of the batch's snapshot images are then dropped
        where nothing holds them; returns the slots that freed. Mutates."""
        images = self.index.host_writes[batch].images if batch in self.index.host_writes else ()
        self._apply(ev.HostWriteLanded(0, batch))
        freed: list[SlotId] = []
        if self.keep_backed_device_images:
            return freed
        for snap in images:
            if (
                self.index.snapshots.get(snap.id) is snap
                and snap.device_state == Residency.RESIDENT
                and snap.host_state == Residency.RESIDENT
                and snap.restore_pins == 0
            ):
                freed.append(snap.device_slot)
                self._apply(ev.SnapshotDeviceDropped(0, snap.id))
        return freed

    def block_table(self, lane: int) -> tuple[PageId, ...]:
        """Pages the lane maps, block 0 first: its staged path, then its own pages. Pure."""
        la = self.index.lanes[LaneId(lane)]
        staged = la.path[: la.base // BLOCK_TOKENS]
        return tuple(n.device_page for n in staged) + tuple(la.table)  # type: ignore[misc]

    def allocate_growth_pages(self, lane: int, count: int) -> tuple[PageId, ...] | None:
        """``count`` more private pages for the lane, evicting the device LRU (§9.5). Mutates;
        None (nothing granted) when even an empty LRU cannot supply them."""
        if not self._free_device_pages(count):
            return None
        pages = self.index.pages.peek_free(count)
        assert pages is not None
        self._apply(ev.LanePagesGranted(0, lane, tuple(pages)))
        return tuple(pages)

    def resumed_exactly(self, lane: int) -> bool:
        """Whether the lane's source snapshot and mapped path blocks are all exact
        (``cache/exactness.py``). Pure."""
        la = self.index.lanes[LaneId(lane)]
        source = None if la.resumed_from is None else self.index.snapshots.get(la.resumed_from)
        if source is not None and source.inexact:
            return False
        return not any(node.inexact for node in la.path[: la.base // BLOCK_TOKENS])

    # ------------------------------------------------------------------ block commit (§7.6)
    def commit_blocks(
        self,
        lane: int,
        tokens: Sequence[int],
        block_hashes: Sequence[int] | None = None,
        extras: Sequence[int] | None = None,
        exact_tokens: int | None = None,
    ) -> CommitResult:
        """Commit every full block of ``tokens`` (the lane's committed tokens) not yet on its path:
        Duplicate, adopt a host-only node, or insert. Blocks past the lane's first ``exact_tokens``
        positions are inexact (``cache/exactness.py``; None: exactness is not tracked, every block is
        exact): inserted as such, and an exact block replaces the copies of an inexact node no one else
        maps. An inexact block never becomes the copy of an exact node: the commit stops at an exact
        host-only node it would adopt. Disabled lanes commit nothing. Mutates."""
        index = self.index
        la = index.lanes[LaneId(lane)]
        inserted = adopted = duplicates = made_exact = 0
        if not la.enabled or not la.activated:
            return CommitResult(0, 0, 0, len(la.path))
        first_private = la.base // BLOCK_TOKENS
        for block in range(len(la.path), len(tokens) // BLOCK_TOKENS):
            if block - first_private >= len(la.table):
                break
            parent = la.path[-1] if la.path else index.root
            start = block * BLOCK_TOKENS
            chunk = tuple(tokens[start : start + BLOCK_TOKENS])
            extra = 0 if extras is None else extras[block]
            if block_hashes is not None and block < len(block_hashes):
                lookup = block_hashes[block]
            else:
                lookup = block_hash(parent.lookup_hash, chunk, extra)
            child = parent.child(lookup, chunk, extra)
            seq = index.seq + 1
            exact = block_is_exact(block, exact_tokens)
            if child is None:
                event: ev.CacheEvent = ev.BlockInserted(
                    seq, lane, index.next_node_id, lookup, chunk, extra, not exact
                )
                inserted += 1
            elif exact and child.inexact and not child.pinned:
                event = ev.BlockMadeExact(seq, lane, child.id)
                made_exact += 1
            elif child.device_state == Residency.ABSENT:
                if not exact and not child.inexact:
                    break  # the lane's page would become an exact node's only device copy
                event = ev.BlockAdopted(seq, lane, child.id)
                adopted += 1
            else:
                event = ev.BlockDuplicated(seq, lane, child.id)
                duplicates += 1
            index.apply(event)
            if self.journal is not None:
                self.journal.append(event)
        return CommitResult(inserted, adopted, duplicates, len(la.path), made_exact)
