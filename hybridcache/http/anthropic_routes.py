"""POST /v1/messages (Anthropic): template, submit, answer as one message or as the SSE event sequence.

Streams send message_start (with cache_read_input_tokens, fixed at admission), then content_block_start /
content_block_delta / content_block_stop per thinking, text or tool_use block, then message_delta (stop
reason, the final usage) and message_stop. ``input_tokens`` counts the prompt tokens neither read from nor
added to the cache (Anthropic's split: read + creation + input = the prompt).
The handler only submits and awaits; a client that goes away cancels its request.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from aiohttp import web

from hybridcache.core.api import RequestError
from hybridcache.http import sse
from hybridcache.http.anthropic_messages import template_input
from hybridcache.http.anthropic_schemas import MessagesRequest
from hybridcache.http.auth import request_cache_salt
from hybridcache.http.chat_output import collect_chat, finish_kind, new_tool_call_id
from hybridcache.http.errors import bad_request, error_body, from_engine_error
from hybridcache.http.generation import Generation
from hybridcache.http.output_parser import OutputParser, ParsedToolCall, Segment
from hybridcache.http.request_limits import check_conversation_size
from hybridcache.http.request_prep import (
    build_sampling,
    connection_probe,
    decode_body,
    prepare,
    prompt_opens_reasoning,
    resolve_max_tokens,
    stop_strings,
)
from hybridcache.http.state import server_state

_STOP_REASONS = {"stop": "end_turn", "stop_string": "stop_sequence", "length": "max_tokens",
                 "tool_calls": "tool_use"}


async def messages(request: web.Request) -> web.StreamResponse:
    """Handle one Messages request. Raises ApiError for a refused request (rendered by the middleware)."""
    started_at = time.monotonic()
    state = server_state(request)
    body = await decode_body(request, MessagesRequest)
    state.check_model(body.model)
    check_conversation_size(body.messages, body.tools)
    stops = stop_strings(body.stop_sequences, "stop_sequences")
    chat = template_input(body)
    prompt = await prepare(
        state.frontend.prepare_chat, chat.messages, chat.tools, template_kwargs=chat.template_kwargs,
        cache_salt=request_cache_salt(request, body.cache_salt), breakpoints=chat.breakpoints)
    max_tokens = resolve_max_tokens(body.max_tokens, prompt.num_tokens, state.max_model_len)
    if body.temperature is not None and not 0.0 <= body.temperature <= 1.0:
        raise bad_request(f"temperature: range: 0 <= temperature <= 1, got {body.temperature}", "temperature")
    sampling = build_sampling(max_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p,
                              top_k=body.top_k)
    parser = OutputParser(starts_in_reasoning=prompt_opens_reasoning(state.frontend.tokenizer, prompt),
                          parse_tools=chat.parse_tools)
    run = Generation(state.engine, state.frontend.tokenizer, prompt, sampling,
                     request_id=f"msg_{uuid.uuid4().hex[:24]}", stops=stops,
                     metrics=state.metrics, started_at=started_at, is_connected=connection_probe(request))
    async with run:
        try:
            await run.admit()
        except RequestError as error:
            raise from_engine_error(error) from error
        if body.stream:
            return await _stream(request, body, run, parser)
        return await _respond(body, run, parser)


def _usage(run: Generation) -> dict[str, int]:
    """Anthropic's split of the prompt: read from the cache, added to it (whole 64-token blocks this
    request inserted; known when it finishes, so 0 in message_start), and the rest."""
    created = run.inserted_prompt_tokens
    return {"input_tokens": run.prompt_tokens - run.reuse_tokens - created,
            "output_tokens": run.output_tokens, "cache_read_input_tokens": run.reuse_tokens,
            "cache_creation_input_tokens": created}


def _message(body: MessagesRequest, run: Generation, content: list[dict[str, Any]]) -> dict[str, Any]:
    return {"id": run.request_id, "type": "message", "role": "assistant", "model": body.model,
            "content": content, "stop_reason": None, "stop_sequence": None, "usage": _usage(run)}


def _tool_input(call: ParsedToolCall) -> dict[str, Any]:
    try:
        arguments = json.loads(call.arguments)
    except ValueError:
        return {"arguments": call.arguments}
    return arguments if isinstance(arguments, dict) else {"arguments": arguments}


def _tool_use_block(call: ParsedToolCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": new_tool_call_id("toolu_"), "name": call.name,
            "input": _tool_input(call)}


async def _respond(body: MessagesRequest, run: Generation, parser: OutputParser) -> web.Response:
    try:
        collected = await collect_chat(run, parser)
    except RequestError as error:
        raise from_engine_error(error) from error
    content: list[dict[str, Any]] = []
    if collected.reasoning:
        content.append({"type": "thinking", "thinking": collected.reasoning, "signature": ""})
    if collected.content:
        content.append({"type": "text", "text": collected.content})
    content.extend(_tool_use_block(call) for call in collected.tool_calls)
    message = _message(body, run, content)
    message["stop_reason"] = _STOP_REASONS[finish_kind(run, bool(collected.tool_calls))]
    message["stop_sequence"] = run.stop_string
    return web.json_response(message)


async def _stream(request: web.Request, body: MessagesRequest, run: Generation,
                  parser: OutputParser) -> web.StreamResponse:
    try:
        response = await sse.open_event_stream(request)
    except ConnectionResetError:
        return sse.client_gone()
    try:
        start = _message(body, run, [])
        await sse.send_event(response, "message_start", {"type": "message_start", "message": start})
        blocks = _BlockWriter(response)
        try:
            async for step in run.steps():
                await blocks.write(parser.push(step.text))
            await blocks.write(parser.flush())
        except RequestError as error:
            await sse.send_event(response, "error", error_body(from_engine_error(error), "anthropic"))
            await response.write_eof()
            return response
        await blocks.close_open_block()
        delta = {"stop_reason": _STOP_REASONS[finish_kind(run, parser.saw_tool_call)],
                 "stop_sequence": run.stop_string}
        await sse.send_event(response, "message_delta", {"type": "message_delta", "delta": delta,
                                                         "usage": _usage(run)})
        await sse.send_event(response, "message_stop", {"type": "message_stop"})
        await response.write_eof()
    except ConnectionResetError:
        pass  # the client left; leaving the `async with` cancels the request
    return response


class _BlockWriter:
    """Turns parser segments into content_block_* events; mutates its own block bookkeeping."""

    def __init__(self, response: web.StreamResponse) -> None:
        self._response = response
        self._index = -1
        self._open_kind: str | None = None

    async def write(self, segments: list[Segment]) -> None:
        for segment in segments:
            if segment.tool_call is not None:
                await self._tool_use(segment.tool_call)
            elif segment.kind == "reasoning":
                await self._text_delta("thinking", {"type": "thinking_delta", "thinking": segment.text})
            else:
                await self._text_delta("text", {"type": "text_delta", "text": segment.text})

    async def _text_delta(self, kind: str, delta: dict[str, Any]) -> None:
        if self._open_kind != kind:
            await self.close_open_block()
            start = {"type": "thinking", "thinking": "", "signature": ""} if kind == "thinking" \
                else {"type": "text", "text": ""}
            await self._start(start)
            self._open_kind = kind
        await self._event("content_block_delta", {"delta": delta})

    async def _tool_use(self, call: ParsedToolCall) -> None:
        await self.close_open_block()
        block = _tool_use_block(call)
        await self._start({**block, "input": {}})
        await self._event("content_block_delta",
                          {"delta": {"type": "input_json_delta", "partial_json": json.dumps(block["input"])}})
        await self._event("content_block_stop", {})

    async def _start(self, block: dict[str, Any]) -> None:
        self._index += 1
        await self._event("content_block_start", {"content_block": block})

    async def close_open_block(self) -> None:
        if self._open_kind is not None:
            await self._event("content_block_stop", {})
            self._open_kind = None

    async def _event(self, name: str, fields: dict[str, Any]) -> None:
        await sse.send_event(self._response, name, {"type": name, "index": self._index, **fields})
