"""A conversation's lineage as one unit of host value: its chain of snapshots, the checkpoints it keeps.

A *lineage* is the chain of snapshots one conversation publishes below the last snapshot it shares with
others: each snapshot in it has at most one dependent, the deepest (none) is its *newest*, and the
chain ends above at its *shared snapshot* (a Boundary, a snapshot with more than one dependent, or the
root), whose frontier is the unit's ``base``. The snapshots of a lineage are worth something only
together: a returning conversation needs its whole path and a state near wherever its next prompt
diverges, which is mostly at the newest snapshot or just before it (a re-rendered last turn, a retry),
and exponentially more rarely further back. So the host keeps, of each lineage, the newest snapshot and
a few *checkpoints* at growing distances from it, and values them as one unit
(``host_eviction.lineage_values``):

- Checkpoints: walking up from the newest, the first snapshot that is not a hedge, then each one at
  least ``CHECKPOINT_SPACING`` times farther from the newest than the last one kept (and at least
  ``MIN_CHECKPOINT_GAP`` tokens farther). A 137k-token conversation with a ladder tap every 4,096 tokens
  keeps 8 of its 35 snapshots; a divergence d tokens before the newest resumes at most about d
  tokens earlier than it could have.
- The other snapshots of the chain are valued at their own L_s with no density: host room takes them
  first, before anything that is still worth something.
- A Boundary starts a unit (it is the unit's shared snapshot even while one lineage lies below it), and
  the snapshots above it whose single chain of dependents leads into the unit (ladder taps inside a
  preamble no other conversation shares yet) belong to no checkpoint set: when they are valued with the
  unit they are worth their L_s alone. While a Boundary is itself the end of its chain (no snapshot
  below it yet), its chain above is thinned to checkpoints below it, and those are valued by
  themselves (``host_eviction.own_value``), as the Boundary is; so are the checkpoints of a lineage
  whose newest snapshot is a hedge (a request still in prefill). Hedges always are.

Pure functions over the index's snapshot records.
"""

from __future__ import annotations

from typing import NamedTuple

from hybridcache.cache.records import Snapshot, SnapshotKind

MIN_CHECKPOINT_GAP = 256
"""Tokens: the smallest gap ``CHECKPOINT_SPACING`` multiplies, so the checkpoint after the first (the
parent) lies at least 512 tokens before the newest however close the parent is."""

CHECKPOINT_SPACING = 2.0
"""Each checkpoint lies at least this many times farther from the newest than the previous one."""

_HEDGE = SnapshotKind.HEDGE
_BOUNDARY = SnapshotKind.BOUNDARY


class LineageUnit(NamedTuple):
    """One lineage: ``chain`` newest first, ``kept`` the ids of its newest and checkpoints (the unit's
    members), ``base`` the frontier of the shared snapshot above it (0 for the root)."""

    newest: Snapshot
    chain: list[Snapshot]
    kept: frozenset[int]
    base: int

    def members(self) -> list[Snapshot]:
        return [s for s in self.chain if s.id in self.kept]


def lineage_newest(snap: Snapshot) -> Snapshot | None:
    """The end of ``snap``'s single chain of dependents (``snap`` itself when it has none), Boundaries with
    one dependent passed through; None when the chain branches (two lineages share ``snap``). Pure."""
    node = snap
    while len(node.dependents) == 1:
        node = next(iter(node.dependents.values()))
    return None if node.dependents else node


def in_lineage(snap: Snapshot) -> bool:
    """``snap`` belongs to a lineage (not a Boundary, not shared by two lineages). Pure."""
    return snap.kind != _BOUNDARY and len(snap.dependents) <= 1


def lineage_of(newest: Snapshot) -> LineageUnit:
    """The lineage ending at ``newest`` (a snapshot without dependents), its checkpoints chosen. Pure."""
    chain = [newest]
    kept = {newest.id}
    last_gap: int | None = None
    node = newest.ancestor
    while node is not None and in_lineage(node):
        chain.append(node)
        if node.kind != _HEDGE:
            gap = newest.frontier - node.frontier
            if last_gap is None or gap >= CHECKPOINT_SPACING * max(last_gap, MIN_CHECKPOINT_GAP):
                kept.add(node.id)
                last_gap = gap
        node = node.ancestor
    return LineageUnit(newest, chain, frozenset(kept), 0 if node is None else node.frontier)


def unit_of(snap: Snapshot) -> LineageUnit | None:
    """The unit ``snap``'s single chain of dependents leads into (``snap`` in its chain, or above the
    Boundary it starts at), or None for a hedge, a Boundary or a shared snapshot (those are valued by
    themselves). Pure; walks the lineage."""
    if snap.kind == _HEDGE or not in_lineage(snap):
        return None
    newest = lineage_newest(snap)
    return None if newest is None else lineage_of(newest)
