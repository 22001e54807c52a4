"""Shared request preparation: decode a body, build `SamplingParams`, check the context, run the frontend.

Every function raises `ApiError` (400 for a bad field, naming it; 413 is aiohttp's) and mutates nothing.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Callable
from typing import Any, TypeVar

import msgspec
from aiohttp import web

from hybridcache.core.api import PreparedPrompt
from hybridcache.core.sampling_params import SamplingParams
from hybridcache.core.tokenizer import FrontendError, Tokenizer
from hybridcache.http.errors import ApiError, bad_request, from_validation_error
from hybridcache.http.openai_schemas import ResponseFormat
from hybridcache.http.output_parser import THINK_OPEN
from hybridcache.http.request_limits import checked_stop_strings

Body = TypeVar("Body")
_TAIL_TOKENS = 8


async def decode_body(request: web.Request, body_type: type[Body]) -> Body:
    """The request body decoded as `body_type`. Raises ApiError 400 (malformed JSON, wrong types) or
    413 (larger than the server's limit)."""
    try:
        raw = await request.read()
    except web.HTTPRequestEntityTooLarge as error:
        raise ApiError(413, f"Request body too large: {error.text}", "too_large") from error
    if not raw:
        raise bad_request("Request body is empty; expected a JSON object.")
    try:
        return msgspec.json.decode(raw, type=body_type)
    except (msgspec.ValidationError, msgspec.DecodeError) as error:
        raise from_validation_error(error) from error


def build_sampling(rename: dict[str, str] | None = None, **fields: Any) -> SamplingParams:
    """`SamplingParams` from request fields (None means "use the default").

    Raises ApiError 400 naming the field at fault; `rename` maps our field names to the request's own
    (``max_tokens`` -> ``max_completion_tokens``).
    """
    given = {name: value for name, value in fields.items() if value is not None}
    if isinstance(given.get("stop_token_ids"), list):
        given["stop_token_ids"] = tuple(given["stop_token_ids"])
    try:
        return SamplingParams(**given)
    except ValueError as error:
        field = str(error).split(":", 1)[0]
        param = (rename or {}).get(field, field)
        raise bad_request(f"{param}{str(error)[len(field):]}", param) from error


def logit_bias_pairs(
    bias: dict[str, float] | None, vocab_size: int
) -> tuple[tuple[int, float], ...] | None:
    """OpenAI's ``logit_bias`` object as (token id, bias) pairs for `SamplingParams` (None when absent).
    Raises ApiError 400 for a key that is not a token id of the vocabulary (the bias range is checked by
    `SamplingParams`)."""
    if bias is None:
        return None
    pairs = []
    for key, value in bias.items():
        token = int(key) if key.isascii() and key.isdigit() else -1
        if not 0 <= token < vocab_size:
            raise bad_request(f"logit_bias: keys must be token ids in [0, {vocab_size}), got {key!r}",
                              "logit_bias")
        pairs.append((token, value))
    return tuple(pairs)


def resolve_max_tokens(requested: int | None, prompt_tokens: int, max_model_len: int,
                       param: str = "max_tokens", default: int | None = None) -> int:
    """The output budget: `requested`; when None, `default` capped by the rest of the context (the rest
    of the context when `default` is None too).

    Raises ApiError 400 when `requested` < 1, or the prompt plus the budget exceeds `max_model_len`.
    """
    if requested is not None and requested < 1:
        raise bad_request(f"{param}: must be >= 1, got {requested}", param)
    rest = max_model_len - prompt_tokens
    budget = requested if requested is not None else rest if default is None else min(default, rest)
    if prompt_tokens + max(budget, 1) > max_model_len:
        wanted = f"{prompt_tokens + budget} tokens ({prompt_tokens} in the prompt, {budget} for the output)" \
            if requested is not None else f"{prompt_tokens} tokens in the prompt"
        raise bad_request(f"This model's maximum context length is {max_model_len} tokens. However, you "
                          f"requested {wanted}. Please reduce the length of the prompt or the {param}.",
                          "messages" if requested is None else param, "context_length_exceeded")
    return budget


def stop_strings(stop: str | list[str] | None, param: str = "stop") -> tuple[str, ...]:
    """The stop strings of a request field (a string or a list). Raises ApiError 400 beyond the limits
    of `request_limits`."""
    return checked_stop_strings(stop, param)


def check_single_choice(n: int) -> None:
    """Raises ApiError 400 unless n == 1 (one choice per request is all this server generates)."""
    if n != 1:
        raise bad_request(f"n: only n=1 is supported, got {n}", "n")


def check_response_format(response_format: ResponseFormat | None) -> None:
    """Raises ApiError 400 for a ``response_format`` other than plain text: the server has no constrained
    decoding, and output that ignored a requested JSON schema would break the client that relies on it."""
    if response_format is not None and response_format.type != "text":
        raise bad_request(
            f"response_format: type {response_format.type!r} is not supported by this server (it has no "
            "constrained decoding); omit the field or send {\"type\": \"text\"}",
            "response_format",
        )


async def prepare(call: Callable[..., PreparedPrompt], *args: Any, **kwargs: Any) -> PreparedPrompt:
    """Run a frontend call off the event loop. Raises ApiError 400 when the frontend rejects the input."""
    try:
        return await asyncio.to_thread(call, *args, **kwargs)
    except FrontendError as error:
        raise bad_request(error.message) from error
    except ValueError as error:
        raise bad_request(str(error)) from error


def prompt_opens_reasoning(tokenizer: Tokenizer, prompt: PreparedPrompt) -> bool:
    """True when the prompt ends inside an open ``<think>`` block (the output starts as reasoning). Pure."""
    tail = tokenizer.decode(prompt.token_ids[-_TAIL_TOKENS:], skip_special_tokens=False)
    return tail.rstrip().endswith(THINK_OPEN)


def new_request_id(prefix: str) -> str:
    """A fresh id such as ``chatcmpl-3f2a...``."""
    return f"{prefix}-{uuid.uuid4().hex}"


def connection_probe(request: web.Request) -> Callable[[], bool]:
    """A callable that says whether the client's connection is still open. Pure."""
    def is_connected() -> bool:
        transport = request.transport
        return transport is not None and not transport.is_closing()
    return is_connected
