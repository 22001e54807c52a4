"""Split generated chat text into reasoning, answer text and tool calls, while it streams.

Qwen3.5 writes its reasoning as ``<think>\\n...\\n</think>\\n\\n`` before the answer (the generation prompt
usually opens the block already, so the output starts inside it) and each tool call as
``<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>``. `OutputParser.push(text)` returns the
segments that text completes, in order; text that might be the start of a marker is held back until the
next push. A tool call is released whole when its closing tag arrives; a body that is not a JSON object
with a string ``name`` is returned as plain content instead, tags included (nothing is lost).
"""

from __future__ import annotations

import json
from typing import Literal, NamedTuple

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
TOOL_OPEN = "<tool_call>"
TOOL_CLOSE = "</tool_call>"

SegmentKind = Literal["reasoning", "content", "tool_call"]
_State = Literal["reasoning", "content", "tool_call"]


class ParsedToolCall(NamedTuple):
    """A complete tool call: the function name and its arguments as JSON text."""

    name: str
    arguments: str


class Segment(NamedTuple):
    """A piece of output: reasoning or content `text`, or a complete `tool_call`."""

    kind: SegmentKind
    text: str = ""
    tool_call: ParsedToolCall | None = None


def parse_tool_call(body: str) -> ParsedToolCall | None:
    """The call in a ``<tool_call>`` body, or None when it is not ``{"name": str, "arguments": ...}``.

    Arguments given as an object become compact JSON text; given as a string they are kept as is. Pure.
    """
    try:
        document = json.loads(body)
    except ValueError:
        return None
    if not isinstance(document, dict) or not isinstance(document.get("name"), str):
        return None
    arguments = document.get("arguments", document.get("parameters", {}))
    if isinstance(arguments, str):
        return ParsedToolCall(document["name"], arguments)
    return ParsedToolCall(document["name"], json.dumps(arguments, ensure_ascii=False))


class OutputParser:
    """Streaming splitter of chat output. Mutates itself; one per request.

    `starts_in_reasoning`: the prompt opened a think block, so output is reasoning until ``</think>``.
    `parse_tools`: recognise ``<tool_call>`` blocks (only when the request offered tools).
    """

    def __init__(self, *, starts_in_reasoning: bool, parse_tools: bool) -> None:
        self._state: _State = "reasoning" if starts_in_reasoning else "content"
        self._parse_tools = parse_tools
        self._buffer = ""
        self._segment_start = starts_in_reasoning  # strip the newlines the template puts after a marker
        self.saw_tool_call = False

    def push(self, text: str) -> list[Segment]:
        """Add generated `text`; returns the segments it completes, in order. Mutates."""
        self._buffer += text
        segments: list[Segment] = []
        while True:
            marker = self._next_marker()
            if marker is None:
                break
            position, tag = marker
            self._close_span(self._buffer[:position], tag, segments)
            self._buffer = self._buffer[position + len(tag):]
        self._release_safe_text(segments)
        return segments

    def flush(self) -> list[Segment]:
        """Everything still held, at the end of generation (an unclosed tool call becomes content).

        Mutates."""
        segments: list[Segment] = []
        held, self._buffer = self._buffer, ""
        if self._state == "tool_call":
            self._emit(segments, "content", TOOL_OPEN + held)
        elif self._state == "reasoning":
            self._emit(segments, "reasoning", held.rstrip())
        elif not self.saw_tool_call:
            self._emit(segments, "content", held)
        return segments

    def _markers(self) -> tuple[str, ...]:
        if self._state == "reasoning":
            return (THINK_CLOSE,)
        if self._state == "tool_call":
            return (TOOL_CLOSE,)
        return (THINK_OPEN, TOOL_OPEN) if self._parse_tools else (THINK_OPEN,)

    def _next_marker(self) -> tuple[int, str] | None:
        found = [(self._buffer.find(tag), tag) for tag in self._markers()]
        found = [item for item in found if item[0] >= 0]
        return min(found) if found else None

    def _close_span(self, text: str, tag: str, segments: list[Segment]) -> None:
        """The span before `tag` ends; switch state by the tag."""
        if tag == TOOL_CLOSE:
            call = parse_tool_call(text.strip())
            if call is None:
                self._emit(segments, "content", TOOL_OPEN + text + TOOL_CLOSE)
            else:
                segments.append(Segment("tool_call", tool_call=call))
                self.saw_tool_call = True
            self._state = "content"
        elif tag == TOOL_OPEN:
            if not self.saw_tool_call:
                self._emit(segments, "content", text.rstrip())
            elif text.strip():
                self._emit(segments, "content", text)
            self._state = "tool_call"
        elif tag == THINK_OPEN:
            self._emit(segments, "content", text.rstrip())
            self._state = "reasoning"
        else:  # THINK_CLOSE
            self._emit(segments, "reasoning", text.rstrip())
            self._state = "content"
        self._segment_start = True

    def _release_safe_text(self, segments: list[Segment]) -> None:
        """Emit buffered text that can no longer be part of a marker (or of trailing whitespace)."""
        if self._state == "tool_call":
            return
        keep = _partial_marker_length(self._buffer, self._markers())
        safe = self._buffer[: len(self._buffer) - keep]
        releasable = safe.rstrip()
        self._buffer = self._buffer[len(releasable):]
        self._emit(segments, self._state, releasable)

    def _emit(self, segments: list[Segment], kind: SegmentKind, text: str) -> None:
        if self._segment_start:
            text = text.lstrip("\n")
        if not text:
            return
        self._segment_start = False
        if segments and segments[-1].kind == kind and kind != "tool_call":
            segments[-1] = Segment(kind, segments[-1].text + text)
        else:
            segments.append(Segment(kind, text))


def _partial_marker_length(text: str, markers: tuple[str, ...]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of one of `markers`. Pure."""
    longest = 0
    for marker in markers:
        for length in range(min(len(marker) - 1, len(text)), longest, -1):
            if marker.startswith(text[len(text) - length:]):
                longest = length
                break
    return longest
