"""Cache policies the simulator compares, all driving the same index through the same facade.

- ``ours``: the cache as the engine runs it (sparse taps, endpoints, tails, supersession, GDSF host
  eviction with the dead-KV sweep, value-ranked snapshot slots).
- ``lru``: the same snapshot placement, but plain LRU everywhere: no supersession, no GDSF, no dead-KV
  sweep. Host room goes to the least recently used host entry (a block takes its subtree with it: a
  prefix without its parent is unreachable; a snapshot image is dropped, or deleted without a device
  copy), a snapshot slot to the least recently used owner, and write-back never deletes unreachable
  blocks ahead of reachable ones (writing every evicted block, reachable or not, was measured too: 3.75x
  the bound on the WEKA set). ``LruCache`` overrides the facade's four policy hooks (``_apply_valued`` to
  drop supersession events, ``_make_slot_room``, ``_free_host_slabs``, ``_plan_write_back``) and emits
  only existing events, so the index checks every step as usual.
- ``oracle``: an offline reference that knows the future (Belady's rule for host room and snapshot
  slots, ``sim/oracle.py``); ``runner.simulate`` gives it the admission order of a run of ``ours``.
- ``align``: our eviction, but a state kept only at the last block boundary each request reaches (one
  aligned tap at finish, no prompt taps, no endpoint, no tails), as engines without sparse snapshots do.

Recency for ``lru`` is the event sequence: the simulator calls ``touch`` when a lane releases its path
and snapshots (deepest block first, so the shallow blocks are the most recent).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Sequence
from enum import StrEnum

from hybridcache.cache import events as ev
from hybridcache.cache.cost_model import CacheCostModel
from hybridcache.cache.device_eviction import subtree_removable
from hybridcache.cache.facade import Cache
from hybridcache.cache.geometry import CacheGeometry
from hybridcache.cache.ids import NodeId, SnapshotId
from hybridcache.cache.records import BlockNode, Residency, Snapshot
from hybridcache.cache.slots import room_for_hedge
from hybridcache.cache.write_back import HostWrite, WriteBackPlan, plan_write_back
from hybridcache.tools.sim.oracle import OracleCache


class Policy(StrEnum):
    OURS = "ours"
    LRU = "lru"
    ALIGN = "align"
    ORACLE = "oracle"


def make_cache(
    policy: Policy,
    geometry: CacheGeometry,
    cost: CacheCostModel,
    journal: list | None = None,
    host_write: HostWrite = HostWrite.BACK,
    hedge_budget_bytes: int | None = None,
    ours_class: type[Cache] = Cache,
) -> Cache:
    """A fresh cache for ``policy`` (``journal``: anything with ``append(event)``); every policy uses the
    same host write mode (``cache/write_back.py``) and hedge budget (``cache/hedge_admission.py``);
    ``ours_class`` is the facade ``ours`` and ``align`` run on (a subclass that observes, explain.py).
    Pure constructor."""
    cls = {Policy.LRU: LruCache, Policy.ORACLE: OracleCache}.get(policy, ours_class)
    return cls(geometry, cost, journal, host_write, hedge_budget_bytes=hedge_budget_bytes)


def hedge_room(cache: Cache) -> bool:
    """Whether a hedge tap may take a snapshot slot now (``slots.room_for_hedge``; the oracle also counts
    the slots of snapshots it knows are never used again). Pure."""
    if isinstance(cache, OracleCache):
        return cache.room_for_hedge()
    return room_for_hedge(cache.index)


def touch(cache: Cache, path: Sequence[BlockNode], snapshots: Iterable[SnapshotId]) -> None:
    """Record a use of ``path`` and ``snapshots`` for recency policies; a no-op for the others."""
    if isinstance(cache, LruCache):
        cache.touch(path, snapshots)


class LruCache(Cache):
    """The facade with plain-LRU policy hooks (see the module docstring). Not thread-safe."""

    def __init__(
        self,
        geometry: CacheGeometry,
        cost: CacheCostModel | None = None,
        journal: list | None = None,
        host_write: HostWrite = HostWrite.BACK,
        hedge_budget_bytes: int | None = None,
    ) -> None:
        super().__init__(geometry, cost, journal, host_write, hedge_budget_bytes=hedge_budget_bytes)
        self._node_order: OrderedDict[NodeId, None] = OrderedDict()
        self._snapshot_order: OrderedDict[SnapshotId, int] = OrderedDict()
        self._node_tick: dict[NodeId, int] = {}

    def touch(self, path: Sequence[BlockNode], snapshots: Iterable[SnapshotId]) -> None:
        """Move ``path`` (deepest first) and ``snapshots`` to the most recent end. Mutates the orders."""
        tick = self.index.seq
        order, ticks = self._node_order, self._node_tick
        for node in reversed(path):
            order[node.id] = None
            order.move_to_end(node.id)
            ticks[node.id] = tick
        for sid in snapshots:
            self._snapshot_order[sid] = tick
            self._snapshot_order.move_to_end(sid)

    # ------------------------------------------------------------------ facade hooks
    def _apply_valued(self, events):
        super()._apply_valued([e for e in events if not isinstance(e, ev.SnapshotSuperseded)])

    def _plan_write_back(self, pages_needed: int) -> WriteBackPlan:
        """Write-back without dead-KV reclaim: unreachable blocks are not deleted ahead of reachable ones."""
        return plan_write_back(self.index, pages_needed, delete_unreachable=False)

    def _make_slot_room(self, value: float, needs_free_slot: bool, hedge: bool = False) -> bool:
        """Plain LRU over slot owners: a hedge is no class of its own here (``hedge`` unused)."""
        index = self.index
        while True:
            room = index.slots.can_add_snapshot_class()
            if room and (not needs_free_slot or index.slots.peek_free() is not None):
                return True
            owners = [
                s
                for s in index.snapshots.values()
                if s.device_state == Residency.RESIDENT and s.restore_pins == 0
            ]
            if not owners:
                return False
            victim = min(owners, key=lambda s: (self._snapshot_order.get(s.id, -1), s.id))
            if victim.host_state == Residency.RESIDENT:
                self._apply(ev.SnapshotDeviceDropped(0, victim.id))
            else:
                self._apply(ev.SnapshotDeleted(0, victim.id))

    def _free_host_slabs(self, count: int) -> bool:
        host = self.index.host
        if host is None:
            return False
        while host.num_free < count:
            event = self._next_host_victim()
            if event is None:
                return False
            self.stats.evicted_host_events += 1
            self._apply(event)
        return True

    def _free_host_slabs_below(self, count: int, snap: Snapshot) -> bool:
        return self._free_host_slabs(count)  # LRU has no value to compare a hedge with

    # ------------------------------------------------------------------ victim choice
    def _next_host_victim(self) -> ev.CacheEvent | None:
        """The event that evicts the least recently used host entry; None when nothing can go."""
        node = self._oldest_node()
        snap = self._oldest_snapshot()
        if node is None and snap is None:
            return None
        if snap is None or (node is not None and self._node_tick[node.id] < self._snapshot_order[snap.id]):
            assert node is not None
            del self._node_order[node.id]
            return ev.SubtreeDeleted(0, node.id)
        del self._snapshot_order[snap.id]
        if snap.device_complete:
            return ev.SnapshotHostDropped(0, snap.id)
        return ev.SnapshotDeleted(0, snap.id)

    def _oldest_node(self) -> BlockNode | None:
        nodes = self.index.nodes
        order = self._node_order
        skipped: list[NodeId] = []
        busy: list[NodeId] = []
        found = None
        for node_id in order:
            node = nodes.get(node_id)
            if node is None or node.host_state != Residency.RESIDENT:
                skipped.append(node_id)  # gone, or no host copy (touched again once it has one)
            elif node.pinned or not subtree_removable(node):
                busy.append(node_id)  # in use now, so recent: to the end until its release touches it
            else:
                found = node
                break
        for node_id in skipped:
            del order[node_id]
            self._node_tick.pop(node_id, None)
        for node_id in busy:
            order.move_to_end(node_id)
        return found

    def _oldest_snapshot(self) -> Snapshot | None:
        snapshots = self.index.snapshots
        order = self._snapshot_order
        skipped: list[SnapshotId] = []
        busy: list[SnapshotId] = []
        found = None
        for sid in order:
            snap = snapshots.get(sid)
            if snap is None or snap.host_state != Residency.RESIDENT:
                skipped.append(sid)
            elif snap.restore_pins or Residency.FILLING in (snap.tail_host_state, snap.tail_device_state):
                busy.append(sid)
            else:
                found = snap
                break
        for sid in skipped:
            del order[sid]
        for sid in busy:
            order.move_to_end(sid)
        return found
