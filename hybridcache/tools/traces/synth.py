"""Builders for generated traces: each makes one unit (a conversation or a group of them) as `TraceLine`s.

Every builder takes the kind's `random.Random` (and consumes it deterministically), a `Sizes` (token
counts scaled for tests) and the unit's name and start time, and returns lines in turn order per
conversation. Messages are OpenAI chat messages with keys in a fixed order; assistant turns in history
carry only `content` (and `tool_calls`): no reasoning, as a thinking model's template re-renders them.
`trace_gen.py` documents the kinds these builders make up.
"""

from __future__ import annotations

import random
from typing import Any, NamedTuple

import msgspec

from hybridcache.tools.traces.jsonl import TraceLine
from hybridcache.tools.traces.words import CHARS_PER_TOKEN, TOOL_NAMES, code, file_path, log_lines, prose

Message = dict[str, Any]
BURST_COPIES = 8
BRANCH_STAGGER_S = 0.25  # between the branches of one sub-agent round
_ENCODER = msgspec.json.Encoder()


class Sizes(NamedTuple):
    """Token sizes of the generated text, multiplied by `scale` (never below `floor` tokens)."""

    scale: float = 1.0
    floor: int = 8

    def tokens(self, rng: random.Random, low: int, high: int) -> int:
        return max(self.floor, round(rng.randint(low, high) * self.scale))


def tool_definitions() -> list[dict[str, Any]]:
    """The OpenAI tool definitions agent-like kinds send (fixed)."""
    return [{"type": "function", "function": {
        "name": name, "description": f"{name.replace('_', ' ')} in the workspace",
        "parameters": {"type": "object", "properties": {"target": {"type": "string"}},
                       "required": ["target"]}}} for name in TOOL_NAMES]


def approx_tokens(messages: list[Message]) -> int:
    """~4 characters per token over the JSON of the messages."""
    return sum(len(_ENCODER.encode(m)) for m in messages) // CHARS_PER_TOKEN


def chat(rng: random.Random, sizes: Sizes, name: str, start_s: float) -> list[TraceLine]:
    """A multi-turn chat: 3-8 user turns; history assistant turns are plain answers (no reasoning)."""
    messages: list[Message] = [{"role": "system", "content": prose(rng, sizes.tokens(rng, 30, 120))}]
    lines = []
    arrival = start_s
    for turn in range(rng.randint(3, 8)):
        messages.append({"role": "user", "content": prose(rng, sizes.tokens(rng, 20, 300))})
        lines.append(_line(name, turn, arrival, messages, 256, "chat"))
        messages.append({"role": "assistant", "content": prose(rng, sizes.tokens(rng, 40, 250))})
        arrival += _gap(rng)
    return lines


def agent(rng: random.Random, sizes: Sizes, name: str, start_s: float) -> list[TraceLine]:
    """A tool loop: one task, then tool calls and results until the prompt reaches 30k-100k tokens."""
    target = sizes.tokens(rng, 30_000, 100_000)
    messages: list[Message] = [{"role": "system", "content": prose(rng, sizes.tokens(rng, 300, 900))},
                               {"role": "user", "content": prose(rng, sizes.tokens(rng, 40, 200))}]
    tools = tool_definitions()
    lines = [_line(name, 0, start_s, messages, 192, "agent", tools)]
    arrival = start_s
    while approx_tokens(messages) < target:
        messages.extend(_tool_round(rng, sizes, f"{name}-{len(lines)}", 500, 4000))
        arrival += _gap(rng)
        lines.append(_line(name, len(lines), arrival, messages, 192, "agent", tools))
    return lines


def subagents(rng: random.Random, sizes: Sizes, name: str, start_s: float) -> list[TraceLine]:
    """A lead request on a 10k-30k-token preamble, then 4-16 alternating branches on the same preamble."""
    preamble = {"role": "system", "content": prose(rng, sizes.tokens(rng, 5_000, 15_000)) + "\n\n"
                + code(rng, sizes.tokens(rng, 5_000, 15_000))}
    tools = tool_definitions()
    lead = [preamble, {"role": "user", "content": prose(rng, sizes.tokens(rng, 60, 200))}]
    lines = [_line(name, 0, start_s, lead, 192, "subagents", tools)]
    branches = [[preamble, {"role": "user", "content": prose(rng, sizes.tokens(rng, 30, 120))}]
                for _ in range(rng.randint(4, 16))]
    arrival = start_s + _gap(rng)
    for round_index in range(rng.randint(2, 3)):
        for number, history in enumerate(branches):
            if round_index:
                history.extend(_tool_round(rng, sizes, f"{name}-b{number}-{round_index}", 200, 1500))
            branch = f"{name}/branch-{number}"
            lines.append(_line(branch, round_index, round(arrival + BRANCH_STAGGER_S * number, 3), history,
                               192, "subagents", tools, parent=name))
        arrival += BRANCH_STAGGER_S * len(branches) + _gap(rng)  # a round ends before the next begins
    return lines


def edits(rng: random.Random, sizes: Sizes, name: str, start_s: float) -> list[TraceLine]:
    """A chat of 6-10 turns, then one user message in the first half of history edited and the answer
    regenerated (same messages, exactly that one changed), then one more turn on the edited history."""
    lines = chat_with_turns(rng, sizes, name, start_s, rng.randint(6, 10))
    last = lines[-1]
    messages = [dict(m) for m in last.messages or []]
    users = [i for i, m in enumerate(messages[: len(messages) // 2]) if m["role"] == "user"]
    edited = rng.choice(users)
    messages[edited] = {"role": "user", "content": prose(rng, sizes.tokens(rng, 20, 300))}
    arrival = last.arrival_s + _gap(rng)
    lines.append(_line(name, last.turn + 1, arrival, messages, 256, "edits"))
    messages = [*messages, {"role": "assistant", "content": prose(rng, sizes.tokens(rng, 40, 250))},
                {"role": "user", "content": prose(rng, sizes.tokens(rng, 20, 300))}]
    lines.append(_line(name, last.turn + 2, arrival + _gap(rng), messages, 256, "edits"))
    return lines


def chat_with_turns(rng: random.Random, sizes: Sizes, name: str, start_s: float,
                    turns: int) -> list[TraceLine]:
    """A plain chat of exactly `turns` user turns (kind "edits")."""
    messages: list[Message] = [{"role": "system", "content": prose(rng, sizes.tokens(rng, 30, 120))}]
    lines = []
    arrival = start_s
    for turn in range(turns):
        messages.append({"role": "user", "content": prose(rng, sizes.tokens(rng, 20, 300))})
        lines.append(_line(name, turn, arrival, messages, 256, "edits"))
        messages.append({"role": "assistant", "content": prose(rng, sizes.tokens(rng, 40, 250))})
        arrival += _gap(rng)
    return lines


def burst(rng: random.Random, sizes: Sizes, name: str, start_s: float) -> list[TraceLine]:
    """Eight one-turn conversations sending the same 8k-16k-token prompt at the same moment."""
    messages = [{"role": "system", "content": prose(rng, sizes.tokens(rng, 30, 120))},
                {"role": "user", "content": code(rng, sizes.tokens(rng, 8_000, 16_000)) + "\n\n"
                 + prose(rng, sizes.tokens(rng, 20, 60))}]
    return [_line(f"{name}-{copy}", 0, start_s, messages, 128, "burst") for copy in range(BURST_COPIES)]


def document(rng: random.Random, sizes: Sizes, name: str, start_s: float) -> list[TraceLine]:
    """A one-shot question over a long, unique 20k-60k-token document (nothing to reuse later)."""
    text = log_lines(rng, sizes.tokens(rng, 20_000, 60_000))
    messages = [{"role": "user", "content": text + "\n\n" + prose(rng, sizes.tokens(rng, 20, 60))}]
    return [_line(name, 0, start_s, messages, 128, "document")]


def _tool_round(rng: random.Random, sizes: Sizes, call_id: str, low: int, high: int) -> list[Message]:
    """An assistant tool call and its result (`low`-`high` tokens of file, log or search text)."""
    tool = rng.choice(("read_file", "run_command", "search_code", "edit_file"))
    target = file_path(rng)
    call = {"id": f"call_{call_id}", "type": "function",
            "function": {"name": tool, "arguments": _ENCODER.encode({"target": target}).decode()}}
    size = sizes.tokens(rng, low, high)
    result = code(rng, size) if tool in ("read_file", "edit_file") else (
        log_lines(rng, size) if tool == "run_command" else prose(rng, size))
    return [{"role": "assistant", "content": prose(rng, sizes.tokens(rng, 10, 40)), "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": result}]


def _line(conversation: str, turn: int, arrival_s: float, messages: list[Message], max_tokens: int,
          kind: str, tools: list[dict[str, Any]] | None = None, parent: str | None = None) -> TraceLine:
    return TraceLine(conversation=conversation, turn=turn, arrival_s=round(arrival_s, 3),
                     max_tokens=max_tokens, parent=parent, kind=kind, messages=list(messages), tools=tools)


def _gap(rng: random.Random) -> float:
    """Seconds between two turns of one conversation: response time plus client think time."""
    return round(rng.uniform(2.0, 12.0), 3)
