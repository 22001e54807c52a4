"""POST /v1/completions: a text or token-id prompt, raw continuation (no template, no output parsing).

One prompt per request (a one-item batch is unwrapped; larger batches are refused, as is n > 1), `echo`
prepends the prompt text, `logprobs` (an int) asks for that many alternatives per token. Handlers only
submit and await; failures are rendered as in the chat endpoint.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from aiohttp import web

from hybridcache.core.api import PreparedPrompt, RequestError
from hybridcache.http import sse
from hybridcache.http.auth import request_cache_salt
from hybridcache.http.errors import bad_request, from_engine_error
from hybridcache.http.generation import Generation
from hybridcache.http.openai_common import completion_logprobs, finish_reason, stream_error, usage
from hybridcache.http.openai_schemas import CompletionRequest
from hybridcache.http.request_prep import (
    build_sampling,
    check_response_format,
    check_single_choice,
    connection_probe,
    decode_body,
    logit_bias_pairs,
    new_request_id,
    prepare,
    resolve_max_tokens,
    stop_strings,
)
from hybridcache.http.state import ServerState, server_state

COMPLETIONS_DEFAULT_MAX_TOKENS = 16  # OpenAI's default for the legacy completions API


async def completions(request: web.Request) -> web.StreamResponse:
    """Handle one completion. Raises ApiError for a refused request (rendered by the middleware)."""
    started_at = time.monotonic()
    state = server_state(request)
    body = await decode_body(request, CompletionRequest)
    state.check_model(body.model)
    check_single_choice(body.n)
    check_response_format(body.response_format)
    _check_unsupported(body)
    stops = stop_strings(body.stop)
    prompt = await completion_prompt(state, body.prompt, request_cache_salt(request, body.cache_salt))
    max_tokens = resolve_max_tokens(body.max_tokens, prompt.num_tokens, state.max_model_len,
                                    default=COMPLETIONS_DEFAULT_MAX_TOKENS)
    sampling = build_sampling(
        {"top_logprobs": "logprobs"}, max_tokens=max_tokens, temperature=body.temperature, top_p=body.top_p,
        top_k=body.top_k,
        min_p=body.min_p, seed=body.seed, stop_token_ids=body.stop_token_ids,
        presence_penalty=body.presence_penalty, frequency_penalty=body.frequency_penalty,
        repetition_penalty=body.repetition_penalty, logprobs=True if body.logprobs is not None else None,
        top_logprobs=body.logprobs or None, ignore_eos=body.ignore_eos,
        logit_bias=logit_bias_pairs(body.logit_bias, state.frontend.tokenizer.vocab_size))
    run = Generation(state.engine, state.frontend.tokenizer, prompt, sampling,
                     request_id=new_request_id("cmpl"), stops=stops, metrics=state.metrics,
                     started_at=started_at, is_connected=connection_probe(request))
    echo = state.frontend.tokenizer.decode(prompt.token_ids) if body.echo else ""
    async with run:
        try:
            await run.admit()
        except RequestError as error:
            raise from_engine_error(error) from error
        if body.stream:
            return await _stream(request, state, body, run, echo)
        return await _respond(state, body, run, echo)


def _check_unsupported(body: CompletionRequest) -> None:
    if body.suffix:
        raise bad_request("suffix: not supported by this server", "suffix")
    if body.best_of is not None and body.best_of != 1:
        raise bad_request(f"best_of: only best_of=1 is supported, got {body.best_of}", "best_of")


async def completion_prompt(state: ServerState, prompt: str | list[Any], salt: str | None) -> PreparedPrompt:
    """Text or token ids (or a one-item batch of either) through the frontend: the prompt a completion
    submits, and the one the render endpoint answers with. Raises ApiError 400."""
    if isinstance(prompt, list) and prompt and all(isinstance(item, str | list) for item in prompt):
        if len(prompt) != 1:
            raise bad_request(f"prompt: one prompt per request is supported, got a batch of {len(prompt)}",
                              "prompt")
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise bad_request("prompt: must not be empty", "prompt")
        return await prepare(state.frontend.prepare_text, prompt, cache_salt=salt)
    _check_token_ids(prompt, state.frontend.tokenizer.vocab_size)
    return await prepare(state.frontend.prepare_tokens, prompt, cache_salt=salt)


def _check_token_ids(token_ids: Sequence[object], vocab_size: int) -> None:
    if not token_ids:
        raise bad_request("prompt: must not be empty", "prompt")
    for token in token_ids:
        if isinstance(token, bool) or not isinstance(token, int) or not 0 <= token < vocab_size:
            raise bad_request(f"prompt: token ids must be integers in [0, {vocab_size}), got {token!r}",
                              "prompt")


async def _respond(state: ServerState, body: CompletionRequest, run: Generation, echo: str) -> web.Response:
    texts, logprobs = [echo], []
    try:
        async for step in run.steps():
            texts.append(step.text)
            logprobs.extend(step.logprobs or ())
    except RequestError as error:
        raise from_engine_error(error) from error
    choice = {
        "index": 0,
        "text": "".join(texts),
        "logprobs": completion_logprobs(state.frontend.tokenizer, logprobs, len(echo))
        if body.logprobs is not None else None,
        "finish_reason": finish_reason("stop_string" if run.stop_string else
                                       "length" if run.finish_reason == "length" else "stop"),
    }
    return web.json_response({"id": run.request_id, "object": "text_completion", "created": int(time.time()),
                              "model": body.model, "choices": [choice], "usage": usage(run)})


async def _stream(request: web.Request, state: ServerState, body: CompletionRequest, run: Generation,
                  echo: str) -> web.StreamResponse:
    include_usage = body.stream_options is not None and body.stream_options.include_usage
    header = {"id": run.request_id, "object": "text_completion", "created": int(time.time()),
              "model": body.model}
    extra = {"usage": None} if include_usage else {}

    def chunk(text: str, logprobs: object = None, finish: str | None = None) -> dict[str, Any]:
        choice = {"index": 0, "text": text, "logprobs": logprobs, "finish_reason": finish}
        return {**header, "choices": [choice], **extra}

    try:
        response = await sse.open_event_stream(request)
    except ConnectionResetError:
        return sse.client_gone()
    try:
        if echo:
            await sse.send_data(response, chunk(echo))
        offset = len(echo)
        try:
            async for step in run.steps():
                logprobs = completion_logprobs(state.frontend.tokenizer, step.logprobs or (), offset) \
                    if body.logprobs is not None else None
                offset += len(step.text)
                await sse.send_data(response, chunk(step.text, logprobs))
        except RequestError as error:
            await sse.send_data(response, stream_error(from_engine_error(error)))
            await sse.send_done(response)
            return response
        reason = finish_reason("stop_string" if run.stop_string else
                               "length" if run.finish_reason == "length" else "stop")
        await sse.send_data(response, chunk("", finish=reason))
        if include_usage:
            await sse.send_data(response, {**header, "choices": [], "usage": usage(run)})
        await sse.send_done(response)
    except ConnectionResetError:
        pass  # the client left; leaving the `async with` cancels the request
    return response
