"""Our own trace format: JSONL, one request per line, with either text messages or block ids.

Each line is one JSON object (`TraceLine`), fields in this order, defaults omitted:

- ``conversation`` (str): the conversation id; lines of one conversation appear in turn order.
- ``turn`` (int): 0, 1, 2, ... within the conversation.
- ``arrival_s`` (float): the earliest time the request is sent, seconds from the start of the trace (one
  clock for the whole file; a client also waits for the previous turn of the conversation).
- ``max_tokens`` (int): the generation budget (for a replayed trace, the recorded output length).
- ``parent`` (str, optional): the conversation that started this one (sub-agents).
- ``kind`` (str, optional): which generator kind made the line (informational).
- then either ``messages``: OpenAI chat messages (role, content, tool_calls, tool_call_id, ...), and
  optionally ``tools`` (OpenAI tool definitions): the text form written by `hybridcache bench trace-gen`;
- or ``input_tokens``, ``block_size`` and ``block_ids``: the block form (``ceil(input_tokens /
  block_size)`` ids, global across the files loaded together).
- ``think_s`` (float, optional): client think time before the request.

A text line is turned into block ids without a tokenizer: the tools and each message are JSON-encoded and
joined by newlines, and every ``4 * block_size`` characters count as one block (~4 characters per token)
whose id chains an xxh3-64 hash of the chunk onto the previous block's id. So equal message prefixes
give equal block ids, and `input_tokens` is ``ceil(characters / 4)``: an approximation for the
simulator; live runs send the messages themselves.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import numpy as np
import xxhash

from hybridcache.tools.traces.model import (
    Conversation,
    TraceFormatError,
    TraceRequest,
    blocks_for,
    frozen_ids,
)

CHARS_PER_TOKEN = 4
DEFAULT_BLOCK_SIZE = 64


class TraceLine(msgspec.Struct, kw_only=True, omit_defaults=True):
    """One line of our JSONL trace format (see the module docstring)."""

    conversation: str
    turn: int
    arrival_s: float
    max_tokens: int
    parent: str | None = None
    kind: str = ""
    messages: list[dict[str, Any]] | None = None
    tools: list[dict[str, Any]] | None = None
    input_tokens: int | None = None
    block_size: int | None = None
    block_ids: list[int] | None = None
    think_s: float = 0.0


_DECODER = msgspec.json.Decoder(TraceLine)
_ENCODER = msgspec.json.Encoder()


def encode_line(line: TraceLine) -> bytes:
    """The line's JSON bytes with a trailing newline (deterministic: same line, same bytes)."""
    return _ENCODER.encode(line) + b"\n"


def read_jsonl(path: Path, data: bytes) -> list[Conversation]:
    """Conversations in order of first appearance. Raises TraceFormatError naming the line at fault."""
    runs: dict[str, list[TraceRequest]] = {}
    block_size: int | None = None
    for number, raw in enumerate(data.splitlines(), 1):
        if not raw.strip():
            continue
        line = _decode(path, number, raw)
        request = _request(path, number, line)
        if block_size is not None and request.block_size != block_size:
            raise TraceFormatError(str(path), f"line {number}: block_size {request.block_size} differs "
                                   f"from earlier lines ({block_size})")
        block_size = request.block_size
        run = runs.setdefault(line.conversation, [])
        if line.turn != len(run):
            raise TraceFormatError(str(path), f"line {number}: conversation {line.conversation!r} turn "
                                   f"{line.turn}, expected {len(run)}")
        run.append(request)
    return [Conversation(id=name, parent=run[0].parent, start_s=run[0].arrival_s, requests=tuple(run))
            for name, run in runs.items()]


def text_block_ids(messages: list[dict[str, Any]], tools: list[dict[str, Any]] | None,
                   block_size: int) -> tuple[int, np.ndarray]:
    """(approximate input tokens, chained content ids) for chat messages, as the module docstring says."""
    parts = [tools] if tools else []
    text = "\n".join(_ENCODER.encode(part).decode() for part in [*parts, *messages])
    chunk = CHARS_PER_TOKEN * block_size
    ids = np.empty(blocks_for(len(text), chunk), dtype=np.int64)
    previous = 0
    for index in range(len(ids)):
        previous = xxhash.xxh3_64_intdigest(text[index * chunk:(index + 1) * chunk].encode(), previous) >> 1
        ids[index] = previous
    return blocks_for(len(text), CHARS_PER_TOKEN), ids


def _decode(path: Path, number: int, raw: bytes) -> TraceLine:
    try:
        return _DECODER.decode(raw)
    except msgspec.DecodeError as error:
        raise TraceFormatError(str(path), f"line {number}: {error}") from None


def _request(path: Path, number: int, line: TraceLine) -> TraceRequest:
    block_size = line.block_size or DEFAULT_BLOCK_SIZE
    if line.messages is not None:
        input_tokens, ids = text_block_ids(line.messages, line.tools, block_size)
    elif line.block_ids is not None and line.input_tokens is not None:
        input_tokens, ids = line.input_tokens, np.array(line.block_ids, dtype=np.int64)
        if len(ids) != blocks_for(input_tokens, block_size):
            raise TraceFormatError(str(path), f"line {number}: {len(ids)} block ids for {input_tokens} "
                                   f"tokens of {block_size}-token blocks")
    else:
        raise TraceFormatError(str(path), f"line {number}: needs messages, or input_tokens and block_ids")
    messages = tuple(line.messages) if line.messages is not None else None
    tools = tuple(line.tools) if line.tools is not None else None
    return TraceRequest(conversation=line.conversation, parent=line.parent, turn=line.turn,
                        arrival_s=line.arrival_s, input_tokens=input_tokens, output_tokens=line.max_tokens,
                        block_ids=frozen_ids(ids), block_size=block_size, think_s=line.think_s,
                        messages=messages, tools=tools)
