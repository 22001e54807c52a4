"""What `bench trace` sends: a trace's requests chosen, capped, and turned into request bodies.

- Message traces (our JSONL with `messages`, as `bench trace-gen` writes) become chat completions with
  those messages and tools.
- Block-id traces (WEKA, Mooncake, our JSONL block form) become completions whose prompt is token ids:
  each block id expanded deterministically (`traces.expand`: same id, same tokens) into the token range
  the caller gives (ordinary tokens of the served model's tokenizer), capped at `max_prompt_tokens`.
  Capping keeps a prompt's first tokens, so prefixes shared in the trace stay shared.

`--max-requests N` keeps the first N requests in the order the trace sends them, never a turn without
the turns before it: on a global clock (Mooncake, our JSONL) by arrival time across all conversations;
on a per-conversation clock (WEKA) root by root in source order (each root with its sub-agents), since
WEKA roots carry no common clock. On a per-conversation clock a root and its sub-agents form one
`PlannedConversation` (the root's id), their requests inline in trace order: a sub-agent's requests go
where the trace has them, between its parent's, as the client that ran them sent them. Pure functions;
nothing here mutates its inputs.
"""

from __future__ import annotations

import heapq
from typing import Any, Literal, NamedTuple

import msgspec

from hybridcache.tools.traces import Trace, TraceRequest, expand_token_array

Endpoint = Literal["chat", "completion"]


class PlanLimits(NamedTuple):
    max_requests: int | None  # None: every request
    max_prompt_tokens: int  # token-id prompts only
    max_output_tokens: int


class PlannedRequest(msgspec.Struct, frozen=True, kw_only=True):
    """One request as it goes on the wire (exactly one of `messages` and `prompt_token_ids` is set)."""

    conversation: str
    turn: int
    arrival_s: float  # on the trace's clock (see `ReplayPlan.clock`)
    think_s: float  # client time after the previous reply of the conversation
    max_tokens: int
    messages: tuple[dict[str, Any], ...] | None = None
    tools: tuple[dict[str, Any], ...] | None = None
    prompt_token_ids: tuple[int, ...] | None = None

    @property
    def endpoint(self) -> Endpoint:
        return "chat" if self.messages is not None else "completion"


class PlannedConversation(NamedTuple):
    id: str
    requests: tuple[PlannedRequest, ...]


class ReplayPlan(NamedTuple):
    """The chosen requests by conversation (source order), and notes on what was changed or dropped."""

    conversations: tuple[PlannedConversation, ...]
    endpoint: Endpoint
    notes: tuple[str, ...]

    @property
    def num_requests(self) -> int:
        return sum(len(c.requests) for c in self.conversations)


def plan_replay(trace: Trace, limits: PlanLimits, token_range: tuple[int, int] | None) -> ReplayPlan:
    """The requests to send for `trace` under `limits`. Pure.

    `token_range` ([low, high) ordinary token ids) is needed for block-id traces. Raises ValueError for
    a trace that mixes message and block-id requests, a block-id trace without `token_range`, or
    limits below 1."""
    if min(limits.max_prompt_tokens, limits.max_output_tokens, limits.max_requests or 1) < 1:
        raise ValueError("--max-requests, --max-prompt-tokens and --max-output-tokens must be at least 1")
    chosen = select_requests(trace, limits.max_requests)
    with_text = sum(r.messages is not None for r in chosen)
    if 0 < with_text < len(chosen):
        raise ValueError("the trace mixes requests with messages and requests with only block ids")
    endpoint: Endpoint = "chat" if chosen and with_text == len(chosen) else "completion"
    if endpoint == "completion" and token_range is None:
        raise ValueError("a block-id trace needs a token range (the served model's tokenizer)")
    notes = _selection_notes(trace, len(chosen), limits)
    planned = [_planned(r, limits, token_range) for r in chosen]
    output_capped = sum(r.output_tokens > limits.max_output_tokens for r in chosen)
    if output_capped:
        notes.append(f"output capped at {limits.max_output_tokens} tokens ({output_capped} of {len(chosen)} "
                     "requests; --max-output-tokens)")
    prompt_capped = sum(r.input_tokens > limits.max_prompt_tokens for r in chosen)
    if endpoint == "completion" and prompt_capped:
        notes.append(f"token-id prompts capped at their first {limits.max_prompt_tokens} tokens "
                     f"({prompt_capped} of {len(chosen)} requests; --max-prompt-tokens)")
    return ReplayPlan(_group(planned, _lane_of(trace)), endpoint, tuple(notes))


def select_requests(trace: Trace, max_requests: int | None) -> list[TraceRequest]:
    """The first `max_requests` requests in sending order, each conversation a prefix of its turns
    (see the module docstring). Pure; returns them in that order."""
    rank = _root_ranks(trace)
    heap: list[tuple[tuple[int, float, int, int], int]] = []
    for index, conversation in enumerate(trace.conversations):
        if conversation.requests:
            heap.append((_key(rank, index, conversation.requests[0], 0.0), index))
    heapq.heapify(heap)
    position = [0] * len(trace.conversations)
    chosen: list[TraceRequest] = []
    limit = trace.num_requests if max_requests is None else max_requests
    while heap and len(chosen) < limit:
        (_, latest, _, _), index = heapq.heappop(heap)
        requests = trace.conversations[index].requests
        chosen.append(requests[position[index]])
        position[index] += 1
        if position[index] < len(requests):
            heapq.heappush(heap, (_key(rank, index, requests[position[index]], latest), index))
    return chosen


def _key(rank: dict[str, int], index: int, request: TraceRequest,
         latest: float) -> tuple[int, float, int, int]:
    """Sort key: root rank, arrival (never earlier than the turn before), conversation, turn."""
    return (rank[request.conversation], max(latest, request.arrival_s), index, request.turn)


def _root_ranks(trace: Trace) -> dict[str, int]:
    """Per conversation: 0 on a global clock; on a per-conversation clock, its root's source position."""
    if trace.clock == "global":
        return {c.id: 0 for c in trace.conversations}
    roots = {c.id: position for position, c in enumerate(trace.roots())}
    lane_of = _lane_of(trace)
    return {c.id: roots.get(lane_of[c.id], len(roots)) for c in trace.conversations}


def _planned(request: TraceRequest, limits: PlanLimits,
             token_range: tuple[int, int] | None) -> PlannedRequest:
    max_tokens = max(1, min(request.output_tokens, limits.max_output_tokens))
    common = {"conversation": request.conversation, "turn": request.turn, "arrival_s": request.arrival_s,
              "think_s": request.think_s, "max_tokens": max_tokens}
    if request.messages is not None:
        return PlannedRequest(**common, messages=request.messages, tools=request.tools)
    assert token_range is not None
    length = min(request.input_tokens, limits.max_prompt_tokens)
    tokens = expand_token_array(request.block_ids, request.block_size, length, token_range[1],
                                low=token_range[0])
    return PlannedRequest(**common, prompt_token_ids=tuple(tokens.tolist()))


def _lane_of(trace: Trace) -> dict[str, str]:
    """Conversation -> the conversation whose lane sends it: its root on a per-conversation clock (sub-agents
    inline), itself on a global clock."""
    if trace.clock == "global":
        return {c.id: c.id for c in trace.conversations}
    parents = {c.id: c.parent for c in trace.conversations}

    def root_of(name: str) -> str:
        seen: set[str] = set()
        while (parent := parents.get(name)) is not None and parent in parents and name not in seen:
            seen.add(name)
            name = parent
        return name

    return {c.id: root_of(c.id) for c in trace.conversations}


def _group(requests: list[PlannedRequest], lane_of: dict[str, str]) -> tuple[PlannedConversation, ...]:
    runs: dict[str, list[PlannedRequest]] = {}
    for request in requests:
        runs.setdefault(lane_of.get(request.conversation, request.conversation), []).append(request)
    return tuple(PlannedConversation(name, tuple(run)) for name, run in runs.items())


def _selection_notes(trace: Trace, chosen: int, limits: PlanLimits) -> list[str]:
    notes = [f"trace {trace.name}: format {trace.format}, {trace.num_requests} requests in "
             f"{len(trace.conversations)} conversations"]
    if chosen < trace.num_requests:
        notes.append(f"replaying the first {chosen} of {trace.num_requests} requests (--max-requests)")
    if trace.clock == "conversation":
        notes.append("per-conversation clock: every chosen root conversation starts at time 0")
    return notes
