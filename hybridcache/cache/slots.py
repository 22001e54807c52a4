"""Device snapshot slot admission (§9.2). Pure: reads the index, returns events (seq 0).

Order: a free slot; a superseded owner's slot (oldest supersession first; it keeps its host copy or is
deleted); the lowest-H device-only owner, only when the new snapshot is worth at least as much (L rises
to the victim's H); the least recently hit host-backed owner's device copy. Otherwise skip.

Hedges (tap_planner's HEDGE) are the lowest class: a new hedge deletes only a device-only hedge, never
another device-only snapshot, whatever their values (a hedge guesses at an edit; the others are where
requests are known to resume), and takes a free slot only while others remain (``room_for_hedge``).

Measured (``simulate``, whole WEKA set, 27B-INT8, 64 GiB; 8/16 users, today 1.1230/3.0246): every
hedge image is refused by the host there (``auto`` budget 0), so hedges live in slots they get by
dropping host-backed device copies. Without hedges 1.1426/2.9683, and hedges only into free slots the
same (free slots are almost never there). Rejected: a hedge drops only the device copy of a middle,
superseded or hedge snapshot, never of a lineage's newest, 1.1268/3.0970; a hedge never deletes a
device-only superseded snapshot, 1.1303/3.1657.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybridcache.cache import events as ev
from hybridcache.cache.records import Residency, Snapshot, SnapshotKind

if TYPE_CHECKING:
    from hybridcache.cache.index import PrefixIndex


def _evictable_slot_owner(snap: Snapshot) -> bool:
    return snap.device_state == Residency.RESIDENT and snap.restore_pins == 0


def plan_snapshot_slot(
    index: PrefixIndex, new_value: float, needs_free_slot: bool, hedge: bool = False
) -> list[ev.CacheEvent] | None:
    """Events that make room for one more snapshot-class slot; [] if room exists, None to skip.

    ``needs_free_slot``: a tap needs a FREE slot to copy into; an endpoint only a role change within D.
    ``hedge``: the new snapshot is a hedge (it may delete only a device-only hedge).
    """
    room = index.slots.can_add_snapshot_class()
    if room and (not needs_free_slot or index.slots.peek_free() is not None):
        return []
    owners = [s for s in index.snapshots.values() if _evictable_slot_owner(s)]
    superseded = [s for s in owners if s.superseded]
    if superseded:
        victim = min(superseded, key=lambda s: (s.superseded_tick, s.id))
        if victim.host_state == Residency.RESIDENT:
            return [ev.SnapshotDeviceDropped(0, victim.id)]
        return [ev.SnapshotDeleted(0, victim.id)]
    device_only = [
        s for s in owners if s.host_state == Residency.ABSENT and (not hedge or s.kind == SnapshotKind.HEDGE)
    ]
    if device_only:
        victim = min(device_only, key=lambda s: (s.gdsf_h, s.id))
        if new_value >= victim.gdsf_h:
            out: list[ev.CacheEvent] = []
            if victim.gdsf_h > index.gdsf_l:
                out.append(ev.GdsfInflated(0, victim.gdsf_h))
            out.append(ev.SnapshotDeleted(0, victim.id))
            return out
    backed = [s for s in owners if s.host_state == Residency.RESIDENT]
    if backed:
        victim = min(backed, key=lambda s: (s.last_hit_tick, s.id))
        return [ev.SnapshotDeviceDropped(0, victim.id)]
    return None


def slots_within_reach(index: PrefixIndex) -> int:
    """Snapshot slots a tap can have now without deleting a live device-only snapshot: the free ones, and
    those whose owner is superseded or has its host copy (``plan_snapshot_slot`` takes these first).
    Pure."""
    slots = index.slots
    releasable = sum(
        1
        for s in index.snapshots.values()
        if _evictable_slot_owner(s) and (s.superseded or s.host_state == Residency.RESIDENT)
    )
    return slots.max_snapshot - slots.num_snapshot_class + releasable


def room_for_hedge(index: PrefixIndex) -> bool:
    """A hedge tap may take a snapshot slot only while another stays within reach of the lane's later taps
    (its prompt tail, its endpoint): a slot free within D, or one more held by a snapshot whose host copy is
    complete (dropping that device copy loses nothing). A hedge must never cost the tail its slot: a
    skipped tail lets the endpoint publish off the block grid (the tail's proximity rule no longer drops
    it), and a resume there is not bit-exact. Pure."""
    slots = index.slots
    spare = slots.max_snapshot - slots.num_snapshot_class
    if spare >= 2:
        return True
    backed = sum(
        1 for s in index.snapshots.values() if _evictable_slot_owner(s) and s.host_state == Residency.RESIDENT
    )
    return spare + backed >= 2

