"""Chat output shared by the OpenAI and Anthropic chat endpoints: whole-response collection and tool-call ids.

`collect_chat(run, parser)` drains a `Generation` through an `OutputParser` into reasoning text, answer text,
tool calls and per-token logprobs (the non-streaming responses); `finish_kind` folds the engine's finish
reason and the presence of tool calls into one protocol-neutral value. Mutates only the run and parser.
"""

from __future__ import annotations

import uuid
from typing import Literal

import msgspec

from hybridcache.core.api import TokenLogprob
from hybridcache.http.generation import Generation
from hybridcache.http.output_parser import OutputParser, ParsedToolCall, Segment

FinishKind = Literal["stop", "length", "tool_calls", "stop_string"]


class CollectedChat(msgspec.Struct, frozen=True, kw_only=True):
    """A finished chat response, split by kind."""

    reasoning: str
    content: str
    tool_calls: tuple[ParsedToolCall, ...]
    logprobs: tuple[TokenLogprob, ...]


async def collect_chat(run: Generation, parser: OutputParser) -> CollectedChat:
    """Drain `run` through `parser`. Raises RequestError from the engine. Mutates both."""
    segments: list[Segment] = []
    logprobs: list[TokenLogprob] = []
    async for step in run.steps():
        segments.extend(parser.push(step.text))
        logprobs.extend(step.logprobs or ())
    segments.extend(parser.flush())
    return CollectedChat(
        reasoning="".join(segment.text for segment in segments if segment.kind == "reasoning"),
        content="".join(segment.text for segment in segments if segment.kind == "content"),
        tool_calls=tuple(segment.tool_call for segment in segments if segment.tool_call is not None),
        logprobs=tuple(logprobs),
    )


def finish_kind(run: Generation, saw_tool_call: bool) -> FinishKind:
    """Why the response ended, protocol-neutral: a stop string, the length limit, tool calls, or a stop."""
    if run.stop_string is not None:
        return "stop_string"
    if run.finish_reason == "length":
        return "length"
    return "tool_calls" if saw_tool_call else "stop"


def new_tool_call_id(prefix: str = "call_") -> str:
    """A fresh tool-call id (``call_...`` for OpenAI, ``toolu_...`` for Anthropic)."""
    return prefix + uuid.uuid4().hex[:24]
