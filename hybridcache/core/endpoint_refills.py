"""Idle-time re-prefill of finished requests' generated tokens (endpoint refills).

A finished request leaves blocks and an endpoint snapshot that decode steps produced: one-row products
and the recurrent rule, whose last bits no cold prefill reproduces, so they are marked inexact and an exact
resume stops before them. When the worker has nothing else to do it replays such a request's committed
tokens and its last sampled token as an internal prompt: admitted like any request, resumed from its last
exact snapshot, prefilled in small chunks through the normal (row-tiled, exact) path. Its commits replace
the inexact blocks' copies (``BlockMadeExact``) and its prompt-tail tap, captured inside the last pass at
n - 1, publishes an exact snapshot where the request's decode ended: where a next turn that holds the whole
answer resumes. The worker (``core/refill_scheduler.py``) cancels it as soon as a request arrives; the
cancel publishes the state it reached at its last chunk boundary (exact, block-aligned), so the next idle
moment continues from there.
"""

from __future__ import annotations

import itertools
from collections import deque

import msgspec

from hybridcache.cache.hashing import block_hashes
from hybridcache.cache.ids import BLOCK_TOKENS
from hybridcache.cache.records import pack_tokens
from hybridcache.cache.tap_planner import PlannedTap, TapSource
from hybridcache.core.api import PreparedPrompt
from hybridcache.core.requests import Request, RequestStream
from hybridcache.core.sampling_params import SamplingParams

REFILL_CHUNK_TOKENS = 128
"""Tokens per refill pass: one row tile of the prefill products, so a request that arrives meanwhile
waits for at most one such pass."""

MAX_PENDING_REFILLS = 16
"""Jobs kept waiting for idle time; the oldest is dropped beyond (a busy server has no idle time)."""

_SAMPLING = SamplingParams(max_tokens=1, temperature=0.0)


def refill_taps(planned: list[PlannedTap]) -> list[PlannedTap]:
    """A refill keeps only its prompt-tail tap (the state at the answer's end); no hedges or ladder: the
    request it replays took those. Pure."""
    return [tap for tap in planned if tap.source == TapSource.PROMPT_TAIL]


class RefillJob(msgspec.Struct, frozen=True):
    """Tokens of a finished request (committed ones and its last sampled one) whose first `exact_tokens`
    were computed exactly (its prefill) and the rest by decode steps, under its cache salt key."""

    token_ids: tuple[int, ...]
    exact_tokens: int
    extra_key: int = 0

    def worth_running(self, resume_at: int) -> bool:
        """Whether a refill that resumes at `resume_at` computes about what the request's decode did: from
        its prompt's tail (n - 1) or the block boundary below it, plus a chunk. Earlier (the request's
        exact snapshots were evicted), the idle work would recompute a whole prompt to fix an answer: not
        worth it. Pure."""
        start = max(0, self.exact_tokens - 1) // BLOCK_TOKENS * BLOCK_TOKENS
        return resume_at >= start - REFILL_CHUNK_TOKENS


class EndpointRefills:
    """The jobs waiting for idle time, oldest first. Mutated by the worker only."""

    def __init__(self) -> None:
        self.pending: deque[RefillJob] = deque()
        self._ids = itertools.count()

    def add(self, job: RefillJob) -> None:
        """Queue ``job``; a waiting job whose tokens it extends is dropped (the new one covers it)."""
        if len(job.token_ids) < BLOCK_TOKENS:
            return  # too short to be worth a lane
        tokens = job.token_ids
        self.pending = deque(
            old
            for old in self.pending
            if not (old.extra_key == job.extra_key and tokens[: len(old.token_ids)] == old.token_ids)
        )
        self.pending.append(job)
        while len(self.pending) > MAX_PENDING_REFILLS:
            self.pending.popleft()

    def put_back(self, job: RefillJob) -> None:
        """Return a preempted job to the front: it continues at the next idle moment."""
        self.pending.appendleft(job)

    def take(self) -> RefillJob | None:
        return self.pending.popleft() if self.pending else None

    def request_for(self, job: RefillJob, now: float) -> Request:
        """An internal request that prefills ``job``'s tokens and samples nothing."""
        tokens = job.token_ids
        extra = job.extra_key
        full_blocks = len(tokens) // BLOCK_TOKENS
        prompt = PreparedPrompt(
            token_ids=tokens,
            block_hashes=tuple(block_hashes(tokens, [extra] * full_blocks if extra else None)),
            extra_key=extra,
            token_bytes=pack_tokens(tokens),
        )
        request_id = f"refill-{next(self._ids)}"
        request = Request(request_id, prompt, _SAMPLING, RequestStream(request_id, _ignore_cancel), now)
        request.internal = True
        return request


def _ignore_cancel(request_id: str) -> None:
    """Nobody listens to a refill's stream, so nobody closes it."""
