"""Reader for the WEKA Claude-Code traces: one JSON conversation per file, 64-token block ids.

A file holds `block_size`, `hash_id_scope` ("local": ids are scoped to the file; sub-agents share it),
`tool_tokens`, `system_tokens` and `requests`; each request has `t` (s from the conversation start),
`type` ("n" or "s" for a request of this conversation, "subagent" for an entry that nests a sub-agent's
own `requests`, timed from the sub-agent's start `t`), `in` / `out` (tokens), `hash_ids`, `api_time`,
`think_time`. Unknown fields are ignored.

Normalization (see `model.py` for what the records promise):

- Every file gets its own range of global ids; sub-agents are conversations named ``"<file id>/<agent
  id>"`` whose `parent` is the file's conversation, ids in the same range.
- The traces list ``in // block_size`` ids (full blocks only). A request whose `in` ends mid-block gets one
  more id for its tail: the id the next request of the same conversation has at that position when that
  request extends this one block for block (its prompt continues this one, so its block starts with this
  tail); otherwise a fresh id private to this request.
- ``shared_prefix=True`` makes the first ``(tool_tokens + system_tokens) // block_size`` blocks of each
  conversation common to all conversations (the tool and system prompt is the same for every Claude Code
  session in production; local ids cannot show it). Roots share one prefix; sub-agents share one per
  `subagent_type`. The ids that the first request has at those positions are replaced everywhere in the
  file by position-indexed common ids (the root's first: an id already in the root's prefix stays there).
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np

from hybridcache.tools.traces.ids import IdSpace
from hybridcache.tools.traces.model import Conversation, TraceFormatError, TraceRequest, frozen_ids

REQUEST_TYPES = frozenset({"n", "s"})
SUBAGENT_TYPE = "subagent"
ROOT_PREFIX_KEY = "weka:root"


class WekaRequest(msgspec.Struct):
    t: float = 0.0
    type: str = "n"
    input_tokens: int = msgspec.field(name="in", default=0)
    out: int = 0
    hash_ids: list[int] = msgspec.field(default_factory=list)
    api_time: float | None = None
    think_time: float | None = None
    agent_id: str = ""  # sub-agent entries only, from here on
    subagent_type: str = ""
    tool_tokens: int = 0
    system_tokens: int = 0
    requests: list[WekaRequest] = msgspec.field(default_factory=list)


class WekaFile(msgspec.Struct):
    block_size: int
    requests: list[WekaRequest]
    id: str = ""
    hash_id_scope: str = "local"
    tool_tokens: int = 0
    system_tokens: int = 0


class _RawConversation(msgspec.Struct):
    """A conversation before id remapping: local ids, tails not yet filled."""

    id: str
    parent: str | None
    start_s: float
    prefix_key: str
    prefix_tokens: int
    requests: list[WekaRequest]


_DECODER = msgspec.json.Decoder(WekaFile)


def read_weka(path: Path, data: bytes, ids: IdSpace, *, shared_prefix: bool) -> list[Conversation]:
    """The conversations of one WEKA file. Mutates `ids` (reserves the file's id range).

    Raises TraceFormatError for malformed JSON, an unsupported id scope or inconsistent block counts.
    """
    try:
        file = _DECODER.decode(data)
    except msgspec.DecodeError as error:
        raise TraceFormatError(str(path), f"not a WEKA trace file: {error}") from None
    if file.hash_id_scope != "local":
        raise TraceFormatError(str(path), f"hash_id_scope {file.hash_id_scope!r} unsupported (only 'local')")
    if file.block_size <= 0:
        raise TraceFormatError(str(path), f"block_size must be positive, got {file.block_size}")
    root = _RawConversation(file.id or path.stem, None, 0.0, ROOT_PREFIX_KEY,
                            file.tool_tokens + file.system_tokens, [])
    raws = [root, *_split(path, root, file.requests)]
    return _normalize(path, raws, file.block_size, ids, shared_prefix)


def _split(path: Path, conversation: _RawConversation, entries: list[WekaRequest]) -> list[_RawConversation]:
    """Mutates `conversation.requests`; returns the sub-agent conversations nested in `entries`."""
    nested: list[_RawConversation] = []
    for entry in entries:
        if entry.type in REQUEST_TYPES:
            conversation.requests.append(entry)
        elif entry.type == SUBAGENT_TYPE:
            name = entry.agent_id or f"subagent{len(nested)}"
            child = _RawConversation(f"{conversation.id}/{name}", conversation.id,
                                     conversation.start_s + entry.t, f"weka:subagent:{entry.subagent_type}",
                                     entry.tool_tokens + entry.system_tokens, [])
            nested.append(child)
            nested.extend(_split(path, child, entry.requests))
        else:
            raise TraceFormatError(str(path), f"unknown request type {entry.type!r}")
    return nested


def _normalize(path: Path, raws: list[_RawConversation], block_size: int, ids: IdSpace,
               shared_prefix: bool) -> list[Conversation]:
    local = [[_local_ids(path, r, block_size) for r in raw.requests] for raw in raws]
    next_private = 1 + max((int(a.max()) for run in local for a in run if len(a)), default=-1)
    for raw, run in zip(raws, local):
        next_private = _fill_tails(raw.requests, run, block_size, next_private)
    offset = ids.reserve(next_private)
    lookup = np.arange(offset, offset + next_private, dtype=np.int64)
    prefixes = [_prefix_blocks(raw, run, block_size) if shared_prefix else 0 for raw, run in zip(raws, local)]
    made_common = np.zeros(next_private, dtype=bool)
    for raw, run, blocks in zip(raws, local, prefixes):
        if blocks:
            own = ~made_common[run[0][:blocks]]  # an id in an earlier conversation's prefix keeps its id
            lookup[run[0][:blocks][own]] = ids.common_prefix(raw.prefix_key, blocks)[own]
            made_common[run[0][:blocks]] = True
    return [_conversation(raw, [lookup[a] for a in run], block_size, blocks)
            for raw, run, blocks in zip(raws, local, prefixes)]


def _local_ids(path: Path, request: WekaRequest, block_size: int) -> np.ndarray:
    array = np.array(request.hash_ids, dtype=np.int64)
    full, remainder = divmod(request.input_tokens, block_size)
    needed = full + (remainder > 0)
    if len(array) not in (full, needed) or request.input_tokens < 0 or (len(array) and array.min() < 0):
        raise TraceFormatError(str(path), f"request at t={request.t} has {len(array)} hash ids for "
                               f"{request.input_tokens} tokens of {block_size}-token blocks")
    return array


def _fill_tails(requests: list[WekaRequest], run: list[np.ndarray], block_size: int,
                next_private: int) -> int:
    """Mutates `run`: appends a tail id where a request ends mid-block. Returns the next private id."""
    for turn, request in enumerate(requests):
        if len(run[turn]) * block_size >= request.input_tokens:
            continue
        ids = run[turn]
        following = run[turn + 1] if turn + 1 < len(run) else None
        if following is not None and len(following) > len(ids) and np.array_equal(following[:len(ids)], ids):
            tail = following[len(ids)]
        else:
            tail, next_private = next_private, next_private + 1
        run[turn] = np.append(ids, np.int64(tail))
    return next_private


def _prefix_blocks(raw: _RawConversation, run: list[np.ndarray], block_size: int) -> int:
    if not run:
        return 0
    return min(raw.prefix_tokens // block_size, raw.requests[0].input_tokens // block_size)


def _conversation(raw: _RawConversation, block_ids: list[np.ndarray], block_size: int,
                  prefix_blocks: int) -> Conversation:
    requests = tuple(
        TraceRequest(conversation=raw.id, parent=raw.parent, turn=turn, arrival_s=raw.start_s + r.t,
                     input_tokens=r.input_tokens, output_tokens=r.out, block_ids=frozen_ids(ids),
                     block_size=block_size, think_s=r.think_time or 0.0, api_s=r.api_time or 0.0)
        for turn, (r, ids) in enumerate(zip(raw.requests, block_ids)))
    start = requests[0].arrival_s if requests else raw.start_s
    return Conversation(id=raw.id, parent=raw.parent, start_s=start, requests=requests,
                        shared_prefix_blocks=prefix_blocks)
