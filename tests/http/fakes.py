"""Test doubles for the HTTP layer: a scripted engine and a frontend that records what it was asked.

`FakeEngine` implements `EngineProtocol` without a model: it answers each prompt with a scripted reply
(text encoded by the real tokenizer, then an end-of-turn token), reports admission accounting from a
toy prefix cache keyed by the prompt's block hashes (so salts and a second turn behave as with the real
cache), honours `cancel`, and can be told to fail with a `RequestError` at admission or mid-stream.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from hybridcache.cache.ids import BLOCK_TOKENS
from hybridcache.core.api import (
    PreparedPrompt,
    RequestAccounting,
    RequestError,
    RequestOutput,
    TokenLogprob,
)
from hybridcache.core.frontend import Frontend
from hybridcache.core.sampling_params import SamplingParams
from hybridcache.core.tokenizer import Tokenizer

DEFAULT_ANSWER = "Hello from the fake engine."
DEFAULT_REASONING = "The user greets me."


def default_reply(prompt_text: str) -> str:
    """A reply shaped like Qwen3.5's: reasoning closed by </think> when the prompt opened it, then text."""
    if prompt_text.rstrip().endswith("<think>"):
        return f"{DEFAULT_REASONING}\n</think>\n\n{DEFAULT_ANSWER}"
    return DEFAULT_ANSWER


@dataclass
class Submission:
    """One call of `submit`, as the engine saw it."""

    request_id: str
    prompt: PreparedPrompt
    sampling: SamplingParams
    outputs: int = 0


@dataclass
class PlannedFailure:
    """Raise `RequestError(kind, message)` after `after_tokens` tokens (0: at admission)."""

    kind: str
    message: str
    after_tokens: int = 0


@dataclass
class FakeEngine:
    tokenizer: Tokenizer
    model_name: str = "fake-model"
    max_model_len: int = 2048
    reply: Callable[[str], str] = default_reply
    token_delay_s: float = 0.0
    admission_delay_s: float = 0.0
    reuse_override: int | None = None
    failure: PlannedFailure | None = None
    extra_stats: dict[str, object] = field(default_factory=dict)
    integrity_problem: str | None = None
    submissions: list[Submission] = field(default_factory=list)
    cancelled: list[str] = field(default_factory=list)
    running: int = 0
    max_running_seen: int = 0
    _known_blocks: set[int] = field(default_factory=set)
    _counter: int = 0

    def submit(self, prompt: PreparedPrompt, sampling: SamplingParams,
               request_id: str | None = None) -> AsyncIterator[RequestOutput]:
        self._counter += 1
        submission = Submission(request_id or f"fake-{self._counter}", prompt, sampling)
        self.submissions.append(submission)
        return self._generate(submission)

    def cancel(self, request_id: str) -> None:
        self.cancelled.append(request_id)

    def stats(self) -> dict[str, object]:
        return {"requests_running": self.running, "requests_waiting": 0, **self.extra_stats}

    def check_integrity(self) -> None:
        if self.integrity_problem is not None:
            raise AssertionError(self.integrity_problem)

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        return None

    @property
    def last(self) -> Submission:
        return self.submissions[-1]

    def reply_ids(self, prompt: PreparedPrompt) -> list[int]:
        text = self.reply(self.tokenizer.decode(prompt.token_ids))
        return [*self.tokenizer.encode(text), self.tokenizer.eos_token_ids[0]]

    async def _generate(self, submission: Submission) -> AsyncIterator[RequestOutput]:
        self.running += 1
        self.max_running_seen = max(self.max_running_seen, self.running)
        try:
            async for output in self._outputs(submission):
                submission.outputs += 1
                yield output
        finally:
            self.running -= 1

    async def _outputs(self, submission: Submission) -> AsyncIterator[RequestOutput]:
        prompt, sampling, request_id = submission.prompt, submission.sampling, submission.request_id
        await asyncio.sleep(self.admission_delay_s)
        self._check_failure(0)
        accounting = self._admit(prompt)
        yield RequestOutput(request_id=request_id, accounting=accounting)
        produced: list[int] = []
        for token in self.reply_ids(prompt)[: sampling.max_tokens]:
            await asyncio.sleep(self.token_delay_s)
            if request_id in self.cancelled:
                yield self._final(request_id, accounting, produced, "cancelled")
                return
            self._check_failure(len(produced) + 1)
            produced.append(token)
            yield RequestOutput(request_id=request_id, token_ids=(token,),
                                logprobs=_logprobs(token, sampling))
            if token in sampling.stop_token_ids or (
                    not sampling.ignore_eos and token in self.tokenizer.eos_token_ids):
                yield self._final(request_id, accounting, produced, "stop")
                return
        yield self._final(request_id, accounting, produced, "length")

    def _check_failure(self, tokens_so_far: int) -> None:
        if self.failure is not None and self.failure.after_tokens == tokens_so_far:
            raise RequestError(self.failure.kind, self.failure.message)  # type: ignore[arg-type]

    def _admit(self, prompt: PreparedPrompt) -> RequestAccounting:
        """A toy prefix cache: reuse the leading blocks an earlier prompt already had (same hashes)."""
        hits = 0
        if prompt.prefix_reuse:
            for block_hash in prompt.block_hashes:
                if block_hash not in self._known_blocks:
                    break
                hits += 1
            self._known_blocks.update(prompt.block_hashes)
        reuse = min(hits * BLOCK_TOKENS, prompt.num_tokens - 1)
        if self.reuse_override is not None:
            reuse = self.reuse_override
        return RequestAccounting(prompt_tokens=prompt.num_tokens, reuse_tokens=reuse,
                                 cached_prefix_tokens=reuse, restored_host_bytes=0,
                                 source="device" if reuse else "root",
                                 prefill_tokens=prompt.num_tokens - reuse)

    @staticmethod
    def _final(request_id: str, accounting: RequestAccounting, produced: list[int],
               reason: Any) -> RequestOutput:
        final = RequestAccounting(**{**_fields(accounting), "output_tokens": len(produced)})
        return RequestOutput(request_id=request_id, finished=True, finish_reason=reason, accounting=final)


def _fields(accounting: RequestAccounting) -> dict[str, Any]:
    return {name: getattr(accounting, name) for name in accounting.__struct_fields__}


def _logprobs(token: int, sampling: SamplingParams) -> tuple[TokenLogprob, ...] | None:
    if not sampling.logprobs:
        return None
    top = tuple((abs(token - offset), -0.5 * offset) for offset in range(sampling.top_logprobs))
    return (TokenLogprob(token_id=token, logprob=-0.25, top=top),)


class RecordingFrontend(Frontend):
    """The real frontend, recording the keyword arguments of every prepare call."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[str, dict[str, Any]]] = []

    def prepare_chat(self, messages, tools=None, **kwargs):  # type: ignore[no-untyped-def]
        self.calls.append(("chat", {"messages": messages, "tools": tools, **kwargs}))
        return super().prepare_chat(messages, tools, **kwargs)

    def prepare_tokens(self, token_ids, cache_salt=None, prefix_reuse=True):  # type: ignore[no-untyped-def]
        self.calls.append(("tokens", {"token_ids": token_ids, "cache_salt": cache_salt}))
        return super().prepare_tokens(token_ids, cache_salt, prefix_reuse)

    def prepare_text(self, text, cache_salt=None, prefix_reuse=True):  # type: ignore[no-untyped-def]
        self.calls.append(("text", {"text": text, "cache_salt": cache_salt}))
        return super().prepare_text(text, cache_salt, prefix_reuse)

    @property
    def last_call(self) -> dict[str, Any]:
        return self.calls[-1][1]
