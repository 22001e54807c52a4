"""Host tier policy (§9.3): GDSF valuation, supersession, and slab allocation planning. Pure.

H(s) = L_s + w(s)·t(F(s)·C(s)/Z(s)): L_s the inflation value L at the snapshot's last use, F = 1 + hits,
C the prefill it saves, Z the host bytes it holds, t the GD* tempering below, w(s) its weight. Planners
return events (seq 0; the caller numbers and applies them) and never mutate.

Deviations from §9.3, measured with ``hybridcache simulate`` on the WEKA Claude Code traces (whole set,
27B-INT8 shape, 64 GiB host, x the infinite-cache bound; one run moves by a few hundredths with any
perturbation, so policies are compared over several concurrencies):
- **Lineages are valued as units** (lineage_unit.py). The newest snapshot of a conversation's lineage
  and its checkpoints (snapshots at doubling distances above it) share one H (``unit_value``): the
  latest L_s among them plus the tempered density of the whole unit, the prefill from the shared
  snapshot above to the newest over its private path, tails and member images, so a conversation ages
  as one. The lineage's other snapshots are worth their L_s alone and go first. Among equal H (a unit's
  members) the deepest goes first, so a unit under pressure shrinks from its end and a returning
  conversation resumes from the deepest checkpoint left (oldest first: 3.47x the bound at 16 users
  against 2.88x, the same at 8). Before, every snapshot was valued by itself, the newest against the
  shared snapshot above (its whole conversation) over its exclusive path only; the middle snapshots
  (62 % of the host's image bytes, used 0.6 % of the time) held the path, and when the last of them
  went the newest one's value collapsed (the whole path now its own) and it went next: a conversation
  idle 73 s lost its 137k-token endpoint that way. Per snapshot against as units, at 6/7/8/9/10/12
  users: 1.0967/1.1420/1.1033/1.1363/1.2698/1.3762 against 1.0592/1.0877/1.0919/1.1378/1.2473/1.3334.
  At 16 users (16 conversations' working set no longer fits) units are worse, 2.5122 against 2.8753:
  aging whole conversations alike behaves like LRU on a cyclic working set, where the per-snapshot
  values kept dense middle pieces of more of them.
- Snapshots outside any lineage (Boundaries, snapshots two lineages share, hedges) are valued by
  themselves (``own_value``): C is the prefill over ``valuation_base`` minus the image restore, Z the
  image, tail and exclusive path (nodes from the anchor up while one snapshot lies below), and w is
  ``SUPERSEDED_WEIGHT`` for a superseded one. Superseded snapshots are not evicted wholesale first:
  that deleted the branch points retries and re-rendered turns resume from.
- GD* tempering (Jin and Bestavros, "GreedyDual* Web caching algorithm", 2001): the density term is
  t(d) = REFERENCE_DENSITY^(1-1/beta) · d^(1/beta) with beta = 2, so a lifetime in units of L grows with
  the square root of the density instead of linearly. Plain GDSF let a few very dense snapshots (long
  conversations, whose attention makes prefill superlinear) outlive young ones by factors of a thousand,
  and the L jumps their late eviction caused expired everything else at once. REFERENCE_DENSITY only
  sets the numbers' scale.
- Under sustained overload the recency floor (recency_floor.py) narrows the victims to what no request
  finished with in the last few minutes; ``plan_host_room`` takes its rule as ``spared``.
- An image write is not refused when the victim is worth more than the new snapshot: a refused write
  leaves the snapshot device-only, and device slot pressure then deletes it. Hedges are the exception
  (hedge_admission.py).
- Rejected on the way (most measured at 8 users, some also at 7, 9 and 16; the figures are in the
  issue notes): other tempering exponents and superseded weights; superseded-first eviction; the saving
  priced in tokens; hit counts inherited along a lineage; never lowering a newest snapshot's H;
  whole-lineage sizing with the middles evicted first, or with the parent valued alone (the parent then
  held the path as the middles had); checkpoints without the shared unit value, or the unit value
  without checkpoints; checkpoint spacing 1.5, 3 or 4 instead of 2; a member's H the larger of the
  unit's and its own; a unit's density weighted down by its size; the recency floor
  (recency_floor.py, which gates it on the age of deleted endpoints) always on (better at 16 and 17
  users, worse at 8, 12 and 15), or gated on queue waits, on ghost hits of recent victims or on recent
  victims; protecting the state of a request waiting for admission;
  values raised or lowered by the stop reason of a conversation's last response (a tool call or the
  end of its turn); a conversation's previous branch worth its L_s alone once its next prompt diverges
  well before that branch's end (it needs a session id); the checkpoints below the parent worth less
  than the newest and the parent. None of these tells ended conversations from idle ones
  (``simulate --explain``: a third of the tier is ended conversations' KV whenever a needed snapshot
  goes), and that decides the 8-user figure: told it in hindsight (``simulate --told ended``), ours
  computes 1.044-1.067x there (1.085-1.093x untold; host 64 GiB and 64 MiB either side).
Supersession still orders device slot reuse (§9.2), is re-retained by a hit, and keeps superseded
snapshots out of the prefix-cache file (§5.5).
"""

from __future__ import annotations

from collections.abc import Callable
from itertools import islice
from typing import TYPE_CHECKING

from hybridcache.cache import events as ev
from hybridcache.cache.cost_model import CacheCostModel
from hybridcache.cache.device_eviction import subtree_removable_node
from hybridcache.cache.ids import BLOCK_TOKENS
from hybridcache.cache.lineage_unit import LineageUnit, unit_of
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


def lineage_values(index: PrefixIndex, unit: LineageUnit, cost: CacheCostModel) -> dict[int, float]:
    """H of every snapshot in ``unit``'s chain but its hedges (see the module note): the unit's value for
    its newest and checkpoints, unless the newest is a hedge or a Boundary (then each by itself,
    ``own_value``); L_s alone for the rest. Pure."""
    shared = None
    if unit.newest.kind not in (SnapshotKind.HEDGE, SnapshotKind.BOUNDARY):
        shared = unit_value(index, unit, cost)
    values: dict[int, float] = {}
    for snap in unit.chain:
        if snap.kind == SnapshotKind.HEDGE:
            continue
        if snap.id not in unit.kept:
            values[snap.id] = snap.base_l
        else:
            values[snap.id] = own_value(index, snap, cost) if shared is None else shared
    return values


def unit_value(index: PrefixIndex, unit: LineageUnit, cost: CacheCostModel) -> float:
    """H shared by a lineage's newest snapshot and checkpoints: the latest L_s among them plus the tempered
    density of the whole unit: (1 + their most hits) x the prefill from the shared snapshot above to the
    newest, over the unit's host bytes (its private path, tails, and its members' images).
    Pure."""
    geometry = index.geometry
    members = unit.members()
    images = sum(1 for s in members if s.kind != SnapshotKind.HEDGE)
    tails = sum(1 for s in members if s.tail_tokens)
    blocks = max(unit.newest.anchor.depth + 1 - unit.base // BLOCK_TOKENS, 0)
    size = geometry.image_bytes * max(images, 1) + geometry.slab_bytes * (blocks + tails)
    saved = cost.prefill_seconds(unit.base, unit.newest.frontier - unit.base)
    hits = max(s.hits for s in members)
    return max(s.base_l for s in members) + tempered_density((1 + hits) * saved / size)


def own_value(index: PrefixIndex, snap: Snapshot, cost: CacheCostModel) -> float:
    """H of ``snap`` by itself: the prefill it saves over ``valuation_base``, over its image, tail and
    exclusive path, weighted by ``SUPERSEDED_WEIGHT`` when superseded. Pure."""
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
    # A lineage's snapshots share one value and its checkpoints move as it grows: value whole lineages,
    # each walked once.
    values_by_id: dict[int, float] = {}
    for snap in list(affected.values()):
        if snap.id in values_by_id:
            continue
        unit = unit_of(snap)
        if unit is None:
            continue
        values_by_id.update(lineage_values(index, unit, cost))
        affected.update((member.id, member) for member in unit.chain)
        values_by_id.setdefault(snap.id, snap.base_l)  # above the Boundary the unit starts at: not kept
    ids, values = [], []
    for sid in sorted(affected):
        value = values_by_id.get(sid)
        if value is None:
            value = own_value(index, affected[sid], cost)
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
    index: PrefixIndex,
    slabs_needed: int,
    denser_than: float | None = None,
    release_pinned: bool = False,
    spared: Callable[[Snapshot], bool] | None = None,
) -> list[ev.CacheEvent] | None:
    """One step toward ``slabs_needed`` free slabs: [] when they are free, None when nothing can be
    evicted (everything is pinned, or with ``denser_than``, the snapshot with the lowest H has a density
    term of at least that: a hedge's image is admitted only over victims worth less per byte,
    hedge_admission.py). A dead-KV step names up to the whole shortfall at once, then, with
    ``release_pinned``, a step of host copies that running lanes' pinned device copies duplicate
    (``pinned_duplicates``; the facade asks for it in write-back mode and not for a hedge); otherwise
    the host snapshot with the lowest H goes (the deepest among equals; see the module note), L rising to
    its H; with ``spared`` (the recency floor, recency_floor.py), the lowest among those it does not
    spare while any exist.
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
    if spared is not None:
        candidates = [s for s in candidates if not spared(s)] or candidates
    victim = min(candidates, key=lambda s: (s.gdsf_h, -s.frontier, s.id))
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
