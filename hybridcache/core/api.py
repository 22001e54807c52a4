"""The engine's public surface: what callers (HTTP, benchmarks, tools) submit and what they get back.

Callers never touch engine state. They build a `PreparedPrompt` (through `core.frontend`) and a
`SamplingParams`, call `Engine.submit()`, and iterate the `RequestOutput`s it yields:

1. the first output is the *admission notice*: no tokens, `accounting` set (reuse is fixed at admission,
   so a streaming client can report cached tokens before the first token);
2. then one output per decode step with the new token ids (and logprobs when asked);
3. the last output has `finished=True`, a `finish_reason`, and the final `accounting`.

A request that cannot be served raises `RequestError` from the iterator (`kind` says why: the engine is
stopping, the request waited too long, it can never fit, or the engine failed). Breaking out of the
iteration, or `Engine.cancel(request_id)`, cancels the request; its committed blocks and taps stay
published.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Literal, Protocol

import msgspec

from hybridcache.core.sampling_params import SamplingParams

FinishReason = Literal["stop", "length", "cancelled"]
SourceKind = Literal["root", "device", "host"]
ErrorKind = Literal["unavailable", "timeout", "too_long", "internal"]


class PreparedPrompt(msgspec.Struct, frozen=True, kw_only=True):
    """A tokenized prompt with everything the cache needs, computed off the worker.

    `block_hashes[b]` is the chained lookup hash of full block b (spec §5.1) under `extra_key` (0, or a
    digest of the request's cache salt: different salts never share blocks). `tap_hints` are
    `(position, kind)` pairs for the tap planner (kind: a `cache.tap_planner.HintKind` value): explicit
    breakpoints, generation opener, structural boundaries, message boundaries. `prefix_reuse=False`
    makes a disabled request (no reuse, leaves no cache entries behind).
    """

    token_ids: tuple[int, ...]
    block_hashes: tuple[int, ...]
    extra_key: int = 0
    token_bytes: bytes | None = None  # token_ids packed as uint32 LE (fast exact compares in the index)
    tap_hints: tuple[tuple[int, int], ...] = ()
    prefix_reuse: bool = True

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)


class TokenLogprob(msgspec.Struct, frozen=True):
    """The chosen token's log-probability and the top alternatives (token id, logprob), best first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


class RequestAccounting(msgspec.Struct, frozen=True, kw_only=True):
    """What the cache did for one request (reported as usage and in logs)."""

    prompt_tokens: int
    reuse_tokens: int  # prompt tokens not recomputed (OpenAI cached_tokens, Anthropic cache_read)
    cached_prefix_tokens: int  # longest cached block prefix, reusable or not (reuse-loss attribution)
    restored_host_bytes: int
    source: SourceKind
    prefill_tokens: int  # prompt tokens computed so far
    output_tokens: int = 0
    taps_taken: int = 0
    taps_skipped: int = 0
    # prompt tokens in whole blocks this request inserted into the block tree (Anthropic cache_creation)
    inserted_prompt_tokens: int = 0


class RequestOutput(msgspec.Struct, frozen=True, kw_only=True):
    request_id: str
    token_ids: tuple[int, ...] = ()
    logprobs: tuple[TokenLogprob, ...] | None = None
    finished: bool = False
    finish_reason: FinishReason | None = None
    accounting: RequestAccounting | None = None


class RequestError(Exception):
    """A request the engine could not serve; `kind` maps to a protocol status (503, 408, 400, 500)."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


class EngineProtocol(Protocol):
    """What `http/` and `tools/` may call. The worker owns everything else."""

    model_name: str
    max_model_len: int

    def submit(
        self, prompt: PreparedPrompt, sampling: SamplingParams, request_id: str | None = None
    ) -> AsyncIterator[RequestOutput]: ...

    def cancel(self, request_id: str) -> None: ...

    def stats(self) -> dict[str, object]: ...

    def check_integrity(self) -> None:
        """Rebuild the cache's derived state and compare; raises IntegrityError (an AssertionError)."""

    async def start(self) -> None: ...

    async def stop(self) -> None: ...
