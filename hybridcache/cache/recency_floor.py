"""The recency floor: under sustained overload, the host spares what conversations finished recently.

When the cache turns over faster than conversations come back, GDSF keeps a few dense, long-idle
lineages and loses the state of conversations that are still talking: each returns minutes later to find
its unit gone, recomputes it, holds its lane longer, and the queue behind it grows (the 16-user cliff of
``hybridcache simulate`` on the WEKA set). The floor changes one thing while it is on: the host's victim
is chosen among snapshots no request finished with in the last ``WINDOW_S`` seconds, while any exist,
so the tier keeps a stable set of active conversations and lets the older ones go.

It switches itself on from what it sees the tier delete: of the last ``GATE_DELETIONS`` deletions of a
deep lineage's newest snapshot (over ``DEEP_TOKENS``) made while it was off, the median came under
``YOUNG_S`` after its request finished: the tier is deleting conversations minutes after they spoke.
Then it stays on for ``WINDOW_S``. Measured with ``hybridcache simulate`` on the whole WEKA set
(27B-INT8, x the infinite-cache bound, host 64 GiB and 64 MiB either side; figures in the issue notes):
16 users 2.88-3.11 without it, 1.92-2.00 with it; 14 users 1.63 -> 1.54; 8 users 1.0919 -> 1.0875.
The price: at 12 users 1.31-1.40 without it (one run moves by 5 % with 64 MiB of host), 1.382-1.386
with it, 3 % more on average; the Mooncake conversation trace 1.500 -> 1.525. Gated on queue waits or
on ghost hits of recent victims instead, it cost 3-8 % at 12 users; a stricter gate (20 deletions, a
median under 120 s) lost the 16-user gain.

Time comes from the owner (``Cache.now``: the worker's monotonic clock, the simulator's clock); the cache
never reads a clock, and without a time the floor stays off. Policy state only: nothing here is an event,
and a restart begins with the floor off and nothing spared.
"""

from __future__ import annotations

from collections import OrderedDict, deque
from collections.abc import Callable, Iterable

from hybridcache.cache.ids import SnapshotId
from hybridcache.cache.lineage_unit import unit_of
from hybridcache.cache.records import Snapshot, SnapshotKind

WINDOW_S = 300.0
"""Seconds a finished request's snapshots are spared while the floor is on, and the floor stays on."""

YOUNG_S = 300.0
"""A deletion this soon after the snapshot's request finished counts toward switching the floor on."""

GATE_DELETIONS = 10
"""Deletions of deep lineages' newest snapshots whose median age decides."""

DEEP_TOKENS = 20_000
"""Lineages shorter than this do not count: short ones come and go at any load."""


class RecencyFloor:
    """Finish times of recent requests' snapshots, and whether the floor is on. Mutated by the facade."""

    def __init__(self) -> None:
        self._finished: OrderedDict[SnapshotId, float] = OrderedDict()  # oldest first
        self._ages: deque[float] = deque(maxlen=GATE_DELETIONS)
        self._on_since = float("-inf")
        self.switched_on = 0  # times the gate fired (stats)

    def is_on(self, now: float) -> bool:
        return now - self._on_since < WINDOW_S

    def finished(self, snapshots: Iterable[SnapshotId], now: float) -> None:
        """A request finished with ``snapshots`` (its unit, what it published) at ``now``."""
        finished = self._finished
        for sid in snapshots:
            finished[sid] = now
            finished.move_to_end(sid)
        horizon = now - max(WINDOW_S, YOUNG_S)  # older ones neither spared nor young: forget them
        while finished:
            sid, at = next(iter(finished.items()))
            if at >= horizon:
                break
            del finished[sid]

    def deleted(self, snap: Snapshot, now: float) -> None:
        """``snap`` is about to be deleted: a deep lineage's newest one counts toward the gate."""
        at = self._finished.pop(snap.id, None)
        shallow = snap.frontier <= DEEP_TOKENS
        if snap.kind == SnapshotKind.HEDGE or snap.dependents or shallow or self.is_on(now):
            return
        ages = self._ages
        ages.append(float("inf") if at is None else now - at)
        if len(ages) == GATE_DELETIONS and sorted(ages)[GATE_DELETIONS // 2] < YOUNG_S:
            self._on_since = now
            self.switched_on += 1
            ages.clear()

    def spared(self, now: float) -> Callable[[Snapshot], bool] | None:
        """While on: whether a snapshot is spared as a host victim (its request finished within
        ``WINDOW_S``); None while off."""
        if not self.is_on(now):
            return None
        finished, since = self._finished, now - WINDOW_S
        return lambda snap: finished.get(snap.id, float("-inf")) > since


def finished_unit(endpoint: Snapshot, base: int) -> list[SnapshotId]:
    """What a request that resumed at ``base`` and finished with ``endpoint`` leaves to be spared: the
    endpoint's unit (its newest and checkpoints) and the snapshots it published past ``base``. Pure."""
    unit = unit_of(endpoint)
    if unit is None:
        return [endpoint.id]
    return [s.id for s in unit.chain if s.id in unit.kept or s.frontier > base]
