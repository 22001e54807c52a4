"""POST /v1/chat/completions: template, submit, and answer as one JSON body or as SSE chunks.

The handler only submits and awaits. Refusals before the first byte get their status (the admission
notice is awaited before a stream opens); a failure mid-stream becomes an error frame and ``[DONE]``.
A client that goes away cancels its request (see `Generation`).
"""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from hybridcache.core.api import PreparedPrompt, RequestError
from hybridcache.http import sse
from hybridcache.http.auth import request_cache_salt
from hybridcache.http.chat_output import collect_chat, finish_kind, new_tool_call_id
from hybridcache.http.errors import from_engine_error
from hybridcache.http.generation import Generation
from hybridcache.http.openai_common import chat_logprobs, finish_reason, stream_error, usage
from hybridcache.http.openai_messages import ChatInput, chat_input
from hybridcache.http.openai_schemas import ChatCompletionRequest
from hybridcache.http.output_parser import OutputParser, Segment
from hybridcache.http.request_limits import check_conversation_size
from hybridcache.http.request_prep import (
    build_sampling,
    check_response_format,
    check_single_choice,
    connection_probe,
    decode_body,
    logit_bias_pairs,
    new_request_id,
    prepare,
    prompt_opens_reasoning,
    resolve_max_tokens,
    stop_strings,
)
from hybridcache.http.state import ServerState, server_state


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """Handle one chat completion. Raises ApiError for a refused request (rendered by the middleware)."""
    started_at = time.monotonic()
    state = server_state(request)
    body = await decode_body(request, ChatCompletionRequest)
    check_single_choice(body.n)
    check_response_format(body.response_format)
    stops = stop_strings(body.stop)
    prompt, chat = await chat_prompt(request, state, body)
    max_param = "max_completion_tokens" if body.max_completion_tokens is not None else "max_tokens"
    max_tokens = resolve_max_tokens(body.max_completion_tokens or body.max_tokens, prompt.num_tokens,
                                    state.max_model_len, max_param, default=state.options.default_max_tokens)
    sampling = build_sampling(
        {"max_tokens": max_param}, max_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p,
        top_k=body.top_k, min_p=body.min_p, seed=body.seed, stop_token_ids=body.stop_token_ids,
        presence_penalty=body.presence_penalty, frequency_penalty=body.frequency_penalty,
        repetition_penalty=body.repetition_penalty, logprobs=body.logprobs or None,
        top_logprobs=body.top_logprobs, ignore_eos=body.ignore_eos,
        logit_bias=logit_bias_pairs(body.logit_bias, state.frontend.tokenizer.vocab_size))
    parser = OutputParser(starts_in_reasoning=prompt_opens_reasoning(state.frontend.tokenizer, prompt),
                          parse_tools=chat.parse_tools)
    run = Generation(state.engine, state.frontend.tokenizer, prompt, sampling,
                     request_id=new_request_id("chatcmpl"), stops=stops,
                     metrics=state.metrics, started_at=started_at, is_connected=connection_probe(request))
    async with run:
        try:
            await run.admit()
        except RequestError as error:
            raise from_engine_error(error) from error
        if body.stream:
            return await _stream(request, state, body, run, parser)
        return await _respond(state, body, run, parser)


async def chat_prompt(request: web.Request, state: ServerState,
                      body: ChatCompletionRequest) -> tuple[PreparedPrompt, ChatInput]:
    """The prompt a chat request submits (template, tokens, cache salt) and its template input. The
    render endpoint answers with the same prompt. Raises ApiError (unknown model, oversized or
    unservable conversation, a template the frontend rejects)."""
    state.check_model(body.model)
    check_conversation_size(body.messages, body.tools)
    chat = chat_input(body)
    prompt = await prepare(
        state.frontend.prepare_chat, chat.messages, chat.tools,
        add_generation_prompt=body.add_generation_prompt, template_kwargs=body.chat_template_kwargs,
        cache_salt=request_cache_salt(request, body.cache_salt), breakpoints=chat.breakpoints)
    return prompt, chat


async def _respond(state: ServerState, body: ChatCompletionRequest, run: Generation,
                   parser: OutputParser) -> web.Response:
    try:
        collected = await collect_chat(run, parser)
    except RequestError as error:
        raise from_engine_error(error) from error
    message: dict[str, Any] = {"role": "assistant", "content": collected.content or None}
    if collected.reasoning:
        message["reasoning_content"] = collected.reasoning
    if collected.tool_calls:
        message["tool_calls"] = [_tool_call(call) for call in collected.tool_calls]
    choice = {
        "index": 0,
        "message": message,
        "logprobs": chat_logprobs(state.frontend.tokenizer, collected.logprobs) if body.logprobs else None,
        "finish_reason": finish_reason(finish_kind(run, bool(collected.tool_calls))),
    }
    return web.json_response({"id": run.request_id, "object": "chat.completion", "created": int(time.time()),
                              "model": body.model, "choices": [choice], "usage": usage(run)})


async def _stream(request: web.Request, state: ServerState, body: ChatCompletionRequest, run: Generation,
                  parser: OutputParser) -> web.StreamResponse:
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    chunk = _ChunkMaker(run.request_id, body.model, include_usage)
    try:
        response = await sse.open_event_stream(request)
    except ConnectionResetError:
        return sse.client_gone()
    try:
        await sse.send_data(response, chunk({"role": "assistant", "content": ""}))
        tool_index = 0
        try:
            async for step in run.steps():
                logprobs = chat_logprobs(state.frontend.tokenizer, step.logprobs) \
                    if body.logprobs and step.logprobs else None
                for delta in _deltas(parser.push(step.text), tool_index):
                    tool_index += "tool_calls" in delta
                    await sse.send_data(response, chunk(delta, logprobs=logprobs))
                    logprobs = None
                if logprobs is not None:
                    await sse.send_data(response, chunk({}, logprobs=logprobs))
            for delta in _deltas(parser.flush(), tool_index):
                await sse.send_data(response, chunk(delta))
        except RequestError as error:
            await sse.send_data(response, stream_error(from_engine_error(error)))
            await sse.send_done(response)
            return response
        reason = finish_reason(finish_kind(run, parser.saw_tool_call))
        await sse.send_data(response, chunk({}, finish=reason))
        if include_usage:
            await sse.send_data(response, {**chunk.header(), "choices": [], "usage": usage(run)})
        await sse.send_done(response)
    except ConnectionResetError:
        pass  # the client left; leaving the `async with` cancels the request
    return response


def _deltas(segments: list[Segment], tool_index: int) -> list[dict[str, Any]]:
    deltas: list[dict[str, Any]] = []
    for segment in segments:
        if segment.tool_call is not None:
            deltas.append({"tool_calls": [{"index": tool_index, **_tool_call(segment.tool_call)}]})
            tool_index += 1
        elif segment.kind == "reasoning":
            deltas.append({"reasoning_content": segment.text})
        else:
            deltas.append({"content": segment.text})
    return deltas


def _tool_call(call: Any) -> dict[str, Any]:
    return {"id": new_tool_call_id(), "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


class _ChunkMaker:
    """Builds ``chat.completion.chunk`` objects for one stream. Pure apart from its fixed header."""

    def __init__(self, request_id: str, model: str, include_usage: bool) -> None:
        self._header = {"id": request_id, "object": "chat.completion.chunk", "created": int(time.time()),
                        "model": model}
        self._include_usage = include_usage

    def header(self) -> dict[str, Any]:
        return dict(self._header)

    def __call__(self, delta: dict[str, Any], *, finish: str | None = None,
                 logprobs: dict[str, object] | None = None) -> dict[str, Any]:
        chunk = {**self._header,
                 "choices": [{"index": 0, "delta": delta, "logprobs": logprobs, "finish_reason": finish}]}
        if self._include_usage:
            chunk["usage"] = None
        return chunk

