"""Request bodies of the OpenAI endpoints as msgspec Structs: decoding validates types and names the field.

Unknown fields are ignored (clients send many we do not use). Range checks that SamplingParams owns
(temperature, top_p, ...) happen when the sampling parameters are built; the rest (n, content parts, tool
choice) in the handlers. Structs are frozen; nothing here mutates anything.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

ChatRole = Literal["system", "developer", "user", "assistant", "tool"]


class CacheControl(msgspec.Struct, frozen=True, kw_only=True):
    """A client cache breakpoint (Anthropic style; some OpenAI-compatible clients send it too)."""

    type: str = "ephemeral"
    ttl: str | None = None


class ContentPart(msgspec.Struct, frozen=True, kw_only=True):
    """One part of a message's content. Only ``type == "text"`` is served; others are refused clearly."""

    type: str
    text: str | None = None
    cache_control: CacheControl | None = None


class FunctionCall(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(msgspec.Struct, frozen=True, kw_only=True):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(msgspec.Struct, frozen=True, kw_only=True):
    role: ChatRole
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    reasoning_content: str | None = None
    cache_control: CacheControl | None = None


class FunctionDefinition(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDefinition(msgspec.Struct, frozen=True, kw_only=True):
    type: Literal["function"] = "function"
    function: FunctionDefinition


class NamedFunction(msgspec.Struct, frozen=True, kw_only=True):
    name: str


class NamedToolChoice(msgspec.Struct, frozen=True, kw_only=True):
    type: Literal["function"] = "function"
    function: NamedFunction


class StreamOptions(msgspec.Struct, frozen=True, kw_only=True):
    include_usage: bool = False


class ResponseFormat(msgspec.Struct, frozen=True, kw_only=True):
    """OpenAI's ``response_format``: only its ``type`` is read (``json_schema`` and the rest are not)."""

    type: str


class SamplingFields(msgspec.Struct, frozen=True, kw_only=True):
    """Fields both OpenAI endpoints share."""

    model: str
    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: bool = False
    logit_bias: dict[str, float] | None = None  # token id (a decimal string) -> bias in [-100, 100]
    n: int = 1
    response_format: ResponseFormat | None = None  # only "text": there is no constrained decoding
    stream: bool = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    prompt_cache_key: str | None = None
    cache_salt: str | None = None


class ChatCompletionRequest(SamplingFields, frozen=True, kw_only=True):
    messages: list[ChatMessage]
    max_completion_tokens: int | None = None
    logprobs: bool = False
    top_logprobs: int | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True


class CompletionRequest(SamplingFields, frozen=True, kw_only=True):
    prompt: str | list[Any]  # a string, token ids, or a one-item batch of either (checked by the handler)
    logprobs: int | None = None
    echo: bool = False
    suffix: str | None = None
    best_of: int | None = None
