"""One engine request as a handler sees it: submit, wait for admission, stream text, cancel on exit.

`Generation` wraps `EngineProtocol.submit()`: `admit()` waits for the admission notice (so a refusal
still gets a proper HTTP status, and a stream can report cached tokens first), `steps()` yields the new
text of each engine output after incremental detokenization and stop strings, and leaving the `async
with` block cancels the engine request if it has not finished (a stop string, a client gone, an error).
A watcher cancels the request as soon as the client's connection closes, even while it waits in queue.
Handlers only submit and await: nothing here touches engine state beyond `submit` and `cancel`.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import NamedTuple

from hybridcache.core.api import (
    EngineProtocol,
    FinishReason,
    PreparedPrompt,
    RequestAccounting,
    RequestError,
    RequestOutput,
    TokenLogprob,
)
from hybridcache.core.sampling_params import SamplingParams
from hybridcache.core.tokenizer import Tokenizer
from hybridcache.http.metrics import ServerMetrics
from hybridcache.http.stop_strings import StopStringMatcher

DISCONNECT_POLL_S = 0.1


class TextStep(NamedTuple):
    """New output of one engine step: released `text`, the step's token ids and their logprobs."""

    text: str
    token_ids: tuple[int, ...]
    logprobs: tuple[TokenLogprob, ...] | None


class Generation:
    """A submitted request. Use as ``async with Generation(...) as run: await run.admit(); async for ...``.

    Mutates only itself; `admit()` and `steps()` raise `RequestError` from the engine.
    """

    def __init__(self, engine: EngineProtocol, tokenizer: Tokenizer, prompt: PreparedPrompt,
                 sampling: SamplingParams, *, request_id: str, stops: Sequence[str] = (),
                 metrics: ServerMetrics, started_at: float,
                 is_connected: Callable[[], bool] = lambda: True) -> None:
        self._engine = engine
        self._prompt = prompt
        self._sampling = sampling
        self._metrics = metrics
        self._started_at = started_at
        self._is_connected = is_connected
        self._detokenizer = tokenizer.detokenizer(skip_special_tokens=True)
        self._stops = StopStringMatcher(stops)
        self._outputs: AsyncIterator[RequestOutput] | None = None
        self._pending: RequestOutput | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._last_token_at: float | None = None
        self.request_id = request_id
        self.accounting: RequestAccounting | None = None
        self.finish_reason: FinishReason | None = None
        self.stop_string: str | None = None
        self.output_tokens = 0
        self.client_gone = False
        self.engine_failed = False

    async def __aenter__(self) -> Generation:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def prompt_tokens(self) -> int:
        return self._prompt.num_tokens

    @property
    def reuse_tokens(self) -> int:
        return self.accounting.reuse_tokens if self.accounting is not None else 0

    @property
    def inserted_prompt_tokens(self) -> int:
        """Prompt tokens this request added to the cache; known once it finishes (0 before)."""
        return self.accounting.inserted_prompt_tokens if self.accounting is not None else 0

    async def admit(self) -> RequestAccounting | None:
        """Submit and wait for the admission notice; returns its accounting. Raises RequestError."""
        try:
            self._outputs = aiter(self._engine.submit(self._prompt, self._sampling, self.request_id))
        except RequestError:
            self.engine_failed = True
            raise
        self._watcher = asyncio.create_task(self._watch_connection())
        first = await self._next_output()
        if first is None:
            self.engine_failed = True
            raise RequestError("internal", "the engine ended the request before admitting it")
        if first.accounting is not None:
            self.accounting = first.accounting
        if first.token_ids or first.finished:
            self._pending = first
        return self.accounting

    async def steps(self) -> AsyncIterator[TextStep]:
        """The text of each engine output until the request finishes. Raises RequestError. Mutates."""
        assert self._outputs is not None, "admit() first"
        while not self.finished:
            output = self._pending or await self._next_output()
            self._pending = None
            if output is None:  # the stream ended without a final output: treat as cancelled
                self.finish_reason = "cancelled"
                self._metrics.record_finish("cancelled")
                break
            step = self._absorb(output)
            if step is not None:
                yield step
        if self.stop_string is None:
            check = self._stops.push(self._detokenizer.finish())
            if check.stop is not None:
                self.stop_string, self.finish_reason = check.stop, "stop"
            rest = check.text + self._stops.flush()
            if rest:
                yield TextStep(rest, (), None)

    async def _next_output(self) -> RequestOutput | None:
        """The engine's next output (None when its stream ended). Raises RequestError, noting it."""
        assert self._outputs is not None
        try:
            return await anext(self._outputs, None)
        except RequestError:
            self.engine_failed = True
            raise

    def _absorb(self, output: RequestOutput) -> TextStep | None:
        if output.accounting is not None:
            self.accounting = output.accounting
        text = ""
        if output.token_ids:
            self._record_latency()
            self.output_tokens += len(output.token_ids)
            check = self._stops.push(self._detokenizer.push_many(output.token_ids))
            text = check.text
            if check.stop is not None:
                self.stop_string = check.stop
                self.finish_reason = "stop"
                self._engine.cancel(self.request_id)
        if output.finished and not self.finished:
            self.finish_reason = output.finish_reason or "stop"
        if self.finished:
            self._metrics.record_finish(self.finish_reason or "stop")
        if not text and not output.token_ids:
            return None
        return TextStep(text, output.token_ids, output.logprobs)

    def _record_latency(self) -> None:
        now = time.monotonic()
        if self._last_token_at is None:
            self._metrics.observe_ttft(now - self._started_at)
        else:
            self._metrics.observe_itl(now - self._last_token_at)
        self._last_token_at = now

    async def _watch_connection(self) -> None:
        while not self.finished:
            await asyncio.sleep(DISCONNECT_POLL_S)
            if not self._is_connected():
                self.client_gone = True
                self._engine.cancel(self.request_id)
                return

    async def close(self) -> None:
        """Cancel the engine request if it has not finished (unless the engine failed it), stop watching
        the connection, close the output stream. Mutates; idempotent. Cancels first, synchronously, so a
        handler task that is itself being cancelled still releases the request."""
        if self._outputs is not None and not self.finished:
            if self.engine_failed:
                self._metrics.record_finish("error")
            else:
                self._engine.cancel(self.request_id)
                self._metrics.record_finish("cancelled")
            self.finish_reason = "cancelled"
        if self._watcher is not None:
            self._watcher.cancel()
        closer = getattr(self._outputs, "aclose", None)
        if closer is not None:
            with contextlib.suppress(Exception):
                await closer()
