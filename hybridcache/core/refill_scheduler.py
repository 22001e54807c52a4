"""When the worker runs endpoint refills (``core/endpoint_refills.py``): a finished request queues the
re-prefill of what its decode computed; an idle worker admits the oldest job as an internal request and
runs its passes; a request that arrives meanwhile cancels it at the next unit boundary.

The scheduler owns the job queue and the running refill's lane; admission, passes and finish stay the
worker's own (a refill is an ordinary lane that samples nothing), so it calls back into them.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Awaitable
from typing import TYPE_CHECKING

from hybridcache.core.endpoint_refills import REFILL_CHUNK_TOKENS, EndpointRefills, RefillJob
from hybridcache.core.lanes import LaneState

if TYPE_CHECKING:
    from hybridcache.core.worker import Worker


class RefillScheduler:
    """The worker's endpoint refills. Mutated on the worker task only."""

    def __init__(self, worker: Worker) -> None:
        self.worker = worker
        self.jobs = EndpointRefills()
        self.lane: LaneState | None = None  # the running refill's lane

    @property
    def pending(self) -> deque[RefillJob]:
        return self.jobs.pending

    def chunk_tokens(self, lane: LaneState, prefill_chunk: int) -> int:
        """Tokens of ``lane``'s next pass: a refill's are short, so a request waits for one at most."""
        return REFILL_CHUNK_TOKENS if lane.request.internal else prefill_chunk

    def start_if_idle(self) -> Awaitable[None] | None:
        """With no lane and no waiting request: admit the oldest worthwhile job, return its first pass."""
        worker = self.worker
        if worker.queue or worker.lanes:
            return None
        if worker.cache.index.host_writes:
            # A block being copied to the host is pinned, and a refill that commits it then only
            # duplicates it: it stays inexact (with a cache directory, the finished request's whole path
            # is in flight here). The landing wakes the worker, which tries again.
            return None
        while (job := self.jobs.take()) is not None:
            request = self.jobs.request_for(job, time.monotonic())
            if not job.worth_running(worker.cache.quote(worker.prompt_input(request)).reuse_tokens):
                continue  # its exact start was evicted: dropped
            if not worker.try_admit(request) or not worker.lanes:
                continue  # no room now, or never: dropped (the cache keeps its inexact entries)
            lane = next(iter(worker.lanes.values()))  # admitted into an empty worker: the only lane
            lane.refill_job = job
            self.lane = lane
            return worker.prefill_pass(lane)
        return None

    def preempt_if_busy(self) -> None:
        """A request is waiting or running beside the refill: cancel the refill. Its cancel publishes the
        block-aligned state it reached, so the job, put back first in line, continues from there at the
        next idle moment."""
        worker = self.worker
        lane = self.lane
        if lane is None or not (worker.queue or len(worker.lanes) > 1):
            return
        assert lane.refill_job is not None
        worker.counters.refills_preempted += 1
        self.jobs.put_back(lane.refill_job)
        worker.finish_lane(lane, "cancelled")

    def drop_all(self) -> None:
        """Forget every waiting job and cancel the running refill: the cache is being flushed, and what they
        would make exact goes with it."""
        self.jobs.pending.clear()
        if self.lane is not None:
            self.worker.finish_lane(self.lane, "cancelled")

    def after_pass(self, lane: LaneState, tokens: int, final: bool) -> bool:
        """Count a refill pass of ``tokens``; True when it was a refill's (the worker then neither counts
        it as prefill nor samples), finished here after its last pass."""
        if not lane.request.internal:
            return False
        worker = self.worker
        worker.counters.refill_tokens += tokens
        if final:
            worker.counters.refills_finished += 1
            worker.finish_lane(lane, "stop")
        return True

    def after_finish(self, lane: LaneState, failed: bool) -> None:
        """A lane ended: a refill's frees its place; a request's queues the re-prefill of what it computed
        past its exact positions, with its last sampled token, so that the refill's prompt-tail tap (n - 1)
        lands where the next turn, which holds the whole answer, resumes."""
        request = lane.request
        if request.internal:
            self.lane = None
            return
        options = self.worker.options
        if failed or not options.cache.endpoint_refill:
            return
        if not (request.prompt.prefix_reuse and options.cache.prefix_reuse):
            return
        if lane.computed <= lane.exact_tokens:
            return
        tokens = tuple(lane.tokens[: lane.computed + 1])
        self.jobs.add(RefillJob(tokens, lane.exact_tokens, request.prompt.extra_key))
