"""Hedge snapshots valued against their memory: host admission and the hedge byte budget. Pure.

A hedge (``SnapshotKind.HEDGE``, tap_planner's HEDGE source) is a state a few hundred to 2,048 tokens
before a prompt end, kept in case the next request edits or regenerates the prompt's last message. It
is a bet that usually loses: the next request of the conversation normally extends the prompt and
resumes at its endpoint. Each image costs a whole state (147 MiB for the 27B-INT8 shape, 19.7 MB for
``small``), so two rules keep hedges from crowding out what the tier holds for sure:

- **Admission by value.** A hedge's image is written to the host only into free room or over the
  victim host eviction would take anyway (the lowest GDSF H, ``host_eviction.plan_host_room``) when
  that victim is worth less per byte than the hedge: never over something more valuable. "Per byte" is
  H's density term without L (``host_eviction.density_term``): GDSF's L inflation ranks recency, and
  by recency alone a fresh hedge outranks every idle conversation's endpoint however much prefill that
  endpoint saves. (Measured on the first 12 WEKA files at 8 users, the two rules came out alike, 1.0663
  by H and 1.0670 by density, both above the 1.0469 of keeping hedge images off the host; what costs
  there is not this choice, see ``auto_hedge_budget``.) An ordinary snapshot's write is never refused
  (see host_eviction's note); a refused hedge stays device-only until slot pressure takes it. A hedge is
  valued against the snapshot just above it (``host_eviction.valuation_base``): what it alone saves a
  request diverging between the two.
- **A byte budget.** The host images of all hedges together stay within ``budget`` bytes; a new hedge
  displaces older hedges worth less than it, or is not written.

A hedge is not deleted when a later request of its conversation resumes past it: a prompt's end is
often a fork point other requests still reach (two sub-agents spawned from one context, a first
prompt's preamble that other conversations share), so only the budget and host eviction retire it.

Measured with ``hybridcache simulate`` (see the README's simulate section and the hedge-budget notes).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybridcache.cache import events as ev
from hybridcache.cache.ids import BLOCK_TOKENS
from hybridcache.cache.records import Residency, Snapshot, SnapshotKind

if TYPE_CHECKING:
    from hybridcache.cache.geometry import CacheGeometry
    from hybridcache.cache.index import PrefixIndex

_HEDGE = SnapshotKind.HEDGE
_ABSENT = Residency.ABSENT

AUTO_HEDGE_HOST_SHARE = 1 / 16
"""The share of the host tier the ``auto`` budget gives hedges whose images are worth their bytes."""

NEAREST_HEDGE_TOKENS = 256
"""The nearest hedge distance (tap_planner's): the fewest tokens a hedge saves over the prompt's tail."""


def auto_hedge_budget(image_bytes: int, host_bytes: int, page_bytes: int) -> int:
    """The ``auto`` hedge budget in bytes: 0 when a hedge image takes more host bytes than the KV of the
    ``NEAREST_HEDGE_TOKENS`` it saves (then a hedge saves fewer tokens per host byte than the KV blocks
    it would displace: the 27B-INT8 shape's image is 86 pages, ``small``'s 28), else
    ``AUTO_HEDGE_HOST_SHARE`` of the tier (``tiny``'s image, pending tail included, is 3.3 pages). With
    0 hedges stay device-only: they still serve a request that comes while their slot lasts.

    No per-lane count: a hedge is worth keeping as long as a sibling or another conversation can still
    diverge at it, and a few images per lane let later prompts' hedges displace a sub-agent's spawn
    point before its next sibling arrives (live, trace_0291).

    Measured with ``simulate`` (27B-INT8, 64 GiB, 8 users): the whole WEKA set computes 1.104x the bound
    without hedges and 1.160x with every hedge image on the host; the first 12 files 1.044x without,
    1.047x with a zero budget, 1.066-1.067x with 1 GiB, 2.4 GiB (two images a lane) or no limit, by H
    or by density. Live on ``tiny`` hedges took the four-conversation replay from 1.044x to 1.015x. Pure.
    """
    if image_bytes > page_bytes * (NEAREST_HEDGE_TOKENS // BLOCK_TOKENS):
        return 0
    return int(host_bytes * AUTO_HEDGE_HOST_SHARE)


def resolve_hedge_budget(budget: int | str, geometry: CacheGeometry) -> int:
    """``--cache-hedge-budget`` in bytes: ``auto`` by ``auto_hedge_budget`` for this geometry (a hedge
    image's host bytes, the host tier's), else the number given. Pure."""
    if budget != "auto":
        return int(budget)
    image = geometry.image_slabs * geometry.slab_bytes
    return auto_hedge_budget(image, geometry.host_cache_bytes, geometry.page_bytes)


def hedge_image_bytes(index: PrefixIndex, snap: Snapshot) -> int:
    """Host bytes ``snap``'s image and tail take once written. Pure."""
    geometry = index.geometry
    return geometry.image_slabs * geometry.slab_bytes + (geometry.slab_bytes if snap.tail_tokens else 0)


def hedge_host_bytes(index: PrefixIndex) -> int:
    """Host bytes held (or being written) by hedge images and tails. Pure."""
    total = 0
    for snap in index.snapshots.values():
        if snap.kind == _HEDGE and snap.host_state != _ABSENT:
            total += hedge_image_bytes(index, snap)
    return total


def _evictable(snap: Snapshot) -> bool:
    return snap.kind == _HEDGE and snap.restore_pins == 0 and snap.host_state == Residency.RESIDENT


def plan_hedge_budget(
    index: PrefixIndex, nbytes: int, pending_bytes: int, budget: int, value: float
) -> list[ev.CacheEvent] | None:
    """One step toward room for ``nbytes`` more hedge bytes within ``budget`` (``pending_bytes``: hedge
    bytes already chosen for the same write batch): [] when they fit; the host copy of the hedge with
    the lowest H when it is worth less than ``value``; None when the new hedge must not be written. Pure.
    """
    if nbytes > budget:
        return None
    used = hedge_host_bytes(index) + pending_bytes
    if used + nbytes <= budget:
        return []
    candidates = [s for s in index.snapshots.values() if _evictable(s)]
    if not candidates:
        return None
    victim = min(candidates, key=lambda s: (s.gdsf_h, s.id))
    if victim.gdsf_h >= value:
        return None
    if victim.device_complete:
        return [ev.SnapshotHostDropped(0, victim.id)]
    return [ev.SnapshotDeleted(0, victim.id)]
