"""OpenAI chat requests mapped onto the chat template's input: messages, tools, breakpoints, tool choice.

The template takes OpenAI-style dicts; here the typed request becomes those dicts (``developer`` becomes
``system``, text parts are joined, tool-call arguments stay as given) and every message carrying a
``cache_control`` marker (on itself or a content part) becomes a breakpoint index. Pure; raises ApiError
400 for content the server cannot serve.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import msgspec

from hybridcache.http.errors import bad_request
from hybridcache.http.openai_schemas import ChatCompletionRequest, ChatMessage, ContentPart, NamedToolChoice


class ChatInput(NamedTuple):
    """What the frontend's `prepare_chat` takes, and whether to parse tool calls from the output."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    breakpoints: tuple[int, ...]
    parse_tools: bool


def chat_input(body: ChatCompletionRequest) -> ChatInput:
    """The template input of a chat request. Raises ApiError 400 (empty messages, non-text content,
    a tool choice that names no offered tool)."""
    if not body.messages:
        raise bad_request("messages: must contain at least one message", "messages")
    messages = [_message_dict(index, message) for index, message in enumerate(body.messages)]
    breakpoints = tuple(index for index, message in enumerate(body.messages) if _has_breakpoint(message))
    tools, parse_tools = _offered_tools(body)
    return ChatInput(messages, tools, breakpoints, parse_tools)


def _message_dict(index: int, message: ChatMessage) -> dict[str, Any]:
    role = "system" if message.role == "developer" else message.role
    result: dict[str, Any] = {"role": role, "content": _text_of(index, message.content)}
    if message.name is not None:
        result["name"] = message.name
    if message.tool_calls:
        result["tool_calls"] = [
            {"id": call.id, "type": "function",
             "function": {"name": call.function.name, "arguments": call.function.arguments}}
            for call in message.tool_calls
        ]
    if message.tool_call_id is not None:
        result["tool_call_id"] = message.tool_call_id
    if message.reasoning_content is not None:
        result["reasoning_content"] = message.reasoning_content
    if role == "tool" and message.tool_call_id is None:
        raise bad_request(f"messages[{index}].tool_call_id: required for a tool message",
                          f"messages[{index}].tool_call_id")
    return result


def _text_of(index: int, content: str | list[ContentPart] | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for part_index, part in enumerate(content):
        if part.type != "text" or part.text is None:
            param = f"messages[{index}].content[{part_index}]"
            raise bad_request(f"{param}: only text content parts are supported, got type {part.type!r}",
                              param)
        texts.append(part.text)
    return "".join(texts)


def _has_breakpoint(message: ChatMessage) -> bool:
    if message.cache_control is not None:
        return True
    parts = message.content if isinstance(message.content, list) else []
    return any(part.cache_control is not None for part in parts)


def _offered_tools(body: ChatCompletionRequest) -> tuple[list[dict[str, Any]] | None, bool]:
    """The tools rendered into the prompt, and whether the output is parsed for tool calls.

    ``none`` renders no tools; a named choice renders only that tool; ``auto``/``required`` render all
    (``required`` is not enforced by constrained decoding: the model is asked, not forced).
    """
    choice = body.tool_choice
    if not body.tools:
        if choice is not None and choice != "none":
            raise bad_request("tool_choice: needs 'tools' to be given", "tool_choice")
        return None, False
    if choice == "none":
        return None, False
    tools = [{"type": "function", "function": _without_nulls(msgspec.to_builtins(tool.function))}
             for tool in body.tools]
    if isinstance(choice, NamedToolChoice):
        tools = [tool for tool in tools if tool["function"]["name"] == choice.function.name]
        if not tools:
            raise bad_request(f"tool_choice: no tool named {choice.function.name!r} in 'tools'",
                              "tool_choice")
    return tools, True


def _without_nulls(fields: dict[str, Any]) -> dict[str, Any]:
    return {name: value for name, value in fields.items() if value is not None}
