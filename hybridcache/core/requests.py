"""Requests as the worker holds them, and the output stream a caller iterates."""

from __future__ import annotations

import asyncio
import enum
from collections.abc import Callable

from hybridcache.core.api import PreparedPrompt, RequestError, RequestOutput
from hybridcache.core.sampling_params import SamplingParams


class RequestStream:
    """The async iterator `Engine.submit` returns. Closing it before the end cancels the request.

    Outputs arrive through `push` (called on the event loop by the worker); an error ends the stream by
    raising `RequestError` from `__anext__`.
    """

    def __init__(self, request_id: str, cancel: Callable[[str], None]) -> None:
        self.request_id = request_id
        self._cancel = cancel
        self._queue: asyncio.Queue[RequestOutput | RequestError] = asyncio.Queue()
        self._done = False

    def push(self, item: RequestOutput | RequestError) -> None:
        self._queue.put_nowait(item)

    def __aiter__(self) -> RequestStream:
        return self

    async def __anext__(self) -> RequestOutput:
        if self._done:
            raise StopAsyncIteration
        try:
            item = await self._queue.get()
        except asyncio.CancelledError:
            await self.aclose()
            raise
        if isinstance(item, RequestError):
            self._done = True
            raise item
        if item.finished:
            self._done = True
        return item

    async def aclose(self) -> None:
        """Stop listening; cancels the request unless it already ended."""
        if not self._done:
            self._done = True
            self._cancel(self.request_id)

    async def __aenter__(self) -> RequestStream:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()


class Phase(enum.Enum):
    QUEUED = "queued"
    PREFILL = "prefill"
    DECODE = "decode"
    DONE = "done"


class Request:
    """One request on the worker: what was asked, and where it stands. Mutated by the worker only."""

    def __init__(
        self,
        request_id: str,
        prompt: PreparedPrompt,
        sampling: SamplingParams,
        stream: RequestStream,
        arrival: float,
    ) -> None:
        self.id = request_id
        self.prompt = prompt
        self.sampling = sampling
        self.stream = stream
        self.arrival = arrival
        self.phase = Phase.QUEUED
        self.cancelled = False
        self.first_token_at: float | None = None
        # Made by the worker itself (an endpoint refill): nobody reads its outputs, no counter counts it.
        self.internal = False

    def emit(self, output: RequestOutput) -> None:
        self.stream.push(output)

    def fail(self, error: RequestError) -> None:
        self.phase = Phase.DONE
        self.stream.push(error)
