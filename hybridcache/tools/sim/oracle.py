"""``oracle``: an offline reference policy that knows every future request (Belady's rule). Not a serving
policy: it says how much of the gap between ``ours`` and the infinite-cache bound is capacity (no policy
could keep it) and how much is our choice of what to keep.

The future is the admission order of a run of ``ours`` over the same trace and settings (the pre-pass
in ``runner.py``); the oracle run admits in nearly that order (its own durations differ a little, so a
request may move past a neighbour). A 64-token block's next use is the first request, in that order and
not yet admitted, whose prompt holds it (blocks are named by their chained lookup hash, so "holds the
block" means "shares the whole prefix up to it"). A snapshot's next use is the next request that passes
its anchor block but none of the anchors of the snapshots just below it (its dependents): a request that
reaches a deeper snapshot resumes there, so the middle snapshots of a conversation are needed only by a
request diverging between them and the next one (an edit, a retry, a sub-agent), not by every later
turn. (Counting every request that passes the anchor kept middle snapshots that nobody restores from:
on the first 20 WEKA files, 4 users, 64 GiB, that oracle computed 5,608,275 tokens, more than ours's
5,564,185.)

Where ``ours`` values by GDSF, the oracle evicts what is needed furthest in the future (never used again
first), the shallower snapshot first among equals (the deeper one saves more for the same request):

- host room: dead KV first, then the host copies that running lanes' pinned device copies duplicate,
  exactly as ``ours`` (blocks below which no snapshot lies can serve nobody: a hybrid model resumes only
  from a state; a pinned block's device copy is the one in use), then the host snapshot whose next use
  saves the least prefill per byte freed per request until that use (Belady for objects that differ in
  size and worth: a deleted snapshot frees its image and its whole exclusive KV path, dropping the host
  image of one that keeps a device copy only the image: the device copy still needs its path).
  Measured on four WEKA files, 2 users, a 2 GiB host (bound 715,084 tokens, ours 803,730): plain
  furthest-first computed 1,484,670, distance x bytes 859,375;
- snapshot slots: the device copy of a host-backed snapshot needed furthest away (nothing is lost),
  else the device-only snapshot needed furthest away is deleted, unless the snapshot asking for the
  slot is needed later still (Belady with bypass: the tap or endpoint is skipped). A hedge tap may take
  a slot while the tail keeps one (as ``slots.room_for_hedge``), counting device-only snapshots that are
  never used again as free;
- device pages: unchanged (LRU order with write-back of reachable blocks, as ``ours``): the device
  holds the running lanes' pages first, and what it drops is written to the host, where the oracle
  decides. Placement of snapshots is the same as ``ours`` (same planner), so the comparison isolates
  what is kept.

It is a heuristic, not a proof of optimality (offline caching with sizes and dependencies is NP-hard,
and device pages stay LRU): ``--sweep-users`` prints ``ours_vs_oracle`` so a run where it computes more
than ``ours`` shows.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence

from hybridcache.cache import events as ev
from hybridcache.cache.cost_model import CacheCostModel
from hybridcache.cache.facade import Cache
from hybridcache.cache.facade_results import FinishResult, TapResult
from hybridcache.cache.geometry import CacheGeometry
from hybridcache.cache.host_eviction import (
    dead_victims,
    exclusive_path_bytes,
    pinned_duplicates,
    valuation_base,
)
from hybridcache.cache.ids import BLOCK_TOKENS, SnapshotId
from hybridcache.cache.match import PromptInput, Quote
from hybridcache.cache.records import Lane, Residency, Snapshot
from hybridcache.cache.slots import room_for_hedge
from hybridcache.cache.write_back import HostWrite

NEVER = float("inf")
SCAN_LIMIT = 512  # future requests looked at per snapshot valuation (FutureUses.next_use)


class FutureUses:
    """Per block lookup hash, the ranks (admission order) of the requests whose prompts hold it. Mutated
    by ``admitted``."""

    def __init__(self, prompts: Sequence[tuple[object, Sequence[int]]]) -> None:
        """``prompts``: (request key, the chained lookup hashes of its full prompt blocks), in the order
        the requests will be admitted."""
        self.rank: dict[object, int] = {}
        uses: dict[int, list[int]] = {}
        for rank, (key, hashes) in enumerate(prompts):
            self.rank[key] = rank
            for value in hashes:
                uses.setdefault(value, []).append(rank)
        self._uses = uses
        self._prompts = [hashes for _, hashes in prompts]
        self._cursor: dict[int, int] = {}
        self._done: set[int] = set()
        self._arriving: int | None = None  # rank of the request being admitted now

    def arriving(self, key: object) -> None:
        """The request ``key`` is being admitted: a snapshot it takes is next used by a later one. Mutates."""
        self._arriving = self.rank.get(key)

    @property
    def position(self) -> int:
        """Requests admitted so far: the present on the rank scale."""
        return len(self._done)

    def admitted(self, key: object) -> None:
        """The request ``key`` was admitted: its uses are past. Mutates."""
        rank = self.rank.get(key)
        if rank is not None:
            self._done.add(rank)
        self._arriving = None

    def last_holder(self, lookup_hash: int) -> int | None:
        """The rank of the latest request before the present (``position``) whose prompt holds the block,
        None if none did (exact in a run that admits in this order, as explain.py's). Pure."""
        ranks = self._uses.get(lookup_hash)
        if not ranks:
            return None
        before = bisect_left(ranks, self.position)
        return ranks[before - 1] if before else None

    def next_use(
        self, lookup_hash: int, deeper: Sequence[tuple[int, int]] = (), *, after_arriving: bool = False
    ) -> float:
        """The rank of the first request not yet admitted whose prompt holds the block but none of the
        ``deeper`` blocks ((depth, lookup hash) pairs: the anchors of the snapshots just below one anchored
        at this block; such a request resumes from one of those instead); NEVER if none. With
        ``after_arriving`` the request being admitted does not count (a snapshot it publishes serves later
        ones). Looks at most ``SCAN_LIMIT`` requests, then answers the last one looked at (the use is at
        least that far). Moves only the cursor past admitted requests."""
        ranks = self._uses.get(lookup_hash)
        if ranks is None:
            return NEVER
        cursor = self._cursor.get(lookup_hash, 0)
        done = self._done
        while cursor < len(ranks) and ranks[cursor] in done:
            cursor += 1
        self._cursor[lookup_hash] = cursor
        skip = self._arriving if after_arriving else None
        prompts = self._prompts
        end = min(len(ranks), cursor + SCAN_LIMIT)
        for position in range(cursor, end):
            rank = ranks[position]
            if rank in done or rank == skip:
                continue
            if not deeper:
                return rank
            hashes = prompts[rank]
            if not any(depth < len(hashes) and hashes[depth] == value for depth, value in deeper):
                return rank
        return NEVER if end == len(ranks) else ranks[end - 1]


class OracleCache(Cache):
    """The facade with Belady choices for host room and snapshot slots (see the module docstring)."""

    def __init__(
        self,
        geometry: CacheGeometry,
        cost: CacheCostModel | None = None,
        journal: list | None = None,
        host_write: HostWrite = HostWrite.BACK,
        hedge_budget_bytes: int | None = None,
    ) -> None:
        super().__init__(geometry, cost, journal, host_write, hedge_budget_bytes=hedge_budget_bytes)
        self.future = FutureUses(())
        self._hashes: Sequence[int] | None = None  # block hashes of the request quoted or finishing last
        self._incoming: int | None = None  # frontier of the snapshot asking for a slot, while it asks
        self._prompt_blocks = 0  # full blocks of that request's prompt (of all its tokens at finish)
        self._memo: dict[tuple[int, ...], float] = {}  # (snapshot, its dependents) -> next use, while
        self._memo_position = -1  # no request is admitted (the future does not move)

    def _needed_at(self, snap: Snapshot) -> tuple[float, int]:
        """Sort key for a device slot: larger goes first (needed later; then the shallower one). A
        snapshot is needed by the next request that reaches it but none of the snapshots just below it
        (a request holding a deeper one resumes there)."""
        anchor = snap.anchor
        if anchor.parent is None:
            return NEVER, -snap.frontier
        future = self.future
        if self._memo_position != future.position:
            self._memo.clear()  # requests were admitted: every answer may have moved
            self._memo_position = future.position
        key = (snap.id, *snap.dependents)
        when = self._memo.get(key)
        if when is None:
            deeper = [(d.anchor.depth, d.anchor.lookup_hash) for d in snap.dependents.values()
                      if d.anchor is not anchor]
            when = self._memo[key] = future.next_use(anchor.lookup_hash, deeper)
        return when, -snap.frontier

    def _host_victim_key(self, snap: Snapshot) -> tuple[float, int]:
        """Sort key for the host tier, whose entries differ in size and worth by orders of magnitude: the
        prefill its next use saves (over the snapshot above it, as GDSF values it) per host byte its
        eviction frees (image, tail, and the KV path below which no other snapshot lies) per request
        until that use; smaller goes first, never used again first of all."""
        when, shallower = self._needed_at(snap)
        if when == NEVER:
            return 0.0, shallower
        index = self.index
        size = index.geometry.image_bytes
        if not snap.device_complete:  # deleted: its exclusive path dies with it (a device copy keeps it)
            size += exclusive_path_bytes(index, snap.anchor)
        if snap.tail_tokens:
            size += index.geometry.slab_bytes
        base = valuation_base(snap)
        saved = self.cost.prefill_seconds(base, snap.frontier - base)
        return saved / size / max(when - self.future.position, 1.0), shallower

    def _free_host_slabs(self, count: int) -> bool:
        return self._free_host_slabs_below(count, None)

    def _free_host_slabs_below(self, count: int, snap: Snapshot | None) -> bool:
        """Host room by the oracle's key; with ``snap`` (a hedge) only over victims worth less than it by
        that key, as ours admits hedges by H."""
        index = self.index
        host = index.host
        if host is None:
            return False
        limit = None if snap is None else self._host_victim_key(snap)
        while host.num_free < count:
            dead = dead_victims(index, count - host.num_free)
            release_pinned = snap is None and not dead and self.host_write is HostWrite.BACK
            duplicates = pinned_duplicates(index, count - host.num_free) if release_pinned else []
            if dead:
                events: list[ev.CacheEvent] = [ev.NodeHostDropped(0, node.id) for node in dead]
            elif duplicates:
                events = [ev.PinnedHostCopiesDropped(0, tuple(node.id for node in duplicates))]
            else:
                candidates = [s for s in index.snapshots.values()
                              if s.restore_pins == 0 and s.host_state == Residency.RESIDENT]
                if not candidates:
                    return False
                victim = min(candidates, key=lambda s: (self._host_victim_key(s), s.id))
                if limit is not None and self._host_victim_key(victim) >= limit:
                    return False
                events = [ev.SnapshotHostDropped(0, victim.id) if victim.device_complete
                          else ev.SnapshotDeleted(0, victim.id)]
            self.stats.evicted_host_events += len(events)
            self._apply_valued(events)
        return True

    # ------------------------------------------------------------------ snapshot slots
    def quote(self, prompt: PromptInput) -> Quote:
        self._hashes = prompt.block_hashes  # the request whose taps come next
        self._prompt_blocks = len(prompt.tokens) // BLOCK_TOKENS
        return super().quote(prompt)

    def finish(self, lane: int, tokens: Sequence[int], block_hashes: Sequence[int] | None = None,
               *args, **kwargs) -> FinishResult:
        self._hashes = block_hashes  # the request whose endpoint comes next
        self._prompt_blocks = len(tokens) // BLOCK_TOKENS
        return super().finish(lane, tokens, block_hashes, *args, **kwargs)

    def take_tap(self, lane: int, position: int, boundary: bool = False, hedge: bool = False) -> TapResult:
        self._incoming = position
        try:
            return super().take_tap(lane, position, boundary, hedge)
        finally:
            self._incoming = None

    def _publish_endpoint(self, la: Lane, tokens: Sequence[int], exact_tokens: int | None,
                          inexact_endpoint: bool) -> tuple[SnapshotId | None, str | None]:
        self._incoming = len(tokens)
        try:
            return super()._publish_endpoint(la, tokens, exact_tokens, inexact_endpoint)
        finally:
            self._incoming = None

    def _incoming_use(self) -> float | None:
        """When the snapshot about to take a slot (a tap or an endpoint at ``_incoming``) is next used;
        None when unknown."""
        hashes, position = self._hashes, self._incoming
        if hashes is None or position is None or position < BLOCK_TOKENS:
            return None
        block = position // BLOCK_TOKENS - 1
        if block >= len(hashes):
            return None
        last = min(self._prompt_blocks, len(hashes)) - 1  # a request reaching it resumes deeper
        deeper = [(last, int(hashes[last]))] if last > block else []
        return self.future.next_use(int(hashes[block]), deeper, after_arriving=True)

    def room_for_hedge(self) -> bool:
        """``slots.room_for_hedge``, counting as spare the device-only snapshots no request will use
        again (deleting one loses nothing, so a hedge never costs the tail its slot there either)."""
        if room_for_hedge(self.index):
            return True
        slots = self.index.slots
        spare = slots.max_snapshot - slots.num_snapshot_class
        for snap in self.index.snapshots.values():
            if (snap.device_state == Residency.RESIDENT and snap.restore_pins == 0
                    and (snap.host_state == Residency.RESIDENT or self._needed_at(snap)[0] == NEVER)):
                spare += 1
                if spare >= 2:
                    return True
        return False

    def _make_slot_room(self, value: float, needs_free_slot: bool, hedge: bool = False) -> bool:
        """Belady with bypass: drop the device copy of a host-backed snapshot needed furthest away
        (nothing is lost), else delete the device-only snapshot needed furthest away, unless the incoming
        one is needed later still (then it is skipped instead). Knowing every next use, it needs no class
        for hedges (``hedge`` unused)."""
        index = self.index
        while True:
            room = index.slots.can_add_snapshot_class()
            if room and (not needs_free_slot or index.slots.peek_free() is not None):
                return True
            owners = [s for s in index.snapshots.values()
                      if s.device_state == Residency.RESIDENT and s.restore_pins == 0]
            if not owners:
                return False
            backed = [s for s in owners if s.host_state == Residency.RESIDENT]
            victim = max(backed or owners, key=lambda s: (self._needed_at(s), -s.id))
            if victim.host_state == Residency.RESIDENT:
                self._apply_valued([ev.SnapshotDeviceDropped(0, victim.id)])
                continue
            incoming = self._incoming_use()
            if incoming is not None and incoming > self._needed_at(victim)[0]:
                return False
            self._apply_valued([ev.SnapshotDeleted(0, victim.id)])
