"""``oracle``: an offline reference policy that knows every future request (Belady's rule). Not a serving
policy: it says how much of the gap between ``ours`` and the infinite-cache bound is capacity (no policy
could keep it) and how much is our choice of what to keep.

The future is the admission order of a run of ``ours`` over the same trace and settings (the pre-pass
in ``runner.py``); the oracle run admits in nearly that order (its own durations differ a little, so a
request may move past a neighbour). A 64-token block's next use is the first request, in that order and
not yet admitted, whose prompt holds it (blocks are named by their chained lookup hash, so "holds the
block" means "shares the whole prefix up to it"). A snapshot's next use is its anchor block's: the next
request that passes the snapshot's position.

Where ``ours`` values by GDSF, the oracle evicts what is needed furthest in the future (never used again
first), the shallower snapshot first among equals (the deeper one saves more for the same request):

- host room: dead KV first, exactly as ``ours`` (blocks below which no snapshot lies can serve nobody:
  a hybrid model resumes only from a state), then the host snapshot whose next use saves the least
  prefill per byte freed per request until that use (Belady for objects that differ in size and worth:
  a conversation's newest snapshot frees its whole exclusive KV path, a middle one only its image).
  Measured on four WEKA files, 2 users, a 2 GiB host (bound 715,084 tokens, ours 803,730): plain
  furthest-first computed 1,484,670, distance x bytes 859,375;
- snapshot slots: the device copy of a host-backed snapshot needed furthest away, else the device-only
  snapshot needed furthest away (deleted);
- device pages: unchanged (LRU order with write-back of reachable blocks, as ``ours``): the device
  holds the running lanes' pages first, and what it drops is written to the host, where the oracle
  decides. Placement of snapshots is the same as ``ours`` (same planner), so the comparison isolates
  what is kept.
"""

from __future__ import annotations

from collections.abc import Sequence

from hybridcache.cache import events as ev
from hybridcache.cache.cost_model import CacheCostModel
from hybridcache.cache.facade import Cache
from hybridcache.cache.geometry import CacheGeometry
from hybridcache.cache.host_eviction import dead_victims, exclusive_path_bytes, valuation_base
from hybridcache.cache.records import Residency, Snapshot
from hybridcache.cache.write_back import HostWrite

NEVER = float("inf")


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
        self._cursor: dict[int, int] = {}
        self._done: set[int] = set()

    @property
    def position(self) -> int:
        """Requests admitted so far: the present on the rank scale."""
        return len(self._done)

    def admitted(self, key: object) -> None:
        """The request ``key`` was admitted: its uses are past. Mutates."""
        rank = self.rank.get(key)
        if rank is not None:
            self._done.add(rank)

    def next_use(self, lookup_hash: int) -> float:
        """The rank of the first request not yet admitted whose prompt holds the block; NEVER if none."""
        ranks = self._uses.get(lookup_hash)
        if ranks is None:
            return NEVER
        cursor = self._cursor.get(lookup_hash, 0)
        done = self._done
        while cursor < len(ranks) and ranks[cursor] in done:
            cursor += 1
        self._cursor[lookup_hash] = cursor
        return ranks[cursor] if cursor < len(ranks) else NEVER


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

    def _needed_at(self, snap: Snapshot) -> tuple[float, int]:
        """Sort key for a device slot: larger goes first (needed later; then the shallower one)."""
        anchor = snap.anchor
        when = NEVER if anchor.parent is None else self.future.next_use(anchor.lookup_hash)
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
        size = index.geometry.image_bytes + exclusive_path_bytes(index, snap.anchor)
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
            if dead:
                events: list[ev.CacheEvent] = [ev.NodeHostDropped(0, node.id) for node in dead]
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

    def _make_slot_room(self, value: float, needs_free_slot: bool) -> bool:
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
            else:
                self._apply_valued([ev.SnapshotDeleted(0, victim.id)])
