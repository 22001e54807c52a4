"""An active request's lane: its pages, state slot, tokens, planned taps and pending restore."""

from __future__ import annotations

import bisect

from hybridcache.cache.facade_results import PageCopy
from hybridcache.cache.ids import BLOCK_TOKENS, PageId, SlotId
from hybridcache.cache.prefill_passes import flexible_landings, pass_end
from hybridcache.cache.tap_planner import Placement, PlannedTap, TapSource
from hybridcache.core.api import RequestAccounting
from hybridcache.core.endpoint_refills import RefillJob
from hybridcache.core.requests import Request
from hybridcache.gpu.sampler import LaneSamplingState
from hybridcache.gpu.transfers import RestoreTicket


class LaneState:
    """Worker-side state of one lane. Mutated by the worker only.

    `tokens` holds the prompt and every sampled token; `computed` counts the positions whose KV and
    state exist (the last sampled token is not computed until the next decode step).
    """

    def __init__(
        self,
        lane_id: int,
        request: Request,
        slot: SlotId,
        block_table: list[PageId],
        base: int,
        taps: list[PlannedTap],
        sampler: LaneSamplingState,
        accounting: RequestAccounting,
        tap_pass_tokens: int,
    ) -> None:
        """``tap_pass_tokens``: the pass length FLEXIBLE taps land on the ends of (`prefill_passes`)."""
        self.lane_id = lane_id
        self.request = request
        self.slot = slot
        self.block_table = block_table
        self.tokens: list[int] = list(request.prompt.token_ids)
        self.prompt_len = len(self.tokens)
        self.computed = base
        self.base = base
        self.exact_taps = sorted(t.position for t in taps if t.placement == Placement.EXACT)
        flexible = [t.position for t in taps if t.placement == Placement.FLEXIBLE]
        landed = flexible_landings(flexible, self.exact_taps, base, self.prompt_len, tap_pass_tokens)
        inner = {t.position for t in taps if t.placement == Placement.INNER}.union(landed)
        self.inner_taps = sorted(inner.difference(self.exact_taps))
        self.hedge_taps = frozenset(t.position for t in taps if t.source == TapSource.HEDGE)
        self.boundary = {t.position: t.boundary for t in taps}
        self.restore: RestoreTicket | None = None
        self.tail_copy: PageCopy | None = None
        self.sampler = sampler
        self.accounting = accounting
        self.taps_taken = 0
        self.taps_skipped = 0
        self.inserted_prompt_blocks = 0  # blocks its prefill inserted into the tree (not found there)
        # Its first `exact_tokens` positions are computed as a cold prefill computes them
        # (cache/exactness.py): the prompt, when it resumed from exact entries; else only what it reused.
        self.exact_tokens = self.prompt_len
        self.refill_job: RefillJob | None = None  # what an internal refill lane replays

    def add_inner_tap(self, position: int, boundary: bool) -> None:
        """Plan one more tap captured inside its pass (a coalescing target, §12.2); a position already
        planned as an exact or inner tap is only marked ``boundary``. Mutates the plan."""
        if position not in self.inner_taps and position not in self.exact_taps:
            bisect.insort(self.inner_taps, position)
        self.boundary[position] = self.boundary.get(position, False) or boundary

    @property
    def generated(self) -> int:
        return len(self.tokens) - self.prompt_len

    @property
    def prefilling(self) -> bool:
        return self.computed < self.prompt_len

    def next_chunk_end(self, chunk: int) -> int:
        """End of the next prefill pass of at most ``chunk`` tokens (``prefill_passes.pass_end``)."""
        return pass_end(self.computed, self.prompt_len, chunk, self.exact_taps)

    def inner_due(self, start: int, end: int) -> list[int]:
        """Inner taps the pass [start, end) captures inside itself (strictly inside; one at its end is a copy
        of the lane's state after it, `taps_at`)."""
        return [p for p in self.inner_taps if start < p < end]

    def pages_needed(self, end: int) -> int:
        """More pages the block table needs to hold positions below `end`."""
        return max(0, -(-end // BLOCK_TOKENS) - len(self.block_table))

    def taps_at(self, end: int) -> list[int]:
        """Frontiers to snapshot after a pass that ends at `end` (spec §7.1): the exact and inner taps there
        (FLEXIBLE taps are inner taps at their landings)."""
        return sorted(p for p in (*self.exact_taps, *self.inner_taps) if p == end)
