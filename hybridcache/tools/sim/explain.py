"""``simulate --explain``: what the host tier held whenever ``ours`` deleted a snapshot that a later
request needed. It tells a policy loss (the tier was full of things nobody uses again) from a capacity
loss (it was full of things somebody needs).

Two runs of ``ours`` over the same trace and settings: the first gives the admission order (the future, as for
``oracle``, read by hindsight.py); the second watches every event before it is applied. A ``SnapshotDeleted``
whose snapshot a request within ``HORIZON`` admissions needs (``FutureUses``' rule: the request passes the
snapshot's anchor but no dependent's anchor, so it would resume there) is counted by what the snapshot was: a
hedge (tap_planner's HEDGE; for the 27B shapes device-only by design, the hedge budget being 0), else by its
place in its lineage: the newest (no dependents), the parent of a newest one, or a deeper middle; and by
whether it had a host image (the host planner deleted it) or not (the device slot planner did). Every
``SAMPLE_EVERY``-th such deletion of a lineage snapshot (hedges go for device slots, not host room)
takes a census of the host: image bytes of snapshots that no later request needs against needed ones,
and bytes of host KV blocks that no later prompt holds against the rest; of the never-needed bytes, those
whose last user is a conversation that has sent its last request (a *finished* one: its state looks to a
server like that of an idle conversation that will return). A census walks every snapshot and node, so
it is sampled. Mutable; not a serving policy.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from typing import Any

import msgspec

from hybridcache.cache import events as ev
from hybridcache.cache.facade import Cache
from hybridcache.cache.records import Snapshot, SnapshotKind
from hybridcache.tools.sim.hindsight import Hindsight
from hybridcache.tools.sim.oracle import NEVER, FutureUses

HORIZON = 50  # admissions: a deletion of a snapshot needed within this many requests is counted
SAMPLE_EVERY = 4  # one census per this many counted deletions of lineage snapshots
MIB = float(1 << 20)


class ExplainReport(msgspec.Struct, frozen=True, kw_only=True):
    """The counts and the median census (MiB) over the sampled deletions."""

    needed_deleted_hedge: int  # a hedge
    needed_deleted_newest: int  # the newest snapshot of its lineage
    needed_deleted_parent: int  # the parent of a newest snapshot
    needed_deleted_middle: int  # deeper in a lineage
    needed_deleted_device_only: int  # of all four: no host image (deleted for a device slot)
    censuses: int
    host_images_never_needed_mib: float
    host_images_needed_mib: float
    host_kv_never_needed_mib: float
    host_kv_needed_mib: float
    host_images_of_finished_mib: float  # of the never-needed images: last used by a finished conversation
    host_kv_of_finished_mib: float  # of the never-needed host KV: the same


class CensusCache(Cache):
    """``ours`` (the plain facade) that takes the census above before each deletion is applied."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.hindsight = Hindsight()
        self._roles = {"hedge": 0, "newest": 0, "parent": 0, "middle": 0}
        self._device_only = 0
        self._counted = 0  # deletions of lineage snapshots (not hedges)
        self._samples: list[tuple[float, ...]] = []

    @property
    def future(self) -> FutureUses:
        return self.hindsight.future

    def know_future(self, admitted: Sequence[tuple[Any, Sequence[int]]]) -> None:
        """The admission order to watch (``Hindsight.know``). Mutates."""
        self.hindsight.know(admitted)

    def _apply(self, event: ev.CacheEvent) -> None:
        if isinstance(event, ev.SnapshotDeleted):
            snap = self.index.snapshots.get(event.snapshot)  # type: ignore[call-overload]
            if snap is not None:
                self._deleting(snap)
        super()._apply(event)

    def _deleting(self, snap: Snapshot) -> None:
        when = self.hindsight.needed_at(snap)
        if when == NEVER or when - self.future.position > HORIZON:
            return
        if snap.kind == SnapshotKind.HEDGE:
            role = "hedge"
        elif not snap.dependents:
            role = "newest"
        elif any(not d.dependents for d in snap.dependents.values()):
            role = "parent"
        else:
            role = "middle"
        self._roles[role] += 1
        self._device_only += not snap.host_slabs
        if role == "hedge":
            return
        if self._counted % SAMPLE_EVERY == 0:
            self._samples.append(self._census())
        self._counted += 1

    def _census(self) -> tuple[float, ...]:
        index = self.index
        image, slab = index.geometry.image_bytes, index.geometry.slab_bytes
        images_never = images_needed = kv_never = kv_needed = images_finished = kv_finished = 0
        for snap in index.snapshots.values():
            if snap.host_slabs:
                if self.hindsight.needed_at(snap) == NEVER:
                    images_never += image
                    images_finished += image * self.hindsight.ended(snap.anchor)
                else:
                    images_needed += image
        for node in index.nodes.values():
            if node.host_slab is not None and node.parent is not None:
                if self.future.next_use(node.lookup_hash) == NEVER:
                    kv_never += slab
                    kv_finished += slab * self.hindsight.ended(node)
                else:
                    kv_needed += slab
        counted = (images_never, images_needed, kv_never, kv_needed, images_finished, kv_finished)
        return tuple(value / MIB for value in counted)

    def report(self) -> ExplainReport:
        """The counts and medians so far. Pure."""
        columns = list(zip(*self._samples, strict=True)) if self._samples else [(0.0,)] * 6
        medians = [statistics.median(column) for column in columns]
        return ExplainReport(
            needed_deleted_hedge=self._roles["hedge"],
            needed_deleted_newest=self._roles["newest"],
            needed_deleted_parent=self._roles["parent"],
            needed_deleted_middle=self._roles["middle"],
            needed_deleted_device_only=self._device_only,
            censuses=len(self._samples),
            host_images_never_needed_mib=medians[0],
            host_images_needed_mib=medians[1],
            host_kv_never_needed_mib=medians[2],
            host_kv_needed_mib=medians[3],
            host_images_of_finished_mib=medians[4],
            host_kv_of_finished_mib=medians[5],
        )
