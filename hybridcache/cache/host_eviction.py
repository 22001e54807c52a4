"""Host tier policy (§9.3): GDSF valuation, supersession, and slab allocation planning. Pure.

H(s) = L_s + w(s)·t(F(s)·C(s)/Z(s)) with F = 1 + hits, C = prefill saved over the snapshot's base minus
the image restore, Z = image + tail + exclusive path bytes, t the GD* tempering below and w(s) = 1, or
``SUPERSEDED_WEIGHT`` for a superseded snapshot. Planners return events (seq 0; the caller numbers and
applies them) and never mutate.

Deviations from §9.3, measured with ``hybridcache simulate`` on the WEKA Claude Code traces (issue 7;
whole set, 27B INT8 shape, 64 GiB, 8 users, x the infinite-cache bound): the spec's policy 2.37, the
untempered GDSF with marginal values of the previous revision 1.33, this policy 1.22. One run's ratio
moves by a few hundredths with any perturbation (a handful of 100k-400k-token conversations idle for more
than ten minutes decide it), so compare policies over several settings: against the previous revision,
7 users 1.32 -> 1.34, 9 users 1.58 -> 1.43, 48 GiB 1.69 -> 1.58, 96 GiB 1.11 -> 1.11.
- Superseded snapshots are not evicted wholesale before retained ones. They compete by H like the rest
  (their tempered density weighted by ``SUPERSEDED_WEIGHT``). Superseded-first deleted the branch points
  that retries and re-rendered turns resume from (a request diverging a few thousand tokens before the
  lineage's newest snapshot fell back to the shared preamble).
- The base a snapshot is valued against: a snapshot that other snapshots record as their ancestor (the
  middle of a lineage) against the nearest snapshot above it, superseded or not (what its removal alone
  costs while the lineage's newer snapshot stays); the newest snapshot of a lineage (no dependents)
  against the nearest snapshot above it that other lineages share (one with more than one dependent, or a
  Boundary), or the root: losing it costs the next turn the whole conversation-specific prefill once the
  cheap middle snapshots have gone, and valuing it by its last few hundred tokens (the previous rule) let
  GDSF evict a conversation's newest endpoint right after publication. The chain walk runs when the
  snapshot is valued; a value goes stale (until the snapshot is next revalued) when another lineage
  branches off or leaves above it.
- GD* tempering (Jin and Bestavros, "GreedyDual* Web caching algorithm", 2001): the density term is
  t(d) = REFERENCE_DENSITY^(1-1/beta) · d^(1/beta) with beta = 2, so a snapshot's lifetime in units of L
  grows with the square root of its density instead of linearly. Plain GDSF let a few very dense
  snapshots (long conversations, whose attention makes prefill superlinear) outlive many young ones by
  factors of a thousand, and the L jumps their late eviction caused expired everything else at once;
  conversations idle for minutes then lost their newest endpoints to older ones that never returned.
  REFERENCE_DENSITY only sets the numbers' scale (every value, new-snapshot estimates included, is
  tempered the same way, so the eviction order does not depend on it).
- An image write is not refused when the victim is worth more than the new snapshot: a refused write
  leaves the snapshot device-only, and device slot pressure then deleted it (1.47x vs 1.31x on 20 files).
  Hedges are the exception (hedge_admission.py): their images go only into free room or over victims
  worth less per byte (``density_term``, H without L), within a hedge byte budget, because a hedge is a
  bet on an edit that usually never comes.
- "Exclusive path" counts every node (one slab each, written through or about to be) from the anchor up
  while exactly one snapshot (retained or superseded) lies below it.
- Why the middle snapshots of a lineage (prompt taps, superseded endpoints) stay valued as they are: while
  one lies above a lineage's newest snapshot, the newest one's exclusive path is only its own blocks and
  its density is high; when the last middle one goes, its revaluation (the whole conversation as its
  path, L_s from its last use) lands far below L and it goes next. An idle conversation therefore lives
  about as long as its longest-lived middle snapshot. Measured and rejected (same setting, today 1.219;
  each lost the default run): middle TAP/ENDPOINT snapshots without hits at weight 0.25 1.32 (Boundaries
  included 1.45) or 2.0 1.24; superseding the single-chain ancestors of the resumed snapshot as the
  lineage moves on 1.31; sizing the newest snapshot by every block below its shared ancestor 1.26 (with
  that supersession and SUPERSEDED_WEIGHT 0.25: 1.24, 7 users 1.29 but 9 users 1.51); never lowering
  the newest snapshot's H on a structural revaluation 1.27; SUPERSEDED_WEIGHT 1.0 1.25; tempering
  exponents 0.4 and 0.6 1.28 and 1.26; no prompt-tail tap after an endpoint resume 1.29 (the next
  non-echoing turn loses it). Later (whole set, 8 users, 64 GiB, today 1.1230), also rejected:
  tempering exponents 0.25 and 0.75 1.1266 and 1.1940; SUPERSEDED_WEIGHT 0.25 and 1.0 1.1889 and
  1.1342; superseded snapshots valued with one hit fewer (the continuation that superseded them) 1.1393;
  dropping the host copies of device-resident blocks before any snapshot (MRU first) 1.1530 (the device
  then writes them back into a full tier); full weight for a superseded snapshot that is the parent of
  its lineage's newest (revalued when the lineage grows): 8 users 1.1204, but 7 users 1.1620 -> 1.1821
  and 9 users 1.1787 -> 1.2251; tempering exponent 0.35 for a lineage's newest snapshot (0.5 for the
  rest): 8 users 1.1054, but 7 users 1.1823 and 9 users 1.1827; a lineage's snapshots aged as a group
(L_s of each the latest of its own and its single-chain descendants', so an idle conversation's
snapshots all date from its last use): 7/8/9 users 1.1950/1.1514/1.2124 against 1.1620/1.1230/1.1787;
lineage-private snapshots above the parent of the newest at weight 0 (evicted first): 1.3722/1.3961/
1.4570 (capacity excess 4.47M -> 14.9M tokens at 8 users: with them gone, a request whose newest
snapshot was lost falls back to the shared preamble). What remains over the bound is not
  room: the capacity floor (tools/sim/capacity_floor.py) shows that at 4 to 12 users no block need ever
  be lost for want of it, and ``simulate --explain`` that whenever a snapshot a request needs soon is
  deleted, the tier holds (median) 21 GiB of images and 28 GiB of KV that no later request uses. The
  policy's task is to tell those apart. ``excess_capacity_tokens_idle_*`` shows where it fails: at 8 users
44 requests that lost more than 20k tokens each carry 3.47M of the 4.47M capacity tokens: their
conversations' newest snapshots and paths had been evicted while idle, 13 of them for under 5 minutes
(0.80M), 15 for 5 to 30 (1.20M), 16 for 30 minutes to 5.6 hours (1.47M). Hedges lost 164k.
At 16 users most of it is lost by conversations idle under 5 minutes (40.8M of 77.2M capacity tokens:
16 conversations' working set no longer fits device plus host). Also rejected there: the saving priced
in tokens (attention pairs left out of C): 8/16 users 1.1159/3.0517 against 1.1230/3.0246; L_s scaled
by 0.9 in H (slower aging): 8 users 3.4691 (L stops growing, so old dense snapshots are never evicted);
a new snapshot inheriting its ancestor's hits (a lineage's turn count as its frequency): 8/16 users
1.2489/3.2460, capped at 3 hits 1.1688/3.0245. A candidate, not adopted: re-valuing (L_s = L) the snapshot
a request will resume from when it joins the admission queue, as a real server could: 16 users 3.0246
-> 2.9896, 8 users 1.1230 -> 1.1251.
Supersession still orders device slot reuse (§9.2), is re-retained by a hit, and keeps superseded
snapshots out of the prefix-cache file (§5.5).
"""

from __future__ import annotations

from itertools import islice
from typing import TYPE_CHECKING

from hybridcache.cache import events as ev
from hybridcache.cache.cost_model import CacheCostModel
from hybridcache.cache.device_eviction import subtree_removable_node
from hybridcache.cache.records import BlockNode, Residency, Snapshot, SnapshotKind

if TYPE_CHECKING:
    from hybridcache.cache.index import PrefixIndex


# ---------------------------------------------------------------------- valuation
TEMPERING_EXPONENT = 0.5
"""1/beta of GD*: the density term grows with density**0.5 (beta = 2; see the module note)."""

REFERENCE_DENSITY = 1e-8
"""Seconds of prefill per byte at which tempering leaves a density unchanged: sets the scale of H only."""

SUPERSEDED_WEIGHT = 0.5
"""Weight of a superseded snapshot's tempered density: only a request diverging before its lineage's
newer snapshot can still use it."""


def ancestor_frontier(snap: Snapshot) -> int:
    """F_a of the nearest snapshot above ``snap``, superseded or not (0 for the root). Pure."""
    return 0 if snap.ancestor is None else snap.ancestor.frontier


def shared_ancestor(snap: Snapshot) -> Snapshot | None:
    """The nearest snapshot above ``snap`` that other lineages share: one with more than one dependent,
    or a Boundary; None when there is none (the root). Pure; walks the lineage's ancestors."""
    above = snap.ancestor
    while above is not None and len(above.dependents) == 1 and above.kind != SnapshotKind.BOUNDARY:
        above = above.ancestor
    return above


def valuation_base(snap: Snapshot) -> int:
    """The frontier ``snap`` is valued against (see the module note): its nearest snapshot above while
    it has dependents or is a hedge (a hedge only serves a request diverging between it and the lineage's
    next snapshot, which its own prompt's tail is about to publish), its nearest shared one when it is
    the newest of its lineage. Pure."""
    if snap.dependents or snap.kind == SnapshotKind.HEDGE:
        return ancestor_frontier(snap)
    shared = shared_ancestor(snap)
    return 0 if shared is None else shared.frontier


def tempered_density(density: float) -> float:
    """GD*'s density term t(d) = REFERENCE_DENSITY^(1 - e) · d^e, e = TEMPERING_EXPONENT; 0 for d <= 0.
    Pure."""
    if density <= 0.0:
        return 0.0
    return REFERENCE_DENSITY ** (1.0 - TEMPERING_EXPONENT) * density**TEMPERING_EXPONENT


def exclusive_path_bytes(index: PrefixIndex, anchor: BlockNode) -> int:
    """Host bytes of path nodes below which only one snapshot lies (see module note). Pure. (Counts up to
    2 are exact: ``live_snapshots_below`` saturates only above LIVE_BELOW_CAP - 1.)"""
    total = 0
    node: BlockNode | None = anchor
    while node is not None and node.parent is not None and node.live_snapshots_below <= 1:
        total += index.geometry.slab_bytes
        node = node.parent
    return total


def path_sharers(anchor: BlockNode, threshold: int) -> list[Snapshot]:
    """Snapshots whose exclusive path changed when one was added (threshold 2) or removed (threshold 1)
    at ``anchor``: the snapshots below the lowest ancestor holding exactly ``threshold``. Pure. (Counts up
    to 2 are exact, see ``BlockNode.live_snapshots_below``.)"""
    node: BlockNode | None = anchor
    while node is not None and node.live_snapshots_below < threshold:
        node = node.parent
    if node is None or node.live_snapshots_below != threshold:
        return []
    found: list[Snapshot] = []
    stack = [node]
    while stack:
        current = stack.pop()
        found.extend(current.snapshots)
        stack.extend(c for c in current.iter_children() if c.live_snapshots_below > 0)
    return found


def priority(
    index: PrefixIndex,
    cost: CacheCostModel,
    frontier: int,
    base: int,
    hits: int,
    size_bytes: int,
    l_base: float,
    weight: float = 1.0,
) -> float:
    """H for a snapshot at ``frontier`` valued against ``base``: ``l_base`` plus ``weight`` times the
    tempered density of its saving. Pure."""
    saved = cost.prefill_seconds(base, frontier - base) - cost.restore_seconds(index.geometry.image_bytes)
    density = (1 + hits) * max(saved, 0.0) / max(size_bytes, 1)
    return l_base + weight * tempered_density(density)


def density_term(snap: Snapshot) -> float:
    """What ``snap``'s H holds beyond the L it was valued at: its weighted, tempered density (prefill
    saved per byte held, hits included), without the recency GDSF's L inflation adds. Pure."""
    return snap.gdsf_h - snap.base_l


def value_snapshot(index: PrefixIndex, snap: Snapshot, cost: CacheCostModel) -> float:
    """H(snap) from the current index (L_s is the snapshot's own base). Pure."""
    tail_bytes = index.geometry.slab_bytes if snap.tail_tokens else 0
    size = index.geometry.image_bytes + tail_bytes + exclusive_path_bytes(index, snap.anchor)
    weight = SUPERSEDED_WEIGHT if snap.superseded else 1.0
    return priority(index, cost, snap.frontier, valuation_base(snap), snap.hits, size, snap.base_l, weight)


def estimate_new_priority(
    index: PrefixIndex, cost: CacheCostModel, frontier: int, previous_frontier: int, tailed: bool
) -> float:
    """H of a snapshot about to be published: no hits, the blocks since ``previous_frontier`` its own."""
    own_blocks = max(frontier // 64 - previous_frontier // 64, 0)
    size = index.geometry.image_bytes + index.geometry.slab_bytes * (own_blocks + tailed)
    return priority(index, cost, frontier, previous_frontier, 0, size, index.gdsf_l)


def plan_revalue(index: PrefixIndex, snaps: list[Snapshot], cost: CacheCostModel) -> list[ev.CacheEvent]:
    """One SnapshotsValued for the snapshots (with their ancestors, dependents and path sharers) whose
    H changed. Pure."""
    affected: dict[int, Snapshot] = {}
    for snap in snaps:
        if index.snapshots.get(snap.id) is not snap:
            continue
        affected[snap.id] = snap
        if snap.ancestor is not None:
            affected[snap.ancestor.id] = snap.ancestor
        affected.update(snap.dependents)
        for sharer in path_sharers(snap.anchor, 2):
            affected[sharer.id] = sharer
    ids, values = [], []
    for sid in sorted(affected):
        value = value_snapshot(index, affected[sid], cost)
        if value != affected[sid].gdsf_h:
            ids.append(sid)
            values.append(value)
    return [ev.SnapshotsValued(0, tuple(ids), tuple(values))] if ids else []


# ---------------------------------------------------------------------- supersession
def single_chain_below(anchor: BlockNode) -> bool:
    """The tree below ``anchor`` never branches (no other conversation continued). Pure."""
    node = anchor
    while node.children:
        children = node.iter_children()
        if len(children) > 1:
            return False
        node = children[0]
    return True


def plan_supersession(
    index: PrefixIndex, candidates: list[int | None], new_frontier: int
) -> list[ev.CacheEvent]:
    """Supersede a lineage's older snapshots before a deeper one is published (§9.3)."""
    out: list[ev.CacheEvent] = []
    seen: set[int] = set()
    for sid in candidates:
        if sid is None or sid in seen:
            continue
        seen.add(sid)
        snap = index.snapshots.get(sid)  # type: ignore[call-overload]
        if snap is None or snap.superseded or snap.frontier >= new_frontier:
            continue
        if snap.kind == SnapshotKind.BOUNDARY and not single_chain_below(snap.anchor):
            continue
        out.append(ev.SnapshotSuperseded(0, snap.id))
    return out


# ---------------------------------------------------------------------- allocation
DEAD_SCAN_FACTOR = 4  # dead nodes looked at per victim wanted (the window ordered leaves first)


def dead_victims(index: PrefixIndex, count: int) -> list[BlockNode]:
    """Up to ``count`` dead-KV victims: the longest dead, leaves first. Pure.

    The dead list keeps the order in which nodes died. Victims are chosen from windows of the longest-
    dead nodes (a few per victim wanted), each ordered deepest first, continuing into the next window
    while too few are usable, so a call costs O(count) instead of sorting every dead node (that sort
    dominated long simulations). A host-only victim's subtree must be removable (nothing pinned or in
    flight). The result is ordered deepest first, so applying it in order never names a node that an
    earlier victim's subtree removal took with it.
    """
    victims: list[BlockNode] = []
    known: dict[int, bool] = {}  # subtree verdicts of this call (windows run deepest first)
    window = max(DEAD_SCAN_FACTOR * count, 64)
    dead = iter(index.dead_nodes.values())
    while len(victims) < count:
        chunk = list(islice(dead, window))
        if not chunk:
            break
        chunk.sort(key=lambda n: (-n.depth, n.id))
        for node in chunk:
            if node.device_state == Residency.ABSENT and not _removable(node, known):
                continue  # host-only: dropping it deletes its subtree, which must hold nothing pinned
            victims.append(node)
            if len(victims) == count:
                break
    victims.sort(key=lambda n: (-n.depth, n.id))
    return victims


def _removable(top: BlockNode, known: dict[int, bool]) -> bool:
    """``subtree_removable(top)``, reusing the verdicts in ``known`` for subtrees walked earlier in
    the same call and recording its own. Mutates only ``known``."""
    verdict = known.get(top.id)
    if verdict is None:
        stack = [top]
        verdict = True
        while stack and verdict:
            node = stack.pop()
            seen = known.get(node.id) if node is not top else None
            if seen is True:
                continue
            verdict = seen is None and subtree_removable_node(node)
            stack.extend(node.iter_children())
        known[top.id] = verdict
    return verdict


def pinned_duplicates(index: PrefixIndex, count: int) -> list[BlockNode]:
    """Up to ``count`` blocks whose host copy duplicates a device copy that a running lane pins: the
    paths of activated lanes in lane order, each deepest block first. Pure.

    While a lane runs, its path stays on the device, so these host slabs serve nobody; they are the
    cheapest host room after dead KV. The cost comes later, if ever: once the lane is done, the device
    may evict such a block, and write-back then copies it again while a snapshot can reach it. Until
    then the two tiers hold each block once, as write-back does for newly computed blocks. (Only in
    write-back mode: write-through keeps a host copy of what the device holds by design, and
    ``--cache-dir`` relies on it to find a running request's path after a crash.) A resumed
    822k-token conversation in the WEKA traces restores 9,944 blocks, a third of a 64 GiB tier, which
    the tier otherwise held twice while that request ran; idle conversations' snapshots paid for it.
    Measured with ``hybridcache simulate`` (whole WEKA set, 27B-INT8, 64 GiB): 7/8/9 users computed
    1.1620/1.1230/1.1787x the bound before, 1.1420/1.1033/1.1363x with this step; 16 users 3.0246x
    before, 2.5122x with it (the oracle, which gets the same step, 2.6783x and 1.7011x)."""
    found: list[BlockNode] = []
    seen: set[int] = set()
    resident = Residency.RESIDENT
    for lane_id in sorted(index.lanes):
        lane = index.lanes[lane_id]
        if not lane.activated:
            continue
        for node in reversed(lane.path):
            if node.id in seen or node.restore_pins:
                continue
            if node.host_state is resident and node.device_state is resident:
                seen.add(node.id)
                found.append(node)
                if len(found) == count:
                    return found
    return found


def _unpinned_host(snap: Snapshot) -> bool:
    return snap.restore_pins == 0 and snap.host_state == Residency.RESIDENT


def plan_host_room(
    index: PrefixIndex, slabs_needed: int, denser_than: float | None = None, release_pinned: bool = False
) -> list[ev.CacheEvent] | None:
    """One step toward ``slabs_needed`` free slabs: [] when they are free, None when nothing can be
    evicted (everything is pinned, or with ``denser_than``, the snapshot with the lowest H has a density
    term of at least that: a hedge's image is admitted only over victims worth less per byte,
    hedge_admission.py). A dead-KV step names up to the whole shortfall at once, then, with
    ``release_pinned``, a step of host copies that running lanes' pinned device copies duplicate
    (``pinned_duplicates``; the facade asks for it in write-back mode and not for a hedge); otherwise
    the host snapshot with the lowest H goes (see the module note), L rising to its H.
    """
    host = index.host
    if host is None:
        return None
    if host.num_free >= slabs_needed:
        return []
    dead = dead_victims(index, slabs_needed - host.num_free)
    if dead:
        return [ev.NodeHostDropped(0, node.id) for node in dead]
    if release_pinned:
        duplicates = pinned_duplicates(index, slabs_needed - host.num_free)
        if duplicates:
            return [ev.PinnedHostCopiesDropped(0, tuple(node.id for node in duplicates))]
    candidates = [s for s in index.snapshots.values() if _unpinned_host(s)]
    if not candidates:
        return None
    victim = min(candidates, key=lambda s: (s.gdsf_h, s.id))
    if denser_than is not None and density_term(victim) >= denser_than:
        return None
    out: list[ev.CacheEvent] = []
    if victim.gdsf_h > index.gdsf_l:
        out.append(ev.GdsfInflated(0, victim.gdsf_h))
    if victim.device_complete:
        out.append(ev.SnapshotHostDropped(0, victim.id))
    else:
        out.append(ev.SnapshotDeleted(0, victim.id))
    return out
