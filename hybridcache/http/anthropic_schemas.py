"""Request body of Anthropic's POST /v1/messages as msgspec Structs (content blocks as a tagged union).

Decoding validates types and names the field at fault; unknown fields are ignored. Block types other
than text, tool_use, tool_result and thinking fail to decode (images are not served). Frozen; pure.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from hybridcache.http.openai_schemas import CacheControl


class TextBlock(msgspec.Struct, frozen=True, kw_only=True, tag="text", tag_field="type"):
    text: str
    cache_control: CacheControl | None = None


class ToolUseBlock(msgspec.Struct, frozen=True, kw_only=True, tag="tool_use", tag_field="type"):
    id: str
    name: str
    input: dict[str, Any]
    cache_control: CacheControl | None = None


class ToolResultBlock(msgspec.Struct, frozen=True, kw_only=True, tag="tool_result", tag_field="type"):
    tool_use_id: str
    content: str | list[TextBlock] = ""
    is_error: bool = False
    cache_control: CacheControl | None = None


class ThinkingBlock(msgspec.Struct, frozen=True, kw_only=True, tag="thinking", tag_field="type"):
    thinking: str
    signature: str | None = None


ContentBlock = TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock


class Message(msgspec.Struct, frozen=True, kw_only=True):
    role: Literal["user", "assistant"]
    content: str | list[ContentBlock]


class Tool(msgspec.Struct, frozen=True, kw_only=True):
    name: str
    description: str | None = None
    input_schema: dict[str, Any] = msgspec.field(default_factory=dict)
    cache_control: CacheControl | None = None


class ToolChoice(msgspec.Struct, frozen=True, kw_only=True):
    type: Literal["auto", "any", "tool", "none"]
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingConfig(msgspec.Struct, frozen=True, kw_only=True):
    type: Literal["enabled", "disabled"]
    budget_tokens: int | None = None


class Metadata(msgspec.Struct, frozen=True, kw_only=True):
    user_id: str | None = None


class MessagesRequest(msgspec.Struct, frozen=True, kw_only=True):
    model: str
    max_tokens: int
    messages: list[Message]
    system: str | list[TextBlock] | None = None
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    tools: list[Tool] | None = None
    tool_choice: ToolChoice | None = None
    thinking: ThinkingConfig | None = None
    metadata: Metadata | None = None
    cache_salt: str | None = None
