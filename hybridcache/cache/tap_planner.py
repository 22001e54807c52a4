"""Tap planning (spec §7.1, with the issue-9 change): where a prefill takes state snapshots.

A tap at position p snapshots the state after tokens [0, p) (frontier F = p). Candidates, by priority:

    1 EXPLICIT     client-named breakpoints                         at the token, INNER, Boundary
    2 OPENER       start of the final assistant generation opener   at the token, INNER
    3 STRUCTURAL   end of tools / leading system block              at the token, INNER, Boundary
      AUTOMATIC    protocol-automatic markers, planned as STRUCTURAL but published as ordinary taps
    4 PROMPT_TAIL  n − 1, INNER
    These lie exactly where later requests diverge, inside a block or not. A snapshot inside a block
    keeps the state at the block boundary below it plus the Gated DeltaNet layer inputs since (a pending
    tail, `StateSlots`), so a resume computes the block's delta-rule sub-chunk whole, as a cold run does,
    and is bit-exact; it is taken inside the prefill pass without splitting it (as HEDGE below), so a cold
    prompt's passes are the same with and without the cache.
    5 LADDER       n − G·2^k, snapped back to a message boundary within the min gap; flexible, 64-aligned.
                   Before the hedges: on a long cold prompt five hedges and the tail would crowd the
                   ladder out of the budget, and its rungs are where other conversations sharing a long
                   preamble (tools, system prompt) diverge.
    6 HEDGE        the last block boundary before n − 1, then n − 256, n − 512, n − 1024, n − 2048 snapped
                   down to a block boundary: states a little before the prompt end, so that an edit or a
                   regeneration of the last message of a prompt without known structure (token ids,
                   unknown templates) resumes close to where it diverges (llama.cpp keeps one such
                   checkpoint ~512 tokens before every prompt end). The last block boundary serves a next
                   request that rewrites the prompt's last block (block-hashed traces such as WEKA's
                   re-hash it in the next request; a client that re-renders the end of its last message
                   does the same), which the tail at n − 1 lies past; when n − 1 is itself a block
                   boundary, the block before it (the traces re-hash the last whole block then).
                   INNER: taken inside a prefill pass without splitting it (the chunked delta rule has the
                   state at every 64-token sub-chunk boundary of a pass; ``GatedDeltaNet.capturing_states``).
                   Hedges are short-lived by valuation: each lies in the middle of its lineage, so GDSF
                   values it by the few hundred tokens it saves over the snapshot above it (a low density:
                   they are the first snapshots to go under host pressure), the deepest one is superseded
                   by the prompt tail and the endpoint taken after it, and the next request of the
                   conversation hedges near its own end. A prompt that resumes nothing from the cache
                   (base 0) is hedged only with ``hedge_cold_prompts``, which the engine and the simulator
                   set where hedge images have a host budget (``--cache-hedge-budget`` > 0): there a cold
                   prompt's hedges cost budgeted bytes the host policy reclaims first, and the cold prompt
                   is often what later requests fork from (a conversation's or a sub-agent's first
                   prompt). Without a budget (an image outweighs the KV of 256 tokens, as on `small`) its
                   hedges, up to five state images that stay resident, would pay only for an edit of a
                   one-off prompt's last message; its tail is still taken, and its next turn, resumed,
                   hedges.
Rules: every tap lies in (base, n − 1]; a position strictly inside an exclusion (media) span moves to the
span start (the prompt tail is dropped instead); semantic boundaries (opener, structural, automatic) at
one position form one candidate with the best member's priority and Boundary-ness from any member; a
semantic candidate is dropped when an accepted tap, an existing frontier or the base lies at most
SEMANTIC_PROXIMITY_TOKENS before it, a hedge, ladder or tail candidate when one lies at most 64 tokens
before it; an explicit candidate is dropped only when it repeats one of those positions; ladder
candidates also keep ``min_gap_tokens`` on both sides of accepted taps, existing frontiers and the base;
at most ``max_new_taps`` are kept, taken in priority order (semantic ones by position, the ladder by k),
hedges nearest the end first, so a full budget drops the farthest; hedges also keep ``min_gap_tokens``
from accepted ladder rungs. A request resumed from an endpoint snapshot skips the opener. Everything here
is pure and deterministic.
"""

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from enum import IntEnum
from types import MappingProxyType
from typing import NamedTuple

import msgspec

from hybridcache.cache.ids import BLOCK_TOKENS

PROXIMITY_TOKENS = BLOCK_TOKENS
"""A hedge, ladder or prompt-tail candidate this close after an accepted tap, existing frontier or the base
is redundant."""

SEMANTIC_PROXIMITY_TOKENS = 4
"""An opener, structural or automatic candidate this close after an accepted tap, existing frontier or the
base is redundant. Small: these taps lie at the very token later requests diverge at (the generation
opener of a chat turn lies 3 to 5 tokens before the prompt end, the end of a system block a few dozen
tokens before it in a short first turn), so each saves what lies between it and the tap before it."""


class HintKind(IntEnum):
    """What the frontend says sits at a hint position."""

    EXPLICIT = 1
    OPENER = 2
    STRUCTURAL = 3
    AUTOMATIC = 4
    MESSAGE = 5
    """A plain message boundary: never a tap by itself, only a place a ladder tap snaps back to."""


class TapSource(IntEnum):
    """Why a tap was planned."""

    EXPLICIT = 1
    OPENER = 2
    STRUCTURAL = 3
    AUTOMATIC = 4
    PROMPT_TAIL = 5
    LADDER = 6
    HEDGE = 7


class Placement(IntEnum):
    """EXACT taps split the prefill chunk at their position; FLEXIBLE ones land on the ends of passes of the
    tap pass length (`prefill_passes`); INNER ones are captured inside the pass that covers them, without a
    split."""

    EXACT = 1
    FLEXIBLE = 2
    INNER = 3


HEDGE_DISTANCES = (256, 512, 1024, 2048)
"""Tokens before the prompt end at which hedges are planned (each then snapped down to a block), after the
one at the last block boundary before the prompt tail."""


class TapHint(NamedTuple):
    position: int
    kind: HintKind


class PlannedTap(NamedTuple):
    position: int
    placement: Placement
    source: TapSource
    boundary: bool
    """Published as a Boundary snapshot (explicit or structural, §9.3 supersession rule)."""


class TapOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Planner limits (spec §14.2). Construction raises ValueError for out-of-range values."""

    max_new_taps: int
    ladder_tokens: int
    min_gap_tokens: int
    hedges: bool = True  # plan HEDGE taps near the prompt end
    hedge_cold_prompts: bool = False  # hedge a prompt that resumes nothing too (hedges have a host budget)

    def __post_init__(self) -> None:
        if self.max_new_taps < 0:
            raise ValueError(f"max_new_taps must be non-negative, got {self.max_new_taps}")
        if self.ladder_tokens < BLOCK_TOKENS:
            raise ValueError(f"ladder_tokens must be at least {BLOCK_TOKENS}, got {self.ladder_tokens}")
        if self.min_gap_tokens < 0:
            raise ValueError(f"min_gap_tokens must be non-negative, got {self.min_gap_tokens}")


def derive_tap_options(
    prefill_chunk: int,
    host_tier: bool,
    *,
    max_new_taps: int | None = None,
    ladder_tokens: int | None = None,
    min_gap_tokens: int | None = None,
    hedges: bool = True,
    hedge_cold_prompts: bool = False,
) -> TapOptions:
    """The §14.2 defaults, each replaced by its override when given. Pure.

    max_new_taps 8 with a host tier, 2 without; ladder max(4096, 2·chunk); min gap max(1024, chunk).
    Raises ValueError for a non-positive ``prefill_chunk`` or an out-of-range override.
    """
    if prefill_chunk <= 0:
        raise ValueError(f"prefill_chunk must be positive, got {prefill_chunk}")
    return TapOptions(
        max_new_taps=(8 if host_tier else 2) if max_new_taps is None else max_new_taps,
        ladder_tokens=max(4096, 2 * prefill_chunk) if ladder_tokens is None else ladder_tokens,
        min_gap_tokens=max(1024, prefill_chunk) if min_gap_tokens is None else min_gap_tokens,
        hedges=hedges,
        hedge_cold_prompts=hedge_cold_prompts,
    )


def with_fork_hint(
    hints: Sequence[TapHint | tuple[int, int]], fork_tokens: int, base: int, n: int
) -> list[TapHint | tuple[int, int]]:
    """``hints`` plus a structural hint at the fork point of the cached tree, when the prompt's cached
    prefix ends where another cached sequence continued differently (``Quote.fork_tokens``) and the
    resume frontier lies before it. Pure.

    Deviation from the spec (which taps divergences only between coalesced requests, §12.2): a prompt
    that leaves the cached tree at a fork is the second sequence to diverge there, so later ones will
    too (sub-agents after a shared preamble, requests sharing a document): the fork gets a Boundary
    snapshot. Measured with ``hybridcache simulate`` (see issue 7's note).
    """
    out: list[TapHint | tuple[int, int]] = list(hints)
    if base < fork_tokens < n:
        out.append(TapHint(fork_tokens, HintKind.STRUCTURAL))
    return out


class _Candidate(NamedTuple):
    position: int
    source: TapSource
    boundary: bool


_SOURCE_OF_HINT = MappingProxyType(
    {
        HintKind.EXPLICIT: TapSource.EXPLICIT,
        HintKind.OPENER: TapSource.OPENER,
        HintKind.STRUCTURAL: TapSource.STRUCTURAL,
        HintKind.AUTOMATIC: TapSource.AUTOMATIC,
    }
)
_PLANNING_RANK = MappingProxyType(
    {
        TapSource.EXPLICIT: 1,
        TapSource.OPENER: 2,
        TapSource.STRUCTURAL: 3,
        TapSource.AUTOMATIC: 3,
    }
)
_SEMANTIC_KINDS = (HintKind.OPENER, HintKind.STRUCTURAL, HintKind.AUTOMATIC)
_BOUNDARY_KINDS = (HintKind.EXPLICIT, HintKind.STRUCTURAL)


def plan_taps(
    n: int,
    base: int,
    hints: Sequence[TapHint | tuple[int, int]],
    existing_frontiers: Sequence[int],
    options: TapOptions,
    exclusions: Sequence[tuple[int, int]] = (),
    resumed_from_endpoint: bool = False,
) -> list[PlannedTap]:
    """The taps a prefill of ``n`` prompt tokens from frontier ``base`` takes, sorted by position. Pure.

    ``hints``: ``TapHint``s or plain ``(position, kind)`` pairs (``PreparedPrompt.tap_hints``).
    ``existing_frontiers``: frontiers of snapshots already on this path. ``exclusions``: half-open media
    spans [start, end); a frontier p with start < p < end would split one. Raises ValueError when
    ``n`` or ``base`` is negative, ``base`` > ``n``, a hint lies outside [0, n] or has an unknown kind,
    or a span is reversed.
    """
    hints = [TapHint(int(position), HintKind(kind)) for position, kind in hints]
    _validate(n, base, hints, exclusions)
    if base >= n - 1 or options.max_new_taps == 0:
        return []
    spans = sorted((start, end) for start, end in exclusions if end - start > 1)
    planner = _Acceptance(base, existing_frontiers, options)
    for candidate in _explicit_candidates(n, base, hints, spans):
        planner.offer_explicit(candidate)
    for candidate in _semantic_candidates(n, base, hints, spans, resumed_from_endpoint):
        planner.offer_near(candidate, SEMANTIC_PROXIMITY_TOKENS)
    tail = _tail_candidate(n, base, spans)
    if tail is not None:
        planner.offer_tail(tail)
    for candidate in _ladder_candidates(n, base, hints, spans, options):
        planner.offer_ladder(candidate)
    for candidate in _hedge_candidates(n, base, spans) if _hedged(base, options) else ():
        planner.offer_hedge(candidate)
    return planner.planned()


def _validate(n: int, base: int, hints: Sequence[TapHint], exclusions: Sequence[tuple[int, int]]) -> None:
    if n < 0 or base < 0 or base > n:
        raise ValueError(f"need 0 <= base <= n, got base={base} n={n}")
    for hint in hints:
        if not 0 <= hint.position <= n:
            raise ValueError(f"hint {hint} outside the prompt [0, {n}]")
    for start, end in exclusions:
        if end < start:
            raise ValueError(f"exclusion span ({start}, {end}) ends before it starts")


def _floor_block(position: int) -> int:
    return position - position % BLOCK_TOKENS


def _span_start_around(position: int, spans: Sequence[tuple[int, int]]) -> int | None:
    """The start of a span strictly containing ``position`` (start < position < end), if any."""
    for start, end in spans:
        if start >= position:
            return None
        if position < end:
            return start
    return None


def _place_exact(position: int, spans: Sequence[tuple[int, int]]) -> int:
    """``position`` moved to the start of a span it splits (repeatedly, for nested spans)."""
    placed = position
    while (start := _span_start_around(placed, spans)) is not None:
        placed = start
    return placed


def _place_aligned(position: int, spans: Sequence[tuple[int, int]]) -> int:
    """``position`` moved out of any span it splits and snapped down to a block boundary."""
    placed = _floor_block(position)
    while (start := _span_start_around(placed, spans)) is not None:
        placed = _floor_block(start)
    return placed


def _explicit_candidates(
    n: int, base: int, hints: Sequence[TapHint], spans: Sequence[tuple[int, int]]
) -> list[_Candidate]:
    positions = {_place_exact(h.position, spans) for h in hints if h.kind == HintKind.EXPLICIT}
    return [_Candidate(p, TapSource.EXPLICIT, True) for p in sorted(positions) if base < p <= n - 1]


def _semantic_candidates(
    n: int,
    base: int,
    hints: Sequence[TapHint],
    spans: Sequence[tuple[int, int]],
    resumed_from_endpoint: bool,
) -> list[_Candidate]:
    """Opener / structural / automatic hints, one candidate per placed position, ordered by (planning
    rank, position)."""
    kinds_at: dict[int, list[HintKind]] = {}
    for hint in hints:
        if hint.kind in _SEMANTIC_KINDS and not (resumed_from_endpoint and hint.kind == HintKind.OPENER):
            kinds_at.setdefault(_place_exact(hint.position, spans), []).append(hint.kind)
    candidates = [
        _Candidate(
            position,
            min((_SOURCE_OF_HINT[kind] for kind in kinds), key=lambda s: (_PLANNING_RANK[s], s)),
            any(kind in _BOUNDARY_KINDS for kind in kinds),
        )
        for position, kinds in kinds_at.items()
        if base < position <= n - 1
    ]
    return sorted(candidates, key=lambda c: (_PLANNING_RANK[c.source], c.position))


def _tail_candidate(n: int, base: int, spans: Sequence[tuple[int, int]]) -> _Candidate | None:
    """The prompt tail n − 1, or None when it splits a media span or lies at or before the base."""
    if _span_start_around(n - 1, spans) is not None or n - 1 <= base:
        return None
    return _Candidate(n - 1, TapSource.PROMPT_TAIL, False)


def _hedged(base: int, options: TapOptions) -> bool:
    return options.hedges and (base > 0 or options.hedge_cold_prompts)


def _hedge_candidates(n: int, base: int, spans: Sequence[tuple[int, int]]) -> list[_Candidate]:
    """The last block boundary before n − 1, then n − d for each hedge distance d, nearest the end first,
    on a block boundary out of media spans."""
    targets = (n - 2, *(n - distance for distance in HEDGE_DISTANCES if n - distance > base))
    placed = (_place_aligned(target, spans) for target in targets)
    return [_Candidate(p, TapSource.HEDGE, False) for p in placed if base < p <= n - 1]


def _ladder_candidates(
    n: int, base: int, hints: Sequence[TapHint], spans: Sequence[tuple[int, int]], options: TapOptions
) -> list[_Candidate]:
    """n − G·2^k for k = 0, 1, … above the base, each snapped back to a hint within the min gap."""
    boundaries = sorted({h.position for h in hints})
    candidates: list[_Candidate] = []
    step = options.ladder_tokens
    while n - step > base:
        target = n - step
        low = bisect_left(boundaries, target - options.min_gap_tokens)
        high = bisect_right(boundaries, target)
        snapped = boundaries[high - 1] if high > low else target
        placed = _place_aligned(snapped, spans)
        if base < placed <= n - 1:
            candidates.append(_Candidate(placed, TapSource.LADDER, False))
        step *= 2
    return candidates


class _Acceptance:
    """Accepts candidates in the order offered, applying the proximity, gap and budget rules."""

    def __init__(self, base: int, existing: Sequence[int], options: TapOptions) -> None:
        self._base = base
        self._existing = sorted(set(existing))
        self._options = options
        self._accepted: list[_Candidate] = []

    def offer_explicit(self, candidate: _Candidate) -> None:
        taken = {c.position for c in self._accepted}
        if candidate.position in taken or self._is_existing(candidate.position):
            return
        self._accept(candidate)

    def offer_near(self, candidate: _Candidate, proximity: int = PROXIMITY_TOKENS) -> None:
        if not self._has_room() or self._something_just_before(candidate.position, proximity=proximity):
            return
        self._accept(candidate)

    def offer_hedge(self, candidate: _Candidate) -> None:
        """As ``offer_near``, and never within the min gap of an accepted ladder rung (the ladder keeps its
        gap on both sides; with the default spacing the rung n − G and the hedge n − 2048 lie at least the
        gap apart, so this drops nothing there)."""
        gap = self._options.min_gap_tokens
        rungs = (c.position for c in self._accepted if c.source == TapSource.LADDER)
        if any(abs(candidate.position - rung) < gap for rung in rungs):
            return
        self.offer_near(candidate)

    def offer_tail(self, candidate: _Candidate) -> None:
        """The prompt tail: dropped beside an accepted tap or an existing frontier, but not for lying close
        past the base, which is the only reuse a short first prompt gets."""
        if self._has_room() and not self._something_just_before(candidate.position, counting_base=False):
            self._accept(candidate)

    def offer_ladder(self, candidate: _Candidate) -> None:
        if not self._has_room() or self._something_just_before(candidate.position):
            return
        gap = self._options.min_gap_tokens
        anchors = [self._base, *self._existing, *(c.position for c in self._accepted)]
        if any(abs(candidate.position - anchor) < gap for anchor in anchors):
            return
        self._accept(candidate)

    def planned(self) -> list[PlannedTap]:
        return [
            PlannedTap(c.position, _placement_of(c.source), c.source, c.boundary)
            for c in sorted(self._accepted, key=lambda c: c.position)
        ]

    def _has_room(self) -> bool:
        return len(self._accepted) < self._options.max_new_taps

    def _accept(self, candidate: _Candidate) -> None:
        if self._has_room():
            self._accepted.append(candidate)

    def _is_existing(self, position: int) -> bool:
        index = bisect_left(self._existing, position)
        return index < len(self._existing) and self._existing[index] == position

    def _something_just_before(
        self, position: int, counting_base: bool = True, proximity: int = PROXIMITY_TOKENS
    ) -> bool:
        """An accepted tap, existing frontier or (when `counting_base`) the base at most `proximity` tokens
        before ``position``."""
        earliest = position - proximity
        if counting_base and earliest <= self._base <= position:
            return True
        if bisect_right(self._existing, position) > bisect_left(self._existing, earliest):
            return True
        return any(earliest <= c.position <= position for c in self._accepted)


def _placement_of(source: TapSource) -> Placement:
    return Placement.FLEXIBLE if source == TapSource.LADDER else Placement.INNER
