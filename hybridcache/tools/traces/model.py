"""The normalized trace: conversations of requests whose prompts are sequences of block ids.

Every reader (WEKA, Mooncake, our JSONL) produces the same records, so the simulator and the replay tools
never look at a source format:

- `TraceRequest.block_ids` is a read-only int64 numpy array with exactly
  ``ceil(input_tokens / block_size)`` ids; each id stands for one block of `block_size` tokens. Ids are
  global within one `Trace`: the same id means the same tokens wherever it appears (readers remap scoped
  ids so that this holds). When `input_tokens` is not a multiple of `block_size`, the last id covers a
  partial block: its tokens are the first ``input_tokens % block_size`` tokens of that id's block, and the
  same id may appear as a full block in a later request.
- A `Conversation` is an ordered run of requests from one client; a sub-agent is a conversation of its own
  whose `parent` names the conversation that started it (its ids share the parent's namespace).
- Times: with ``clock == "conversation"`` (WEKA) `arrival_s` counts from the start of the conversation's
  root (each root starts at 0; how roots overlap is the replayer's choice); with ``clock == "global"``
  (Mooncake, our JSONL) from the start of the trace.

`TraceFormatError` is raised by every reader for unreadable or inconsistent input; it names the file.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Literal

import msgspec
import numpy as np

TraceFormat = Literal["weka", "mooncake", "jsonl"]
Clock = Literal["conversation", "global"]


class TraceFormatError(ValueError):
    """A trace file that cannot be read: `path` names it, the message says what is wrong."""

    def __init__(self, path: str, message: str) -> None:
        super().__init__(f"{path}: {message}")
        self.path = path
        self.message = message


class TraceRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One request of a trace. `block_ids` is read-only (see the module docstring for what ids mean)."""

    conversation: str
    parent: str | None  # the conversation that started this one (sub-agents); None for a root
    turn: int  # position in its conversation, from 0
    arrival_s: float
    input_tokens: int
    output_tokens: int
    block_ids: np.ndarray  # int64 [ceil(input_tokens / block_size)], read-only
    block_size: int
    think_s: float = 0.0  # client time between the previous response and this request (WEKA think_time)
    api_s: float = 0.0  # the original service's time for this request (WEKA api_time)
    messages: tuple[dict[str, Any], ...] | None = None  # OpenAI chat messages, when the trace has text
    tools: tuple[dict[str, Any], ...] | None = None  # OpenAI tool definitions sent with the messages

    @property
    def full_blocks(self) -> int:
        """How many of `block_ids` cover a whole block."""
        return self.input_tokens // self.block_size

    @property
    def tail_tokens(self) -> int:
        """Tokens in the last, partial block (0 when the input ends on a block boundary)."""
        return self.input_tokens % self.block_size


class Conversation(msgspec.Struct, frozen=True, kw_only=True):
    """An ordered run of requests from one client (a root conversation or a sub-agent)."""

    id: str
    parent: str | None
    start_s: float  # arrival of its first request on the trace's clock
    requests: tuple[TraceRequest, ...]
    shared_prefix_blocks: int = 0  # leading blocks made common to all conversations (0: none)


class Trace(msgspec.Struct, frozen=True, kw_only=True):
    """A whole trace: conversations in source order. Pure data; nothing mutates it."""

    name: str
    format: TraceFormat
    block_size: int
    clock: Clock
    conversations: tuple[Conversation, ...]

    @property
    def num_requests(self) -> int:
        return sum(len(c.requests) for c in self.conversations)

    @property
    def input_tokens(self) -> int:
        return sum(r.input_tokens for r in self.requests())

    def requests(self) -> Iterator[TraceRequest]:
        """Every request, conversation by conversation, in source order."""
        for conversation in self.conversations:
            yield from conversation.requests

    def roots(self) -> tuple[Conversation, ...]:
        """The conversations that no other conversation started."""
        return tuple(c for c in self.conversations if c.parent is None)

    def children(self, conversation_id: str) -> tuple[Conversation, ...]:
        """The sub-agent conversations started by `conversation_id`, in source order."""
        return tuple(c for c in self.conversations if c.parent == conversation_id)


def frozen_ids(ids: np.ndarray) -> np.ndarray:
    """`ids` as a read-only int64 array (copies only when the dtype differs). Mutates `ids`' write flag."""
    array = np.asarray(ids, dtype=np.int64)
    array.setflags(write=False)
    return array


def blocks_for(input_tokens: int, block_size: int) -> int:
    """Blocks needed to cover `input_tokens` (the last one may be partial)."""
    return -(-input_tokens // block_size)
