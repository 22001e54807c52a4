"""One simulated request through the real cache, in the engine's order of calls (core/worker.py).

``admit``: quote -> stage -> plan taps -> activate (-> restore_done at once: copies complete instantly),
then prefill in chunks exactly as the worker cuts them (exact taps split a chunk, flexible taps land on
chunk boundaries, inner taps are captured inside a pass 64-aligned with them and split any other), taking
taps, committing blocks and publishing ready taps after each pass; then the
decode: growth pages and the commit of every generated block. ``finish``: the terminal settlement
(``Cache.finish``: endpoint, host writes), or for the ``align`` policy one aligned tap and a release.
Every host write lands at once (``host_write_done``; a write-back on eviction lands inside the cache).
The "model" is the cost model: it gives each request a duration, nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence
from enum import IntEnum
from typing import NamedTuple

from hybridcache.cache.facade import Cache
from hybridcache.cache.facade_results import FinishResult, HostWritePlan, PublishResult, StaleQuote
from hybridcache.cache.hedge_admission import hedge_host_bytes
from hybridcache.cache.ids import BLOCK_TOKENS, SnapshotId
from hybridcache.cache.match import PromptInput, Readiness, SourceKind
from hybridcache.cache.prefill_passes import flexible_landings, pass_end
from hybridcache.cache.records import LaneId, SnapshotKind
from hybridcache.cache.tap_planner import (
    Placement,
    PlannedTap,
    TapHint,
    TapOptions,
    TapSource,
    plan_taps,
    with_fork_hint,
)
from hybridcache.tools.sim.counters import SimCounters
from hybridcache.tools.sim.material import RequestMaterial, TokenView
from hybridcache.tools.sim.policies import Policy, hedge_room, touch
from hybridcache.tools.sim.shapes import ModelShape

OUTPUT_WINDOW_TOKENS = 512  # as core/worker.py: pages reserved at admission for the answer


class Admission(IntEnum):
    STARTED = 0
    BLOCKED = 1  # wait: the FIFO head blocks everything behind it
    INFEASIBLE = 2  # can never fit: dropped


class Admitted(NamedTuple):
    outcome: Admission
    seconds: float = 0.0  # modeled duration of the request (restore + prefill + decode)
    lane: int | None = None  # the lane it runs on (STARTED only)


class _Active(NamedTuple):
    material: RequestMaterial
    committed: int  # tokens committed by the end of decode
    snapshots: list[SnapshotId]  # hit or published by this request (for recency policies)


class RequestDriver:
    """Drives ``cache`` for one policy. Mutates the cache, its lanes and ``counters``."""

    def __init__(
        self,
        cache: Cache,
        policy: Policy,
        shape: ModelShape,
        tap_options: TapOptions,
        counters: SimCounters,
    ) -> None:
        self.cache = cache
        self.policy = policy
        self.shape = shape
        self.tap_options = tap_options
        self.counters = counters
        self.free_lanes = list(range(cache.index.geometry.max_concurrency - 1, -1, -1))
        self.active: dict[int, _Active] = {}
        self._hedges: set[int] = set()  # the hedge positions of the request being prefilled

    # ------------------------------------------------------------------ admission and prefill
    def admit(self, material: RequestMaterial, hints: list[TapHint]) -> Admitted:
        """Admit, prefill and decode ``material`` on a free lane (the caller checked one is free).
        Mutates; raises nothing for an ordinary wait (BLOCKED) or a request too long (INFEASIBLE)."""
        cache = self.cache
        n = material.prompt_tokens
        prompt = PromptInput(
            TokenView(material.tokens[:n]),
            material.block_hashes,
            None,
            (),
            min(material.generated_tokens, OUTPUT_WINDOW_TOKENS),
            True,
            material.prompt_bytes,
        )
        quote = cache.quote(prompt)
        if quote.readiness == Readiness.PERMANENTLY_INFEASIBLE:
            self.counters.requests_infeasible += 1
            return Admitted(Admission.INFEASIBLE)
        if quote.readiness == Readiness.TEMPORARILY_BLOCKED:
            return Admitted(Admission.BLOCKED)
        lane = self.free_lanes.pop()
        try:
            staged = cache.stage(quote, lane)
        except StaleQuote:
            self.free_lanes.append(lane)
            return Admitted(Admission.BLOCKED)
        base = staged.reuse_tokens
        taps = []
        if self.policy is not Policy.ALIGN:  # planned before activation, as the worker does: the lane
            # still names its source snapshot then (an endpoint resume skips the opener tap)
            taps = self._plan_taps(lane, n, base, with_fork_hint(hints, quote.fork_tokens, base, n))
        cache.activate(lane)
        if staged.restore is not None:
            cache.restore_done(staged.restore.batch)
        self._count_admission(material, quote.host_only_nodes, quote.tail_restore, staged)
        snapshots = [] if staged.snapshot is None else [staged.snapshot]
        table_pages = len(staged.block_table)
        table_pages = self._prefill(lane, material, base, taps, table_pages, snapshots)
        committed = self._decode(lane, material, table_pages, snapshots)
        self.active[lane] = _Active(material, committed, snapshots)
        seconds = (
            self.shape.cost.restore_seconds(staged.restored_host_bytes)
            + self.shape.cost.prefill_seconds(base, n - base)
            + self.shape.decode_seconds_per_token * material.generated_tokens
        )
        self.counters.model_prefill_seconds += self.shape.cost.prefill_seconds(base, n - base)
        return Admitted(Admission.STARTED, seconds, lane)

    def _count_admission(self, material: RequestMaterial, host_nodes, tail_restore: bool, staged) -> None:
        c = self.counters
        n, base = material.prompt_tokens, staged.reuse_tokens
        host_tokens = 0
        if staged.source_kind == SourceKind.HOST:
            snap = self.cache.index.snapshots.get(staged.snapshot) if staged.snapshot is not None else None
            tail = len(snap.tail_tokens) if (snap is not None and tail_restore) else 0
            host_tokens = min(base, BLOCK_TOKENS * len(host_nodes) + tail)
        c.requests += 1
        c.echoed_requests += material.echoed
        c.input_tokens += n
        c.computed_tokens += n - base
        c.reused_tokens_host_kv += host_tokens
        c.reused_tokens_device_kv += base - host_tokens
        c.generated_tokens += material.generated_tokens
        kv_bytes = self.cache.index.geometry.page_bytes * (len(host_nodes) + int(tail_restore))
        c.restored_kv_bytes += kv_bytes
        c.restored_state_bytes += staged.restored_host_bytes - kv_bytes
        c.host_resumed_requests += staged.restored_host_bytes > 0
        c.resumed_from_snapshot += staged.snapshot is not None

    def _plan_taps(
        self, lane: int, n: int, base: int, hints: Sequence[TapHint | tuple[int, int]]
    ) -> list[PlannedTap]:
        index = self.cache.index
        la = index.lanes[LaneId(lane)]
        frontiers = [s.frontier for node in (index.root, *la.path) for s in node.snapshots]
        resumed = la.source
        return plan_taps(
            n,
            base,
            hints,
            frontiers,
            self.tap_options,
            resumed_from_endpoint=resumed is not None and resumed.kind == SnapshotKind.ENDPOINT,
        )

    def _prefill(
        self,
        lane: int,
        material: RequestMaterial,
        base: int,
        taps: list[PlannedTap],
        table_pages: int,
        snapshots: list[SnapshotId],
    ) -> int:
        """The worker's chunk loop (``_prefill_pass`` with ``LaneState``); returns the table length."""
        n = material.prompt_tokens
        chunk = self.shape.cost.prefill_chunk_tokens
        exact = sorted(t.position for t in taps if t.placement == Placement.EXACT)
        flexible = [t.position for t in taps if t.placement == Placement.FLEXIBLE]
        inner_set = {t.position for t in taps if t.placement == Placement.INNER}
        inner = sorted(inner_set.union(flexible_landings(flexible, exact, base, n, chunk)).difference(exact))
        self._hedges = {t.position for t in taps if t.source == TapSource.HEDGE}
        boundary = {t.position: t.boundary for t in taps}
        computed = base
        while computed < n:
            start = computed
            end = pass_end(start, n, chunk, exact)
            table_pages = self._grow(lane, end, table_pages)
            for position in (p for p in inner if start < p < end):  # captured inside the pass
                self._take_tap(lane, position, boundary.get(position, False))
            computed = end
            for position in (p for p in (*exact, *inner) if p == end):
                self._take_tap(lane, position, boundary.get(position, False))
            committed = TokenView(material.tokens[:end])
            self.cache.commit_blocks(lane, committed, material.block_hashes)
            self._land(self.cache.publish_ready_taps(lane, committed), snapshots)
        return table_pages

    def _take_tap(self, lane: int, position: int, boundary: bool) -> None:
        if position in self._hedges and not hedge_room(self.cache):
            self.counters.taps_skipped += 1  # as the worker: a hedge never takes the tail's slot
            return
        hedge = position in self._hedges
        result = self.cache.take_tap(lane, position, boundary, hedge)
        if result.slot is None:
            self.counters.taps_skipped += 1
        else:
            self.counters.taps_taken += 1
            self.counters.hedges_taken += hedge

    def _grow(self, lane: int, end: int, table_pages: int) -> int:
        need = -(-end // BLOCK_TOKENS) - table_pages
        if need <= 0:
            return table_pages
        pages = self.cache.allocate_growth_pages(lane, need)
        return table_pages if pages is None else table_pages + len(pages)

    def _decode(
        self, lane: int, material: RequestMaterial, table_pages: int, snapshots: list[SnapshotId]
    ) -> int:
        """Grow for every generated position and commit the generated blocks; returns tokens committed
        (fewer than prompt + generated - 1 when the pool cannot extend: bounded completion)."""
        committed = material.committed_tokens
        grown = self._grow(lane, committed, table_pages)
        if grown * BLOCK_TOKENS < committed:
            committed = max(grown * BLOCK_TOKENS, material.prompt_tokens)
            self.counters.requests_truncated += 1
        view = TokenView(material.tokens[:committed])
        self.cache.commit_blocks(lane, view, material.block_hashes)
        self._land(self.cache.publish_ready_taps(lane, view), snapshots)
        return committed

    # ------------------------------------------------------------------ finish
    def finish(self, lane: int) -> None:
        """Terminal settlement of ``lane`` and its write-through. Mutates; frees the lane."""
        active = self.active.pop(lane)
        cache = self.cache
        view = TokenView(active.material.tokens[: active.committed])
        path = list(cache.index.lanes[LaneId(lane)].path)
        if self.policy is Policy.ALIGN:
            result = self._finish_aligned(lane, view, active.snapshots)
        else:
            result = cache.finish(lane, view, active.material.block_hashes)
        self._land(result.taps, active.snapshots)
        self._write(result.write)
        if result.endpoint is not None:
            self.counters.endpoints += 1
            active.snapshots.append(result.endpoint)
        touch(cache, path, active.snapshots)
        held = hedge_host_bytes(cache.index)
        self.counters.hedge_host_bytes_peak = max(self.counters.hedge_host_bytes_peak, held)
        self.free_lanes.append(lane)

    def _finish_aligned(self, lane: int, view: TokenView, snapshots: list[SnapshotId]) -> FinishResult:
        """``align``: one tap at the last block boundary reached, published, then a plain release."""
        cache = self.cache
        aligned = len(view) // BLOCK_TOKENS * BLOCK_TOKENS
        self._hedges = set()  # the aligned tap is never a hedge
        if aligned > cache.index.lanes[LaneId(lane)].base:
            self._take_tap(lane, aligned, False)
            self._land(cache.publish_ready_taps(lane, view), snapshots)
        return cache.release(lane)

    def _land(self, result: PublishResult, snapshots: list[SnapshotId]) -> None:
        snapshots.extend(tap.snapshot for tap in result.published)
        self._write(result.write)

    def _write(self, plan: HostWritePlan | None) -> None:
        if plan is not None:
            self.cache.host_write_done(plan.batch)
