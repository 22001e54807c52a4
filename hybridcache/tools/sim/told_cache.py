"""``simulate --told``: ``ours`` told in hindsight which host snapshots nobody will resume from.

It asks how far ``ours`` is from a target because it cannot tell what a server cannot know. The host tier
takes its victims first among the snapshots it is told are dead (hindsight.py: no later request would
resume there), the lowest H among them; while none is left it decides as ``ours`` does, recency floor
included. Told:

- ``ended``: the dead snapshots of conversations that have sent their last request. A server cannot tell
  an ended conversation from an idle one that will return (both stopped talking; ``--explain`` finds
  about a third of the 64 GiB tier at 8 users is ended conversations' KV when needed snapshots go).
- ``dead``: every dead snapshot, also a live conversation's checkpoints and branches it will not resume
  from.

A told eviction neither raises GDSF's L (a told victim's H says nothing about the others': raised to it,
the ``ended`` run below computed 1.139x, more than untold) nor feeds the recency floor's gate (which
reads deletions of young state as overload; fed, 1.074x). Measured on the whole WEKA set (27B-INT8,
8 users, x the infinite-cache bound, host 64 GiB and 64 MiB either side): untold 1.0849 / 1.0875 /
1.0932, ``ended`` 1.0439 / 1.0673 / 1.0470; ``dead`` 1.0246 at 64 GiB (16 users: untold 1.9606, ``dead``
1.6301, ``--policy oracle`` 1.7934).

Two runs of ``ours`` over the same trace and settings, as ``--explain``: the first gives the admission
order. A verdict is memoized per snapshot and set of dependents for ``RECHECK`` admissions (a snapshot
becomes dead as requests are admitted; it becomes needed again only when a dependent goes, which changes
the key), so a told run may keep a newly dead snapshot a few admissions longer. Mutable; not a serving
policy.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from enum import StrEnum
from typing import Any

from hybridcache.cache import events as ev
from hybridcache.cache.facade import Cache
from hybridcache.cache.host_eviction import plan_host_room
from hybridcache.cache.ids import SnapshotId
from hybridcache.cache.records import Snapshot
from hybridcache.tools.sim.hindsight import Hindsight
from hybridcache.tools.sim.oracle import FutureUses

RECHECK = 16  # admissions a verdict stands for


class Told(StrEnum):
    ENDED = "ended"
    DEAD = "dead"


class ToldCache(Cache):
    """The facade whose host room takes told-dead snapshots first (see the module docstring)."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.hindsight = Hindsight()
        self.told = Told.DEAD
        self._verdicts: dict[tuple[int, ...], tuple[bool, int]] = {}  # (snapshot, dependents) -> verdict

    @property
    def future(self) -> FutureUses:
        return self.hindsight.future

    def know_future(self, admitted: Sequence[tuple[Any, Sequence[int]]], told: Told) -> None:
        """The admission order (``Hindsight.know``) and what the host is told. Mutates."""
        self.hindsight.know(admitted)
        self.told = told
        self._verdicts.clear()

    def told_dead(self, snap: Snapshot) -> bool:
        """Whether the host is told ``snap`` is dead (memoized, see the module docstring)."""
        position = self.future.position
        key = (snap.id, *snap.dependents)
        memo = self._verdicts.get(key)
        if memo is not None and position - memo[1] < RECHECK:
            return memo[0]
        hindsight = self.hindsight
        verdict = hindsight.dead(snap) and (self.told is Told.DEAD or hindsight.ended(snap.anchor))
        self._verdicts[key] = (verdict, position)
        return verdict

    def _host_room_step(
        self, count: int, denser_than: float | None, release_pinned: bool
    ) -> list[ev.CacheEvent] | None:
        """Told-dead snapshots go first, applied here; then ours's step (see the module docstring)."""
        alive: Callable[[Snapshot], bool] = lambda s: not self.told_dead(s)  # noqa: E731
        while True:
            # the lowest H among the told-dead, or, when none is left, among all (alive spares all)
            events = plan_host_room(self.index, count, denser_than, release_pinned, alive)
            victim = self._victim(events)
            if victim is None or not self.told_dead(victim):
                break
            self._apply_told([e for e in events if not isinstance(e, ev.GdsfInflated)])
        floor = None if victim is None else self._spared()
        if floor is None:  # a KV step, the room made, or no floor: the step ours takes
            return events
        return plan_host_room(self.index, count, denser_than, release_pinned, floor)

    def _apply_told(self, events: list[ev.CacheEvent]) -> None:
        """Apply a told victim's events unseen by the recency floor: its gate reads deletions of young
        state as overload, and a told deletion is no such sign."""
        self.stats.evicted_host_events += len(events)
        now, self.now = self.now, None
        try:
            self._apply_valued(events)
        finally:
            self.now = now

    def _victim(self, events: list[ev.CacheEvent] | None) -> Snapshot | None:
        """The snapshot a host-room step deletes or drops the host copy of; None for a KV step."""
        for event in events or ():
            if isinstance(event, (ev.SnapshotDeleted, ev.SnapshotHostDropped)):
                return self.index.snapshots[SnapshotId(event.snapshot)]
        return None
