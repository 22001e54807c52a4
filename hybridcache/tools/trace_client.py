"""Replay a `ReplayPlan` against a running server with the `openai` async client, streaming.

Conversations run concurrently (at most `concurrency` at a time when given: the next one starts when one
ends, in plan order, its clock starting then); the requests of one conversation go in order, each no
earlier than its arrival time and no earlier than the previous reply plus its think time (both times the
trace's, scaled by `time_scale`; 0 sends as fast as replies allow). Every request streams with usage, and
asks for logprobs so that the server sends a chunk for every token even while its output parser holds
text back: TTFT is the time from sending to the first chunk that carries a token. A failed request is
recorded with its error and the conversation goes on. Each record keeps the `x-hybridcache-replica`
response header (empty when the server sends none): behind a router, which replica served it. Every
request of a conversation carries its id in `x-session-id` (as agent clients such as Claude Code send
a session id), so a router with session affinity (vllm-router `--kv-aware-session-affinity-ttl-secs`,
which `hybridcache cluster` turns on) keeps a conversation on the replica that holds it.

The `openai` package is a test extra (`pip install 'hybridcache[test]'` or `pip install openai`);
`require_openai()` says so clearly when it is missing.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec

from hybridcache.tools.trace_plan import PlannedConversation, PlannedRequest, ReplayPlan

if TYPE_CHECKING:
    from openai import AsyncOpenAI

REQUEST_TIMEOUT_S = 3600.0
REPLICA_HEADER = "x-hybridcache-replica"
SESSION_HEADER = "x-session-id"
OPENAI_MISSING = ("the openai client is not installed; install it with `pip install openai` "
                  "(or `pip install 'hybridcache[test]'`)")


class RequestRecord(msgspec.Struct, frozen=True, kw_only=True):
    """One replayed request as the client saw it (seconds; `sent_s` from the start of the replay)."""

    conversation: str
    turn: int
    sent_s: float
    ttft_s: float
    total_s: float
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    error: str = ""
    replica: str = ""  # the x-hybridcache-replica header of the reply

    @property
    def ok(self) -> bool:
        return not self.error


class ServerInfo(NamedTuple):
    url: str
    model: str
    max_model_len: int


class ServerUnreachable(RuntimeError):
    """No OpenAI-compatible server answered at the URL (the message says what happened)."""


class OpenAIMissing(RuntimeError):
    """The `openai` package is not installed (the message says how to install it)."""


def require_openai() -> None:
    """Raises OpenAIMissing when `openai` cannot be imported."""
    try:
        import openai  # noqa: F401
    except ImportError:
        raise OpenAIMissing(OPENAI_MISSING) from None


def probe_server(url: str, timeout_s: float = 10.0) -> ServerInfo:
    """The served model from GET /v1/models. Blocking; raises ServerUnreachable when nothing answers or
    the answer is not a model list."""
    address = url.rstrip("/") + "/v1/models"
    try:
        with urllib.request.urlopen(address, timeout=timeout_s) as response:
            cards = json.load(response)["data"]
        card = cards[0]
        return ServerInfo(url.rstrip("/"), str(card["id"]), int(card.get("max_model_len") or 0))
    except urllib.error.HTTPError as error:
        raise ServerUnreachable(f"{address} answered HTTP {error.code}") from None
    except (urllib.error.URLError, OSError) as error:
        reason = getattr(error, "reason", error)
        raise ServerUnreachable(f"cannot reach {url}: {reason}") from None
    except (ValueError, KeyError, IndexError, TypeError):
        raise ServerUnreachable(f"{address} did not answer with an OpenAI model list") from None


def make_client(server: ServerInfo, api_key: str = "none") -> AsyncOpenAI:
    """An AsyncOpenAI client for `server` (no retries: a failure is a result). Raises OpenAIMissing."""
    require_openai()
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=server.url + "/v1", api_key=api_key, max_retries=0, timeout=REQUEST_TIMEOUT_S)


async def replay(client: AsyncOpenAI, model: str, plan: ReplayPlan, time_scale: float,
                 progress: Callable[[RequestRecord], None] | None = None,
                 concurrency: int | None = None) -> list[RequestRecord]:
    """Send every planned request (see the module docstring). Returns the records in completion order;
    calls `progress` after each. Raises nothing for a failed request (it is recorded)."""
    records: list[RequestRecord] = []
    started = time.perf_counter()
    lanes = asyncio.Semaphore(concurrency or max(1, len(plan.conversations)))

    async def conversation(planned: PlannedConversation) -> None:
        async with lanes:
            await _send_in_order(planned)

    async def _send_in_order(planned: PlannedConversation) -> None:
        lane_start = replied = time.perf_counter()  # a conversation that waited for a lane starts late
        for request in planned.requests:
            send_at = max(lane_start + request.arrival_s * time_scale, replied + request.think_s * time_scale)
            await asyncio.sleep(max(0.0, send_at - time.perf_counter()))
            record = await send_request(client, model, request, started, session=planned.id)
            replied = time.perf_counter()
            records.append(record)
            if progress is not None:
                progress(record)

    await asyncio.gather(*(conversation(planned) for planned in plan.conversations))
    return records


async def send_request(client: AsyncOpenAI, model: str, request: PlannedRequest,
                       epoch: float, session: str | None = None) -> RequestRecord:
    """One streamed request, timed (`session`: its `x-session-id`). Returns its record (with `error` set
    when it failed)."""
    import openai

    sent = time.perf_counter()
    first_token: float | None = None
    usage: Any = None
    identity: dict[str, Any] = {"conversation": request.conversation, "turn": request.turn,
                                "sent_s": sent - epoch}
    try:
        raw = await _open_stream(client, model, request, session)
        identity["replica"] = raw.headers.get(REPLICA_HEADER, "")
        async for chunk in raw.parse():  # a legacy raw response: parse() is not a coroutine
            usage = chunk.usage or usage
            if first_token is None and any(_carries_token(choice) for choice in chunk.choices):
                first_token = time.perf_counter()
    except openai.APIError as error:  # connection failures and error frames included
        elapsed = time.perf_counter() - sent
        return RequestRecord(**identity, ttft_s=elapsed, total_s=elapsed, prompt_tokens=0, cached_tokens=0,
                             completion_tokens=0, error=_describe(error))
    finished = time.perf_counter()
    details = getattr(usage, "prompt_tokens_details", None)
    return RequestRecord(
        **identity,
        ttft_s=(first_token or finished) - sent,
        total_s=finished - sent,
        prompt_tokens=int(getattr(usage, "prompt_tokens", 0) or 0),
        cached_tokens=int(getattr(details, "cached_tokens", 0) or 0),
        completion_tokens=int(getattr(usage, "completion_tokens", 0) or 0),
        error="" if usage is not None else "the stream ended without usage",
    )


async def _open_stream(client: AsyncOpenAI, model: str, request: PlannedRequest, session: str | None) -> Any:
    """The raw response (its headers, then `parse()` for the stream of chunks)."""
    common: dict[str, Any] = {
        "model": model,
        "max_tokens": request.max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        "extra_body": {"ignore_eos": True},  # the same output length on every server
    }
    if session is not None:
        common["extra_headers"] = {SESSION_HEADER: session}
    if request.messages is not None:
        extra = {"tools": list(request.tools)} if request.tools else {}
        return await client.chat.completions.with_raw_response.create(
            messages=list(request.messages), logprobs=True, **extra, **common)
    assert request.prompt_token_ids is not None
    return await client.completions.with_raw_response.create(prompt=list(request.prompt_token_ids),
                                                             logprobs=0, **common)


def _carries_token(choice: Any) -> bool:
    """A chunk choice that carries a generated token (chat: logprobs or text; legacy: tokens or text)."""
    logprobs = getattr(choice, "logprobs", None)
    if logprobs is not None and (getattr(logprobs, "content", None) or getattr(logprobs, "tokens", None)):
        return True
    delta = getattr(choice, "delta", None)
    text = getattr(delta, "content", None) if delta is not None else getattr(choice, "text", None)
    return bool(text)


def _describe(error: Exception) -> str:
    status = getattr(error, "status_code", None)
    message = getattr(error, "message", None) or str(error)
    return f"HTTP {status}: {message}" if status else message
