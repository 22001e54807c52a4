"""The engine's worker loop: admission, prefill passes with taps, decode rounds, finish (spec §6–§7).

Only this task mutates the cache index and the lanes. Submissions, cancellations and transfer completions
arrive through the inbox (callables posted from anywhere on the loop) and are applied between units. The
forward (and sampling) runs on the compute executor; the worker awaits it, so device copies the worker
makes itself (slot copies, tail copies) never overlap a forward.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

import torch

from hybridcache.cache.checkpoint_round import CheckpointRound, checkpoint_parts
from hybridcache.cache.facade_results import (
    CommitResult,
    FinishResult,
    HostWritePlan,
    PageCopy,
    PublishResult,
    StateSourceKind,
)
from hybridcache.cache.ids import BLOCK_TOKENS, SlotId
from hybridcache.cache.integrity import check_integrity
from hybridcache.cache.match import PromptInput, Readiness, SourceKind
from hybridcache.cache.records import LaneId, SnapshotKind
from hybridcache.cache.slots import room_for_hedge, slots_within_reach
from hybridcache.cache.tap_planner import SEMANTIC_PROXIMITY_TOKENS, TapOptions, plan_taps, with_fork_hint
from hybridcache.core.api import RequestAccounting, RequestError, RequestOutput, TokenLogprob
from hybridcache.core.endpoint_refills import refill_taps
from hybridcache.core.lanes import LaneState
from hybridcache.core.refill_scheduler import RefillScheduler
from hybridcache.core.requests import Phase, Request
from hybridcache.core.worker_stats import WorkerCounters
from hybridcache.gpu.backend import DeviceError, DeviceEvent
from hybridcache.gpu.heap_trim import heap_trimmer
from hybridcache.gpu.model.gated_deltanet import capturing_states
from hybridcache.gpu.sampler import LaneSamplingState, SampleResult, is_stop, sample
from hybridcache.gpu.transfers import ImageCopy
from hybridcache.logs import get_logger
from hybridcache.persistence.event_sink import CHECKPOINT_EVERY_EVENTS

if TYPE_CHECKING:
    from hybridcache.core.engine import Engine

log = get_logger(__name__)

OUTPUT_WINDOW_TOKENS = 512  # pages reserved at admission for the answer; more are granted as it grows
SOURCE_NAMES = {SourceKind.ROOT: "root", SourceKind.DEVICE: "device", SourceKind.HOST: "host"}


def common_prefix_length(a, b) -> int:
    """Length of the longest common prefix of two token sequences (exact comparison). Pure."""
    length = min(len(a), len(b))
    for i in range(length):
        if a[i] != b[i]:
            return i
    return length


class ConstantExtras:
    """The same extra key for every block (a request's cache salt covers its generated blocks too)."""

    def __init__(self, key: int) -> None:
        self.key = key

    def __getitem__(self, index: int) -> int:
        return self.key

    def __len__(self) -> int:
        return 1 << 40


class Worker:
    def __init__(self, engine: Engine, compute: ThreadPoolExecutor) -> None:
        self.engine = engine
        self.cache = engine.cache
        self.runtime = engine.runtime
        self.options = engine.options
        self.compute = compute
        self.cache.host_copy = self._write_now  # write-back on eviction copies through this worker
        self.queue: deque[Request] = deque()
        self.lanes: dict[int, LaneState] = {}
        self.free_lanes = list(range(self.options.max_concurrency - 1, -1, -1))
        self.counters = WorkerCounters()
        self.stopping = False
        self._inbox: deque[Callable[[], None]] = deque()
        self._wake = asyncio.Event()
        self._waits: set[asyncio.Task[None]] = set()
        self._last_was_decode = False
        self._checkpointed_at = 0
        self._checkpoint_round = CheckpointRound()
        self._prefetch_in_flight = False
        self._prefetch_head: Request | None = None
        self._prefetch_room = 0
        self._prefetch_copied = False
        self._next_prefill = 0
        self._generator = torch.Generator().manual_seed(0)
        cache_options = self.options.cache
        self._tap_options = TapOptions(
            max_new_taps=cache_options.max_new_taps,
            ladder_tokens=cache_options.tap_ladder_tokens,
            min_gap_tokens=cache_options.tap_min_gap_tokens,
            hedges=cache_options.hedges,
            hedge_cold_prompts=bool(self.cache.hedge_budget_bytes),
        )
        self._eos = engine.eos_token_ids
        self._trim_heap = heap_trimmer()
        self._busy_since_trim = True  # the first idle moment trims what loading freed (tokenizer JSON)
        self.refills = RefillScheduler(self)

    # -- inbox ------------------------------------------------------------------------------------
    def post(self, action: Callable[[], None]) -> None:
        self._inbox.append(action)
        self._wake.set()

    def post_submit(self, request: Request) -> None:
        self.post(lambda: self.queue.append(request))

    def post_cancel(self, request_id: str) -> None:
        self.post(lambda: self._cancel(request_id))

    @property
    def inbox_pending(self) -> bool:
        return bool(self._inbox)

    def request_stop(self) -> None:
        self.stopping = True
        self._wake.set()

    # -- the loop ---------------------------------------------------------------------------------
    async def run(self) -> None:
        try:
            while True:
                self._wake.clear()
                self.cache.now = time.monotonic()  # the cache reads no clock: its recency floor's time
                self._drain_inbox()
                if self.stopping:
                    break
                self._expire_waiting()
                self.refills.preempt_if_busy()
                self._admit()
                unit = self._next_unit()
                if unit is None:
                    if self.engine.debug_integrity:
                        check_integrity(self.cache.index)
                    self._trim_heap_once()
                    await self._idle()
                    continue
                self._busy_since_trim = True
                await unit
                self._maybe_checkpoint()
                if self.engine.debug_integrity:
                    check_integrity(self.cache.index)
        except Exception as error:
            log.exception("engine worker failed; failing every request")
            self._fail_everything(RequestError("internal", f"the engine failed: {error}"))
            raise
        self._shutdown()

    def _trim_heap_once(self) -> None:
        """After work, give the freed heap back to the OS (on the compute thread, not awaited: a request
        arriving meanwhile queues behind it for at most tens of milliseconds)."""
        if self._busy_since_trim and self._trim_heap is not None:
            self._busy_since_trim = False
            asyncio.get_running_loop().run_in_executor(self.compute, self._trim_heap)

    def _maybe_checkpoint(self) -> None:
        """With an event log, record the index digest every few thousand events (replay proves it), one
        slice after each unit (``cache/checkpoint_round.py``) so a large index never stalls the worker."""
        journal = self.engine.journal
        if journal is None:
            return
        if not self._checkpoint_round.active:
            if journal.events - self._checkpointed_at < CHECKPOINT_EVERY_EVENTS:
                return
            self._checkpoint_round.begin(checkpoint_parts(self.cache.index))
        self.cache.checkpoint(*self._checkpoint_round.take())
        self._checkpointed_at = journal.events

    def _drain_inbox(self) -> None:
        while self._inbox:
            self._inbox.popleft()()

    async def _idle(self) -> None:
        timeout = None
        if self.queue:
            deadline = self.queue[0].arrival + self.options.pending_timeout_s
            timeout = max(0.0, deadline - time.monotonic()) + 0.001
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._wake.wait(), timeout)

    def _expire_waiting(self) -> None:
        now = time.monotonic()
        limit = self.options.pending_timeout_s
        while self.queue and now - self.queue[0].arrival > limit:
            request = self.queue.popleft()
            request.fail(RequestError("timeout", f"the request waited more than {limit:g} s for a lane"))

    # -- admission (§6) ---------------------------------------------------------------------------
    def _admit(self) -> None:
        while self.queue and self.free_lanes:
            request = self.queue[0]
            if request.cancelled:
                self.queue.popleft()
                continue
            if not self.try_admit(request):
                break  # the FIFO head is blocked; nothing overtakes it (§6.3)
            self.queue.popleft()
        if self.queue and not self.queue[0].cancelled:
            self._prefetch_for(self.queue[0])

    def prompt_input(self, request: Request) -> PromptInput:
        prompt = request.prompt
        enabled = prompt.prefix_reuse and self.options.cache.prefix_reuse
        extras = ConstantExtras(prompt.extra_key) if prompt.extra_key else None
        window = min(request.sampling.max_tokens, OUTPUT_WINDOW_TOKENS)
        return PromptInput(
            prompt.token_ids, prompt.block_hashes, extras, (), window, enabled,
            token_bytes=prompt.token_bytes, salt_key=prompt.extra_key,
            exact_only=self.options.cache.exact_resume or request.internal,
        )

    def _prefetch_for(self, head: Request) -> None:
        """§6.6: while the head waits, copy its host-only path blocks into spare device pages. One batch at
        a time; retried for the same head only while the last attempt copied blocks or room grew."""
        if self._prefetch_in_flight:
            return
        room = self.cache.index.num_free_pages
        if self._prefetch_head is head and not self._prefetch_copied and room <= self._prefetch_room:
            return
        keep_free = len(self.lanes)  # one page of growth per running lane stays free
        plan = self.cache.prefetch(self.prompt_input(head), keep_free=keep_free)
        self._prefetch_head, self._prefetch_room = head, room
        self._prefetch_copied = plan is not None
        if plan is None:
            return
        self._prefetch_in_flight = True
        ticket = self.runtime.transfers.restore(
            self.runtime.backend.restore_stream, [(b.page, b.slab) for b in plan.blocks]
        )
        self.counters.prefetched_blocks += len(plan.blocks)

        def landed(batch: int = plan.batch) -> None:
            self.cache.restore_done(batch)
            self._prefetch_in_flight = False

        self._watch(ticket.done, landed)

    def try_admit(self, request: Request) -> bool:
        prompt = request.prompt
        prompt_input = self.prompt_input(request)
        enabled = prompt_input.enabled
        quote = self.cache.quote(prompt_input)
        if quote.readiness == Readiness.TEMPORARILY_BLOCKED:
            return False
        if quote.readiness == Readiness.PERMANENTLY_INFEASIBLE:
            request.fail(RequestError("too_long", "the request can never fit in the device KV pool"))
            return True
        if enabled and self._wait_for_sibling(request, quote.reuse_tokens):
            return False
        lane_id = self.free_lanes.pop()
        staged = self.cache.stage(quote, lane_id)
        index_lane = self.cache.index.lanes[LaneId(lane_id)]
        resumed = index_lane.source
        taps = []
        if enabled:
            taps = plan_taps(
                prompt.num_tokens,
                staged.reuse_tokens,
                with_fork_hint(prompt.tap_hints, quote.fork_tokens, staged.reuse_tokens, prompt.num_tokens),
                self._path_frontiers(lane_id, prompt_input.exact_only),
                self._tap_options,
                resumed_from_endpoint=resumed is not None and resumed.kind == SnapshotKind.ENDPOINT,
            )
            taps = refill_taps(taps) if request.internal else taps
        accounting = RequestAccounting(
            prompt_tokens=prompt.num_tokens,
            reuse_tokens=staged.reuse_tokens,
            cached_prefix_tokens=quote.cached_prefix_tokens,
            restored_host_bytes=staged.restored_host_bytes,
            source=SOURCE_NAMES[staged.source_kind],
            prefill_tokens=prompt.num_tokens - staged.reuse_tokens,
        )
        sampler = LaneSamplingState.create(
            request.sampling, prompt.token_ids, self.runtime.model.config.vocab_size, self._generator,
            self.runtime.device,  # where the model's logits are: penalty and bias tensors must be there too
        )
        lane = LaneState(
            lane_id,
            request,
            staged.slot,
            list(staged.block_table),
            staged.reuse_tokens,
            taps,
            sampler,
            accounting,
            self.options.cache.tap_pass_tokens,
        )
        if staged.restore is not None:
            plan = staged.restore
            ticket = self.runtime.transfers.restore(
                self.runtime.backend.restore_stream,
                [(b.page, b.slab) for b in plan.blocks],
                [] if plan.tail is None else [(plan.tail.page, plan.tail.slab)],
                ImageCopy(staged.slot, plan.image_slabs) if plan.image_slabs else None,
            )
            lane.restore = ticket
            self._watch(ticket.done, lambda batch=plan.batch: self.cache.restore_done(batch))
        if staged.state_source == StateSourceKind.COPY_SLOT:
            assert staged.state_source_slot is not None
            self.runtime.states.copy_slot(staged.state_source_slot, staged.slot)
        lane.tail_copy = staged.tail_copy
        if enabled and not prompt_input.exact_only and not self.cache.resumed_exactly(lane_id):
            lane.exact_tokens = staged.reuse_tokens  # what it computes continues inexact entries
        self.cache.activate(lane_id)
        self.lanes[lane_id] = lane
        request.phase = Phase.PREFILL
        if not request.internal:  # a refill is idle-time work, not a request
            self.counters.admitted(accounting)
        request.emit(RequestOutput(request_id=request.id, accounting=accounting))
        return True

    def _wait_for_sibling(self, request: Request, reuse_tokens: int) -> bool:
        """In-flight prefix coalescing (§12.2): True when a lane still prefilling shares more of this
        prompt than the cache serves now; that lane then gets a tap captured inside its pass at the exact
        divergence token, and this head waits in the FIFO until the snapshot publishes."""
        prompt = request.prompt
        limit = prompt.num_tokens - 1
        waiting = False
        for lane in self.lanes.values():
            sibling = lane.request.prompt
            if lane.request.phase is not Phase.PREFILL or not sibling.prefix_reuse:
                continue
            if sibling.extra_key != prompt.extra_key:
                continue
            target = min(common_prefix_length(prompt.token_ids, sibling.token_ids), limit)
            if target <= reuse_tokens + SEMANTIC_PROXIMITY_TOKENS or lane.computed >= target:
                continue  # saves no more than a semantic tap would, or the sibling is past it (quoted)
            lane.add_inner_tap(target, boundary=True)
            waiting = True
        return waiting

    def _path_frontiers(self, lane_id: int, exact_only: bool) -> list[int]:
        """Frontiers of the snapshots already on the lane's matched path (taps dedup against them); an
        exact lane does not count inexact ones, which it never resumes from."""
        index_lane = self.cache.index.lanes[LaneId(lane_id)]
        anchors = [self.cache.index.root, *index_lane.path]
        snapshots = (snap for node in anchors for snap in node.snapshots)
        return [snap.frontier for snap in snapshots if not (exact_only and snap.inexact)]

    # -- units ------------------------------------------------------------------------------------
    def _next_unit(self):
        decoding = [lane for lane in self.lanes.values() if lane.request.phase is Phase.DECODE]
        prefilling = [lane for lane in self.lanes.values() if lane.request.phase is Phase.PREFILL]
        if decoding and (not prefilling or not self._last_was_decode):
            self._last_was_decode = True
            return self._decode_round(decoding)
        if prefilling:
            self._last_was_decode = False
            turn = (self._next_prefill + 1) % len(prefilling)
            if self._taps_await_image_writes(prefilling[turn]):
                return self.transfers_landed()  # the loop applies the landings, then runs the pass
            self._next_prefill = turn
            return self.prefill_pass(prefilling[turn])
        return self.refills.start_if_idle()

    def _taps_await_image_writes(self, lane: LaneState) -> bool:
        """Whether ``lane``'s next pass should first wait for the snapshot images being written to the host.
        While its host write is in flight a snapshot holds its device slot and cannot give it up
        (``slots.plan_snapshot_slot`` drops only a landed copy); once landed it can. Without the wait, a
        pass that starts right after another lane's pass published its taps (lanes take turns, and a pass
        publishes its taps as it ends) finds every slot held and skips its own taps: with two lanes and
        cold prompts arriving together, a prompt could keep no snapshot at all. A state image lands in
        milliseconds, but the wait also idles the compute threads, so it is taken only when the pass's taps
        outnumber the slots within reach (free, or held by a superseded or host-backed snapshot)."""
        index = self.cache.index
        if not self._waits or not any(batch.images for batch in index.host_writes.values()):
            return False
        start = lane.computed
        end = lane.next_chunk_end(self.refills.chunk_tokens(lane, self.options.prefill_chunk))
        wanted = len(lane.taps_at(end)) + len(lane.inner_due(start, end))
        return wanted > slots_within_reach(index)

    async def prefill_pass(self, lane: LaneState) -> None:
        start = lane.computed
        end = lane.next_chunk_end(self.refills.chunk_tokens(lane, self.options.prefill_chunk))
        if not self._grow(lane, end):
            self.finish_lane(lane, "length")
            return
        captures = {}  # offset into the pass -> the slot its state is copied into (no split)
        for frontier in lane.inner_due(start, end):
            slot = self._reserve_tap(lane, frontier)
            if slot is not None:
                captures[frontier - start] = slot
                self.counters.taps_in_pass += 1
        ticket, tail_copy = lane.restore, lane.tail_copy
        lane.restore = lane.tail_copy = None
        tokens = lane.tokens[start:end]
        final = end == lane.prompt_len
        sampled = final and not lane.request.internal  # a refill's pass ends nothing
        loop = asyncio.get_running_loop()
        result = await loop.run_in_executor(
            self.compute, self._prefill_compute, lane, tokens, start, ticket, tail_copy, sampled, captures
        )
        lane.computed = end
        for frontier in lane.taps_at(end):
            self._take_tap(lane, frontier)
        lane.inserted_prompt_blocks += self._commit(lane).inserted
        if self.refills.after_pass(lane, end - start, final):
            return  # a refill's pass: counted apart, samples nothing
        self.counters.prefill_tokens += end - start
        if final:
            lane.request.phase = Phase.DECODE
            self._accept_sample(lane, result)

    def _prefill_compute(
        self, lane: LaneState, tokens, start, ticket, tail_copy, final, captures
    ) -> SampleResult | None:
        """Compute thread: wait for the restore prelude, copy the tail, run the pass (waiting per layer)."""
        runtime = self.runtime
        hook = None
        if ticket is not None:
            ticket.prelude.wait_blocking()
            layers = ticket.layers

            def hook(layer: int) -> None:
                event = layers.get(layer)
                if event is not None:
                    event.wait_blocking()

        if tail_copy is not None:
            self._copy_page_prefix(tail_copy)
        with capturing_states(runtime.states, lane.slot, captures):
            logits = runtime.model.prefill(
                tokens, start, lane.block_table, lane.slot, runtime.kv, runtime.states, layer_hook=hook
            )
        if not final:
            return None
        return sample(logits[None, :], [lane.request.sampling], [lane.sampler])[0]

    async def _decode_round(self, lanes: list[LaneState]) -> None:
        ready = []
        for lane in lanes:
            if self._grow(lane, lane.computed + 1):
                ready.append(lane)
            else:
                self.finish_lane(lane, "length")  # bounded completion: the pool cannot extend
        if not ready:
            return
        loop = asyncio.get_running_loop()
        results = await loop.run_in_executor(self.compute, self._decode_compute, ready)
        for lane, result in zip(ready, results):
            lane.computed += 1
            if lane.computed % BLOCK_TOKENS == 0:
                self._commit(lane)
            self._accept_sample(lane, result)

    def _decode_compute(self, lanes: list[LaneState]) -> list[SampleResult]:
        runtime = self.runtime
        logits = runtime.model.decode(
            [lane.tokens[lane.computed] for lane in lanes],
            [lane.computed for lane in lanes],
            [lane.block_table for lane in lanes],
            [lane.slot for lane in lanes],
            runtime.kv,
            runtime.states,
        )
        return sample(logits, [lane.request.sampling for lane in lanes], [lane.sampler for lane in lanes])

    def _grow(self, lane: LaneState, end: int) -> bool:
        """Make the block table cover positions below `end`, evicting device cache (§9.5)."""
        need = lane.pages_needed(end)
        if need == 0:
            return True
        pages = self.cache.allocate_growth_pages(lane.lane_id, need)
        if pages is None:
            return False
        lane.block_table.extend(pages)
        return True

    # -- sampling and outputs ---------------------------------------------------------------------
    def _accept_sample(self, lane: LaneState, result: SampleResult) -> None:
        request = lane.request
        params = request.sampling
        token = result.token_id
        lane.sampler.record(token)
        lane.tokens.append(token)
        if request.first_token_at is None:
            request.first_token_at = time.monotonic()
        logprobs = None
        if params.logprobs:
            logprobs = (TokenLogprob(token, result.logprob, tuple(result.top_logprobs)),)
        reason = None
        if (not params.ignore_eos and is_stop(token, params, self._eos)) or token in params.stop_token_ids:
            reason = "stop"
        elif lane.generated >= params.max_tokens or len(lane.tokens) >= self.engine.max_model_len:
            reason = "length"
        if reason is None:
            request.emit(RequestOutput(request_id=request.id, token_ids=(token,), logprobs=logprobs))
        else:
            self.finish_lane(lane, reason, (token,), logprobs)

    # -- taps and commit (§7.4, §7.6) -------------------------------------------------------------
    def _take_tap(self, lane: LaneState, frontier: int) -> None:
        slot = self._reserve_tap(lane, frontier)
        if slot is not None:
            self.runtime.states.copy_slot(lane.slot, slot)

    def _reserve_tap(self, lane: LaneState, frontier: int) -> SlotId | None:
        """A staging slot for a tap at `frontier` (the caller fills it with the state there), or None when
        the tap is skipped."""
        if frontier < BLOCK_TOKENS and lane.request.prompt.extra_key:
            lane.taps_skipped += 1  # a root-anchored snapshot cannot carry the salt (see cache/match.py)
            return None
        if frontier in lane.hedge_taps and not room_for_hedge(self.cache.index):
            lane.taps_skipped += 1  # a hedge never takes the slot the lane's tail will need
            return None
        hedge = frontier in lane.hedge_taps
        result = self.cache.take_tap(lane.lane_id, frontier, lane.boundary.get(frontier, False), hedge)
        if result.slot is None:
            lane.taps_skipped += 1
            return None
        lane.taps_taken += 1
        return result.slot

    def _commit(self, lane: LaneState) -> CommitResult:
        prompt = lane.request.prompt
        committed = lane.tokens[: lane.computed]
        extras = ConstantExtras(prompt.extra_key) if prompt.extra_key else None
        exact = lane.exact_tokens
        result = self.cache.commit_blocks(lane.lane_id, committed, prompt.block_hashes, extras, exact)
        self.counters.blocks_made_exact += result.made_exact
        published = self.cache.publish_ready_taps(lane.lane_id, committed, exact)
        self._apply_publication(published)
        return result

    def _apply_publication(self, result: PublishResult) -> None:
        for tap in result.published:
            if tap.tail_copy is not None:
                self._copy_page_prefix(tap.tail_copy)
        self._write_to_host(result.write)

    def _copy_page_prefix(self, copy: PageCopy) -> None:
        with torch.inference_mode():
            for plane in self.runtime.kv.planes():
                plane[copy.dst][: copy.tokens].copy_(plane[copy.src][: copy.tokens])

    def _write_to_host(self, plan: HostWritePlan | None) -> None:
        """Issue ``plan``'s copies on the transfer stream; the cache learns they landed when they have."""
        if plan is None:
            return
        stream = self.runtime.backend.transfer_stream
        self._enqueue_write(stream, plan)
        self._watch(stream.record_event(), lambda batch=plan.batch: self._host_write_landed(batch))

    def _host_write_landed(self, batch: int) -> None:
        """The cache learns a write landed; the slots it freed give their memory back (on a CPU, where a
        freed slot would otherwise stay resident until reused)."""
        for slot in self.cache.host_write_done(batch):
            self.runtime.states.release_pages(slot)

    def _write_now(self, plan: HostWritePlan) -> None:
        """The cache's ``host_copy``: a write-back on eviction, whose pages are reused as soon as the cache
        returns. Copies and waits here (behind earlier writes on the transfer stream), so no device work
        can touch the pages before their bytes are on the host; the cache then lands the batch itself.
        Raises DeviceError when the copy fails (the engine-wide failure path)."""
        stream = self.runtime.backend.transfer_stream
        self._enqueue_write(stream, plan)
        stream.record_event().wait_blocking()
        self.counters.written_back_blocks += len(plan.blocks)

    def _enqueue_write(self, stream, plan: HostWritePlan) -> None:
        transfers = self.runtime.transfers
        pages = [(b.page, b.slab) for b in plan.blocks] + [(t.page, t.slab) for t in plan.tails]
        transfers.write_pages(stream, pages)
        for image in plan.images:
            transfers.write_image(stream, ImageCopy(image.slot, image.slabs))
        geometry = self.runtime.geometry
        self.counters.written_bytes += (
            len(pages) * geometry.slab_bytes + len(plan.images) * geometry.image_bytes
        )

    def _watch(self, event: DeviceEvent, on_done: Callable[[], None]) -> None:
        """Await `event` off the worker; apply `on_done` on the worker once it lands."""

        async def wait() -> None:
            try:
                await event.wait()
            except DeviceError as error:
                self.post(lambda failure=error: self._device_failed(failure))
                return
            self.post(on_done)

        task = asyncio.ensure_future(wait())
        self._waits.add(task)
        task.add_done_callback(self._waits.discard)

    def _device_failed(self, error: DeviceError) -> None:
        raise error  # raised on the worker: the engine-wide failure path (§6.5 Failure)

    async def transfers_landed(self) -> None:
        """Wait for the transfers outstanding now; their completions are then in the inbox, ahead of
        anything posted after this returns."""
        await asyncio.gather(*list(self._waits), return_exceptions=True)

    async def drain_transfers(self) -> None:
        """Wait for every outstanding transfer, then apply their completions."""
        while self._waits:
            await asyncio.gather(*list(self._waits), return_exceptions=True)
        try:
            self._drain_inbox()
        except DeviceError:
            log.exception("a transfer failed while stopping")

    # -- finish, cancel, stop (§7.7) --------------------------------------------------------------
    def finish_lane(
        self,
        lane: LaneState,
        reason: str,
        last_tokens: tuple[int, ...] = (),
        logprobs: tuple[TokenLogprob, ...] | None = None,
        error: RequestError | None = None,
    ) -> None:
        request = lane.request
        if lane.restore is not None:  # released before its first pass: its slot may still be a destination
            lane.restore.done.wait_blocking()
        committed = lane.tokens[: lane.computed]
        prompt = request.prompt
        extras = ConstantExtras(prompt.extra_key) if prompt.extra_key else None
        exact = lane.exact_tokens
        keep_inexact = not self.options.cache.exact_resume  # an exact-only engine never resumes from one
        if reason == "cancelled" or error is not None:
            result: FinishResult = self.cache.cancel(lane.lane_id, committed, exact, keep_inexact)
        else:
            result = self.cache.finish(
                lane.lane_id, committed, prompt.block_hashes, extras, exact, keep_inexact
            )
        self._apply_publication(result.taps)
        self._write_to_host(result.write)
        del self.lanes[lane.lane_id]
        self.free_lanes.append(lane.lane_id)
        request.phase = Phase.DONE
        accounting = self._final_accounting(lane)
        if not request.internal:
            self.counters.finished(accounting)
        self.refills.after_finish(lane, failed=error is not None)
        if error is not None:
            request.fail(error)
            return
        request.emit(
            RequestOutput(
                request_id=request.id,
                token_ids=last_tokens,
                logprobs=logprobs,
                finished=True,
                finish_reason=reason,  # type: ignore[arg-type]
                accounting=accounting,
            )
        )

    def _final_accounting(self, lane: LaneState) -> RequestAccounting:
        start = lane.accounting
        return RequestAccounting(
            prompt_tokens=start.prompt_tokens,
            reuse_tokens=start.reuse_tokens,
            cached_prefix_tokens=start.cached_prefix_tokens,
            restored_host_bytes=start.restored_host_bytes,
            source=start.source,
            prefill_tokens=min(lane.computed, lane.prompt_len) - lane.base,
            output_tokens=lane.generated,
            taps_taken=lane.taps_taken,
            taps_skipped=lane.taps_skipped,
            inserted_prompt_tokens=lane.inserted_prompt_blocks * BLOCK_TOKENS,
        )

    def _cancel(self, request_id: str) -> None:
        for request in self.queue:
            if request.id == request_id and not request.cancelled:
                request.cancelled = True
                request.phase = Phase.DONE
                request.emit(RequestOutput(request_id=request_id, finished=True, finish_reason="cancelled"))
                return
        for lane in list(self.lanes.values()):
            if lane.request.id == request_id:
                self.finish_lane(lane, "cancelled")
                return

    def _shutdown(self) -> None:
        unavailable = RequestError("unavailable", "the server is stopping")
        while self.queue:
            request = self.queue.popleft()
            if not request.cancelled:
                request.fail(unavailable)
        for lane in list(self.lanes.values()):
            self.finish_lane(lane, "cancelled", error=unavailable)
        cache_options = self.engine.options.cache
        if cache_options.prefix_cache_file is not None or cache_options.cache_dir is not None:
            self._write_to_host(self.cache.flush_to_host())  # what persists is what the host tier holds

    def _fail_everything(self, error: RequestError) -> None:
        self.stopping = True
        while self.queue:
            self.queue.popleft().fail(error)
        for lane in list(self.lanes.values()):
            del self.lanes[lane.lane_id]
            lane.request.fail(error)
            try:
                if LaneId(lane.lane_id) in self.cache.index.lanes:
                    self.cache.release(lane.lane_id)
            except Exception:
                log.exception("could not release lane %d", lane.lane_id)
