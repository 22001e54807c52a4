"""Anthropic Messages requests mapped onto the chat template's input, and cache_control validated.

System text becomes a system message; user turns' ``tool_result`` blocks become ``tool`` messages and
their text a user message; assistant turns' ``thinking``/``text``/``tool_use`` blocks become one assistant
message with ``reasoning_content`` and ``tool_calls``. A block carrying ``cache_control`` makes the message
it lands in a breakpoint (a priority-1 tap hint); on a tool definition it marks the system message when
there is one (otherwise the frontend's own end-of-tools hint covers it). cache_control is validated the way
Anthropic does: at most 4 blocks, type ``ephemeral``, ttl ``5m``/``1h`` with no ``1h`` after a ``5m``, never
on an empty text block. Pure; raises ApiError 400.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from hybridcache.http.anthropic_schemas import (
    Message,
    MessagesRequest,
    TextBlock,
    ThinkingBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from hybridcache.http.errors import bad_request
from hybridcache.http.openai_schemas import CacheControl

MAX_CACHE_BREAKPOINTS = 4
_TTLS = (None, "5m", "1h")


class TemplateInput(NamedTuple):
    """What the frontend's `prepare_chat` takes, plus whether tool calls are parsed from the output."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    breakpoints: tuple[int, ...]
    template_kwargs: dict[str, Any] | None
    parse_tools: bool


def template_input(body: MessagesRequest) -> TemplateInput:
    """The template input of a Messages request. Raises ApiError 400 (empty messages, bad cache_control,
    a tool choice naming no tool)."""
    if not body.messages:
        raise bad_request("messages: at least one message is required", "messages")
    validate_cache_controls(body)
    messages: list[dict[str, Any]] = []
    breakpoints: list[int] = []
    system_blocks = [TextBlock(text=body.system)] if isinstance(body.system, str) else list(body.system or [])
    if system_blocks:
        messages.append({"role": "system", "content": "\n\n".join(block.text for block in system_blocks)})
        tools_marked = any(tool.cache_control for tool in body.tools or [])
        if tools_marked or any(block.cache_control for block in system_blocks):
            breakpoints.append(0)
    for message in body.messages:
        _append_turn(messages, breakpoints, message)
    tools, parse_tools = _offered_tools(body)
    kwargs = None if body.thinking is None else {"enable_thinking": body.thinking.type == "enabled"}
    return TemplateInput(messages, tools, tuple(sorted(set(breakpoints))), kwargs, parse_tools)


def validate_cache_controls(body: MessagesRequest) -> None:
    """Raises ApiError 400 unless the request's cache_control markers are valid the way Anthropic checks."""
    markers: list[tuple[str, CacheControl]] = []
    for index, tool in enumerate(body.tools or []):
        if tool.cache_control is not None:
            markers.append((f"tools.{index}.cache_control", tool.cache_control))
    for index, block in enumerate(body.system if isinstance(body.system, list) else []):
        _collect_block_marker(markers, f"system.{index}", block)
    for turn, message in enumerate(body.messages):
        for index, block in enumerate(message.content if isinstance(message.content, list) else []):
            _collect_block_marker(markers, f"messages.{turn}.content.{index}", block)
    if len(markers) > MAX_CACHE_BREAKPOINTS:
        raise bad_request(f"A maximum of {MAX_CACHE_BREAKPOINTS} blocks with cache_control may be provided. "
                          f"Found {len(markers)}.")
    seen_short_ttl = False
    for where, marker in markers:
        if marker.type != "ephemeral":
            raise bad_request(f"{where}.type: Input should be 'ephemeral'", f"{where}.type")
        if marker.ttl not in _TTLS:
            raise bad_request(f"{where}.ttl: Input should be '5m' or '1h'", f"{where}.ttl")
        if marker.ttl == "1h" and seen_short_ttl:
            raise bad_request("A cache_control block with ttl='1h' must not come after one with ttl='5m' "
                              f"(at {where}).")
        seen_short_ttl = seen_short_ttl or marker.ttl in (None, "5m")


def _collect_block_marker(markers: list[tuple[str, CacheControl]], where: str, block: object) -> None:
    marker = getattr(block, "cache_control", None)
    if marker is None:
        return
    if isinstance(block, TextBlock) and not block.text:
        raise bad_request(f"{where}: cache_control cannot be set for empty text blocks")
    markers.append((f"{where}.cache_control", marker))


def _append_turn(messages: list[dict[str, Any]], breakpoints: list[int], message: Message) -> None:
    """Append the template messages of one turn (mutates `messages` and `breakpoints`)."""
    if isinstance(message.content, str):
        messages.append({"role": message.role, "content": message.content})
        return
    if message.role == "assistant":
        messages.append(_assistant_message(message))
        if any(getattr(block, "cache_control", None) for block in message.content):
            breakpoints.append(len(messages) - 1)
        return
    texts: list[str] = []
    text_marked = False
    for block in message.content:
        if isinstance(block, ToolResultBlock):
            messages.append({"role": "tool", "tool_call_id": block.tool_use_id,
                             "content": _result_text(block)})
            if block.cache_control is not None:
                breakpoints.append(len(messages) - 1)
        elif isinstance(block, TextBlock):
            texts.append(block.text)
            text_marked = text_marked or block.cache_control is not None
        else:
            raise bad_request(f"a user turn cannot hold a {type(block).__name__} block", "messages")
    if texts:
        messages.append({"role": "user", "content": "\n\n".join(texts)})
        if text_marked:
            breakpoints.append(len(messages) - 1)


def _assistant_message(message: Message) -> dict[str, Any]:
    texts, reasoning, calls = [], [], []
    for block in message.content:
        if isinstance(block, TextBlock):
            texts.append(block.text)
        elif isinstance(block, ThinkingBlock):
            reasoning.append(block.thinking)
        elif isinstance(block, ToolUseBlock):
            calls.append({"id": block.id, "type": "function",
                          "function": {"name": block.name, "arguments": block.input}})
        else:
            raise bad_request("an assistant turn cannot hold a tool_result block", "messages")
    result: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if reasoning:
        result["reasoning_content"] = "\n".join(reasoning)
    if calls:
        result["tool_calls"] = calls
    return result


def _result_text(block: ToolResultBlock) -> str:
    text = block.content if isinstance(block.content, str) else "\n".join(part.text for part in block.content)
    return f"Error: {text}" if block.is_error else text


def _offered_tools(body: MessagesRequest) -> tuple[list[dict[str, Any]] | None, bool]:
    choice = body.tool_choice
    if not body.tools or (choice is not None and choice.type == "none"):
        return None, False
    tools = [{"type": "function", "function": {"name": tool.name, "description": tool.description or "",
                                               "parameters": tool.input_schema}} for tool in body.tools]
    if choice is not None and choice.type == "tool":
        tools = [tool for tool in tools if tool["function"]["name"] == choice.name]
        if not tools:
            raise bad_request(f"tool_choice.name: no tool named {choice.name!r} in 'tools'", "tool_choice")
    return tools, True
