"""The token-exact infinite-cache bound of a live replay, and how far a server's evaluation is from it.

A cache with unlimited room and a state snapshot after every token resumes a request at the longest
prefix its prompt shares with any prompt sent before it, but never past n − 1 (one token is always
computed). So per request

    bound = n − min(longest common prefix with an earlier prompt of the run, n − 1)   (at least 1)

`PrefixIndex` finds that prefix exactly, token for token: prompts are cut into 64-token blocks kept in a
tree (a node per distinct block path); a new prompt walks the tree over its full blocks, and inside the
first block it cannot follow, compares its tokens with every block that any earlier prompt had there
(full or partial). Cost is linear in the tokens sent, not in pairs of prompts.

`evaluated_vs_bound` is what the server computed (prompt − cached, from each reply's usage) over the
bound, per conversation and overall; a request is late when it evaluated more than bound + `SLACK_TOKENS`
(a 64-aligned resume point can cost up to 63 tokens more than the exact divergence point).
Pure, except that `PrefixIndex.add` mutates the index.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import NamedTuple

import numpy as np

BLOCK = 64
SLACK_TOKENS = 64


class PromptBound(NamedTuple):
    """One prompt's bound: `shared` tokens in common with the earlier prompt `shared_with` (None when no
    earlier prompt shares a token)."""

    key: Hashable
    prompt_tokens: int
    shared: int
    shared_with: Hashable | None
    bound: int


class _Node:
    """A block path seen in an earlier prompt: its children by full block, and the next blocks (full or
    the partial tail) that prompts through here had, each with the first prompt that had it."""

    __slots__ = ("children", "first", "next_blocks")

    def __init__(self, first: Hashable) -> None:
        self.children: dict[bytes, _Node] = {}
        self.next_blocks: dict[bytes, Hashable] = {}
        self.first = first


class PrefixIndex:
    """Every prompt sent so far, for longest-common-prefix queries. Mutated by `add`."""

    def __init__(self) -> None:
        self._root = _Node(None)

    def add(self, key: Hashable, tokens: Sequence[int] | np.ndarray) -> PromptBound:
        """The bound of `tokens` against the prompts added before, then add it. Mutates the index."""
        array = np.asarray(tokens, dtype=np.uint32)
        n = len(array)
        blocks = [array[i : i + BLOCK].tobytes() for i in range(0, n, BLOCK)]
        node, depth = self._root, 0
        while depth < len(blocks) and (child := node.children.get(blocks[depth])) is not None:
            node, depth = child, depth + 1
        shared, shared_with = depth * BLOCK, node.first if depth else None
        if depth < len(blocks):
            extra, owner = _longest_common(blocks[depth], node.next_blocks)
            if extra:
                shared, shared_with = shared + extra, owner
        shared = min(shared, n)
        self._insert(key, blocks)
        return PromptBound(key, n, shared, shared_with, max(1, n - min(shared, max(n - 1, 0))))

    def _insert(self, key: Hashable, blocks: list[bytes]) -> None:
        node = self._root
        for block in blocks:
            node.next_blocks.setdefault(block, key)
            if len(block) < BLOCK * 4:  # a partial tail ends the path
                return
            child = node.children.get(block)
            if child is None:
                child = node.children[block] = _Node(key)
            node = child


def _longest_common(block: bytes, others: dict[bytes, Hashable]) -> tuple[int, Hashable | None]:
    """The most leading tokens `block` shares with one of `others`, and that block's first prompt."""
    best, owner = 0, None
    mine = np.frombuffer(block, dtype=np.uint32)
    for other, first in others.items():
        theirs = np.frombuffer(other, dtype=np.uint32)
        limit = min(len(mine), len(theirs))
        equal = mine[:limit] == theirs[:limit]
        common = limit if equal.all() else int(np.argmin(equal))
        if common > best:
            best, owner = common, first
    return best, owner


def prompt_bounds(prompts: Sequence[tuple[Hashable, Sequence[int]]]) -> list[PromptBound]:
    """The bound of each prompt against those before it, in the order given (the order they were sent)."""
    index = PrefixIndex()
    return [index.add(key, tokens) for key, tokens in prompts]


class Evaluated(NamedTuple):
    """What the server did for one request: its prompt length and the tokens it reported as cached."""

    key: Hashable
    group: str  # the conversation it is summarized under
    prompt_tokens: int
    cached_tokens: int

    @property
    def evaluated(self) -> int:
        return self.prompt_tokens - self.cached_tokens


class LateResume(NamedTuple):
    """A request that evaluated more than bound + SLACK_TOKENS: where it resumed and where it could have."""

    key: Hashable
    prompt_tokens: int
    resumed_at: int
    diverges_at: int  # the longest common prefix: the nearest snapshot would have had to be here
    shared_with: Hashable | None
    evaluated: int
    bound: int


def bound_report(bounds: Sequence[PromptBound],
                 answered: Sequence[Evaluated]) -> tuple[dict[str, float | int], list[LateResume]]:
    """`bound_tokens`, `evaluated_tokens` and `evaluated_vs_bound` overall and per group (names
    `bound.<group>.…`), over the answered requests only, and the late ones in send order. Pure."""
    by_key = {b.key: b for b in bounds}
    totals: dict[str, list[int]] = {}
    late: list[LateResume] = []
    for request in answered:
        bound = by_key[request.key]
        for group in ("", request.group):
            pair = totals.setdefault(group, [0, 0])
            pair[0] += request.evaluated
            pair[1] += bound.bound
        if request.evaluated > bound.bound + SLACK_TOKENS:
            late.append(LateResume(request.key, request.prompt_tokens, request.cached_tokens, bound.shared,
                                   bound.shared_with, request.evaluated, bound.bound))
    summary: dict[str, float | int] = {}
    for group, (evaluated, bound_tokens) in sorted(totals.items()):
        prefix = f"bound.{group}." if group else ""
        summary[f"{prefix}bound_tokens"] = bound_tokens
        summary[f"{prefix}evaluated_tokens"] = evaluated
        summary[f"{prefix}evaluated_vs_bound"] = evaluated / bound_tokens if bound_tokens else float("nan")
    order = {b.key: i for i, b in enumerate(bounds)}
    late.sort(key=lambda r: order[r.key])
    return summary, late
