"""Which blocks a replica can resume from, per tier: what a router should believe this replica holds.

A hybrid model resumes only where a snapshot of the recurrent state exists, so a cached block is worth
routing to only while a snapshot anchored at or below it is complete in a tier: its blocks from the
root down to the snapshot's anchor are *covered* in that tier. The device tier counts snapshots that
are ``device_complete`` (image and tail on the device), the host tier those ``host_complete``. Coverage
is prefix-closed per tier (a snapshot covers its whole path), so each change is a path suffix: a
newly covered suffix hangs under a block already covered (or the root), and a suffix that loses its
last snapshot leaves the blocks above it covered.

An engine that resumes only exactly (the default, `cache/exactness.py`) never resumes from a
decode-produced snapshot, nor past a decode-produced block: for it a snapshot covers nothing until it
and every block of its path are exact. Exactness only grows (an idle refill's ``BlockMadeExact``), so
such a snapshot covers its path from the update that sees its last block made exact.

`ResumableCover` keeps, per tier, how many complete snapshots cover each block, and `update(index)`
diffs the index's snapshots against what it last saw. It reads the index and mutates only itself.
"""

from __future__ import annotations

from enum import IntEnum
from typing import NamedTuple

from hybridcache.cache.index import PrefixIndex
from hybridcache.cache.records import Snapshot


class Tier(IntEnum):
    DEVICE = 0
    HOST = 1


TIERS = (Tier.DEVICE, Tier.HOST)


class CoveredBlock(NamedTuple):
    """What a router needs of one block: its chain hash, the parent's (None under the root), tokens and
    the extra key (a cache salt) that also went into its hash."""

    lookup_hash: int
    parent_hash: int | None
    tokens: tuple[int, ...]
    extra: int


class CoverChange(NamedTuple):
    """One path suffix that became covered (``stored``) or uncovered in ``tier``; blocks root first."""

    tier: Tier
    stored: bool
    blocks: tuple[CoveredBlock, ...]


class _Tracked(NamedTuple):
    path: tuple[CoveredBlock, ...]  # root first; fixed for the snapshot's life
    tiers: tuple[bool, bool]  # complete on (device, host) when last seen
    exact: bool  # the snapshot and its path's blocks are exact (once True, stays so)


def snapshot_tiers(snap: Snapshot) -> tuple[bool, bool]:
    """Whether ``snap`` can be resumed from the device alone, and from the host alone. Pure."""
    return snap.device_complete, snap.host_complete


def resumes_exactly(snap: Snapshot) -> bool:
    """Whether an exact-only match can resume from ``snap``: it and every block above its anchor hold a
    cold run's numbers (a match stops at the first inexact block). Pure."""
    if snap.inexact:
        return False
    node = snap.anchor
    while node.parent is not None:
        if node.inexact:
            return False
        node = node.parent
    return True


class ResumableCover:
    """Per-tier cover counts of the blocks under complete snapshots (exact ones only when
    ``exact_only``). Not thread-safe."""

    def __init__(self, exact_only: bool = False) -> None:
        self.exact_only = exact_only
        self._tracked: dict[int, _Tracked] = {}
        self._counts: tuple[dict[int, int], dict[int, int]] = ({}, {})

    def update(self, index: PrefixIndex) -> list[CoverChange]:
        """Bring the counts to the index's snapshots; the suffixes that changed, in an order a router can
        apply (a stored suffix's parent is covered before it). Mutates self only."""
        changes: list[CoverChange] = []
        live = index.snapshots
        for sid in [sid for sid in self._tracked if sid not in live]:
            tracked = self._tracked.pop(sid)
            for tier in TIERS:
                if tracked.tiers[tier]:
                    self._uncover(tier, tracked.path, changes)
        for sid, snap in live.items():
            tracked = self._tracked.get(sid)
            if tracked is None:
                tracked = _Tracked(_path_of(snap), (False, False), not self.exact_only)
            if not tracked.exact and resumes_exactly(snap):
                tracked = tracked._replace(exact=True)
            tiers = snapshot_tiers(snap) if tracked.exact else (False, False)
            if tracked.tiers == tiers:
                self._tracked[sid] = tracked
                continue
            for tier in TIERS:
                if tiers[tier] and not tracked.tiers[tier]:
                    self._cover(tier, tracked.path, changes)
                elif tracked.tiers[tier] and not tiers[tier]:
                    self._uncover(tier, tracked.path, changes)
            self._tracked[sid] = tracked._replace(tiers=tiers)
        return changes

    def covered(self) -> list[CoverChange]:
        """The whole current cover as stored suffixes (one per complete snapshot path, deduplicated),
        for a subscriber that starts from nothing. Pure."""
        out: list[CoverChange] = []
        for tier in TIERS:
            sent: set[int] = set()
            for tracked in self._tracked.values():
                if not tracked.tiers[tier]:
                    continue
                start = 0
                while start < len(tracked.path) and tracked.path[start].lookup_hash in sent:
                    start += 1
                suffix = tracked.path[start:]
                if suffix:
                    sent.update(block.lookup_hash for block in suffix)
                    out.append(CoverChange(tier, True, suffix))
        return out

    def num_covered(self, tier: Tier) -> int:
        return len(self._counts[tier])

    def _cover(self, tier: Tier, path: tuple[CoveredBlock, ...], changes: list[CoverChange]) -> None:
        counts = self._counts[tier]
        first_new = len(path)
        for position in range(len(path) - 1, -1, -1):
            key = path[position].lookup_hash
            count = counts.get(key, 0)
            counts[key] = count + 1
            if count == 0:
                first_new = position
        if first_new < len(path):
            changes.append(CoverChange(tier, True, path[first_new:]))

    def _uncover(self, tier: Tier, path: tuple[CoveredBlock, ...], changes: list[CoverChange]) -> None:
        counts = self._counts[tier]
        first_gone = len(path)
        for position in range(len(path) - 1, -1, -1):
            key = path[position].lookup_hash
            count = counts[key] - 1
            if count == 0:
                del counts[key]
                first_gone = position
            else:
                counts[key] = count
        if first_gone < len(path):
            changes.append(CoverChange(tier, False, path[first_gone:]))


def _path_of(snap: Snapshot) -> tuple[CoveredBlock, ...]:
    blocks: list[CoveredBlock] = []
    node = snap.anchor
    while node.parent is not None:
        parent = node.parent
        parent_hash = None if parent.parent is None else parent.lookup_hash
        blocks.append(CoveredBlock(node.lookup_hash, parent_hash, node.tokens, node.extra))
        node = parent
    blocks.reverse()
    return tuple(blocks)
