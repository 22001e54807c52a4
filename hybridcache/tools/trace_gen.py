"""Generate a deterministic JSONL trace of chat requests with real text, for live runs against a server.

    hybridcache bench trace-gen --kind agent --seed 7 --out agent.jsonl [--scale 0.1]

The same kind, seed and scale always give the same bytes. Each line is one request in our JSONL trace
format (`hybridcache.tools.traces.jsonl`): conversation id, turn, arrival time (seconds from the start of
the trace), OpenAI chat `messages` (plus `tools` for agent-like kinds), `max_tokens`, `kind`, and `parent`
for sub-agent branches. Lines are ordered by arrival time (ties: conversation id, turn). A live client
sends a turn no earlier than its arrival time and after the previous turn of its conversation returned.
Text comes from a built-in word list; sizes are approximate tokens (~4 characters per token) and
`--scale` multiplies them (tests use small scales).

Kinds (each uses `random.Random(seed)` only; conversation starts follow a Poisson process, mean gap 15 s):

- ``chat``: 4 multi-turn chats (3-8 user turns). Assistant turns in history are plain answers: thinking is
  stripped on re-render, so a turn's prompt is not the previous prompt plus its output token for token.
- ``agent``: 2 tool loops (system prompt, task, then assistant tool calls and tool results of 500-4000
  tokens) whose prompts grow to 30k-100k tokens; each model call is one request.
- ``subagents``: a lead request on a 10k-30k-token preamble, then 4-16 branches (parent: the lead) whose
  2-3 turns alternate in time, every one starting with the exact same preamble.
- ``edits``: 2 chats of 6-10 turns; then one user message in the first half of the history is edited and
  the answer regenerated (the same messages with exactly that one changed), then one more turn on top.
- ``burst``: 8 one-turn conversations sending an identical 8k-16k-token prompt at the same moment.
- ``mixed``: 3 chats, 1 agent loop, 1 sub-agent group, 1 edited chat, 1 burst and 3 one-shot long
  documents (20k-60k tokens each, unique: nothing later reuses them, so they should not push reusable
  roots out of the cache), in a shuffled order with Poisson arrivals.
"""

from __future__ import annotations

import argparse
import random
import sys
from collections.abc import Callable
from pathlib import Path

from hybridcache.tools.traces import synth
from hybridcache.tools.traces.jsonl import TraceLine, encode_line

Builder = Callable[[random.Random, synth.Sizes, str, float], list[TraceLine]]

MEAN_START_GAP_S = 15.0
NEWLINE = b"\n"

UNIT_BUILDERS: dict[str, Builder] = {
    "chat": synth.chat,
    "agent": synth.agent,
    "subagents": synth.subagents,
    "edits": synth.edits,
    "burst": synth.burst,
    "document": synth.document,
}

KIND_UNITS: dict[str, tuple[str, ...]] = {
    "chat": ("chat",) * 4,
    "agent": ("agent",) * 2,
    "subagents": ("subagents",),
    "edits": ("edits",) * 2,
    "burst": ("burst",),
    "mixed": ("chat",) * 3 + ("agent", "subagents", "edits", "burst") + ("document",) * 3,
}

KINDS = tuple(KIND_UNITS)


def generate(kind: str, seed: int, scale: float = 1.0) -> list[TraceLine]:
    """The trace's lines in arrival order. Pure given its arguments; raises ValueError for an unknown kind
    or a non-positive scale."""
    if kind not in KIND_UNITS:
        raise ValueError(f"kind: unknown {kind!r}; choose one of {', '.join(KINDS)}")
    if not scale > 0:
        raise ValueError(f"scale: must be positive, got {scale}")
    rng = random.Random(seed)
    sizes = synth.Sizes(scale=scale)
    units = list(KIND_UNITS[kind])
    if kind == "mixed":
        rng.shuffle(units)
    lines: list[TraceLine] = []
    start = 0.0
    for number, unit in enumerate(units):
        lines.extend(UNIT_BUILDERS[unit](rng, sizes, f"{unit}-{number}", round(start, 3)))
        start += rng.expovariate(1.0 / MEAN_START_GAP_S)
    return sorted(lines, key=lambda line: (line.arrival_s, line.conversation, line.turn))


def render(lines: list[TraceLine]) -> bytes:
    """The JSONL bytes of `lines` (deterministic)."""
    return b"".join(encode_line(line) for line in lines)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Adds the trace-gen options to `parser` (mutates it)."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("--kind", required=True, choices=KINDS, help="which traffic to generate")
    parser.add_argument("--seed", type=int, default=0, help="random seed (same kind+seed: same bytes)")
    parser.add_argument("--scale", type=float, default=1.0, help="multiply every text size (default 1.0)")
    parser.add_argument("--out", type=Path, default=None, help="output file (default: standard output)")


def run(args: argparse.Namespace) -> int:
    """Writes the trace; prints a summary line to stderr when writing a file. Returns the exit status."""
    try:
        data = render(generate(args.kind, args.seed, args.scale))
    except ValueError as error:
        print(f"hybridcache bench trace-gen: {error}", file=sys.stderr)
        return 2
    if args.out is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return 0
    try:
        args.out.write_bytes(data)
    except OSError as error:
        print(f"hybridcache bench trace-gen: cannot write {args.out}: {error.strerror}", file=sys.stderr)
        return 1
    print(f"requests={data.count(NEWLINE)} bytes={len(data)} out={args.out}", file=sys.stderr)
    return 0
