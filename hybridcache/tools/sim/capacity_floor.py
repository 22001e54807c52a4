"""The capacity floor: the fewest prompt tokens any cache of the same size could compute for the same
requests in the same admission order. A proven lower bound, where ``oracle`` (sim/oracle.py) is a
heuristic.

Relaxation. Keep only what every policy must obey: a full 64-token block can be reused by a request only if
its KV was held without a break since the previous request that held the block (a block is created only
by a request whose prompt or output holds it; blocks are named by chained hashes, so no other request
can recreate it), and at any moment at most ``K = device pages + host bytes // slab bytes`` distinct
blocks are held (a block on the device and on the host counts once). Everything else is dropped, which
only helps the cache: snapshots (their bytes, and that a resume needs a state at the resume point), the
pages of the running lanes, the order inside a block. Under this relaxation a run is a sequence of block
accesses (each admitted request's prompt blocks, then the blocks its output commits) served by a cache
of K equal-size blocks, where a request reusing a block must find it held.

For equal sizes and costs, with the choice of not caching at all, Belady's rule (on every overflow drop
the block whose next access is furthest away, the incoming one included) gives the fewest misses of any
policy; that holds for the accesses the real cache makes too, since any real run holds at most K blocks
at every step. A prompt block accessed before but missing costs its 64 tokens on top of the tokens past
the request's shared prefix (a request resumes at most at its first missing block, and every prompt
block accessed before lies in that shared prefix: hashes are chained). Output blocks are computed by the
decode whatever is held, so a miss there costs nothing; Belady minimizes misses over all accesses, so
those are subtracted by their count, the most any policy could have missed there:

    computed >= sum over requests of (prompt tokens - shared prefix) + 64 x (Belady misses - output
    accesses to blocks seen before)

and never less than the infinite-cache bound. The floor is a property of the admission order: a policy
that ran requests in another order (their durations depend on what it computed) has another floor.

Pure functions over numpy arrays; ``AccessLog`` collects the accesses of a run as it admits requests.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence

import msgspec
import numpy as np

from hybridcache.cache.ids import BLOCK_TOKENS

_NEVER = np.iinfo(np.int64).max


class CapacityFloor(msgspec.Struct, frozen=True, kw_only=True):
    """The floor of one admission order and its parts."""

    tokens: int  # the floor: no cache of ``capacity_blocks`` blocks computes fewer prompt tokens
    capacity_blocks: int  # K
    belady_misses: int  # accesses to blocks seen before that Belady's cache did not hold
    output_repeats: int  # output accesses to blocks seen before (subtracted from the misses)
    unshared_tokens: int  # sum of (prompt tokens - shared prefix): what an infinite cache computes


class AccessLog:
    """The block accesses of a run, in admission order. Mutated by ``record``."""

    def __init__(self) -> None:
        self._chunks: list[np.ndarray] = []
        self._prompt_blocks: list[int] = []

    def record(self, block_hashes: Sequence[int], prompt_blocks: int, committed_blocks: int) -> None:
        """One admitted request: the lookup hashes of its committed full blocks, the first
        ``prompt_blocks`` of them its prompt's. Mutates."""
        count = min(committed_blocks, len(block_hashes))
        self._chunks.append(np.fromiter(block_hashes[:count], dtype=np.uint64, count=count))
        self._prompt_blocks.append(min(prompt_blocks, count))

    def floor(self, capacity_blocks: int, unshared_tokens: int, bound_tokens: int) -> CapacityFloor:
        """The floor for a cache of ``capacity_blocks`` blocks. ``unshared_tokens``: the requests' prompt
        tokens past the longest prefix each shares with anything computed before it, and
        ``bound_tokens`` the infinite-cache bound (sim/bound.py). Pure."""
        lengths = np.fromiter((len(c) for c in self._chunks), dtype=np.int64, count=len(self._chunks))
        hashes = np.concatenate(self._chunks) if self._chunks else np.zeros(0, dtype=np.uint64)
        starts = np.cumsum(lengths) - lengths
        is_prompt = np.zeros(len(hashes), dtype=bool)
        for start, prompt in zip(starts.tolist(), self._prompt_blocks, strict=True):
            is_prompt[start : start + prompt] = True
        misses, repeats = belady_misses(hashes, is_prompt, capacity_blocks)
        tokens = max(bound_tokens, unshared_tokens + BLOCK_TOKENS * max(misses - repeats, 0))
        return CapacityFloor(
            tokens=tokens,
            capacity_blocks=capacity_blocks,
            belady_misses=misses,
            output_repeats=repeats,
            unshared_tokens=unshared_tokens,
        )


def next_access(ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """For each access, the position of the next access to the same block (``_NEVER`` if none), and
    whether it is the block's first access. Pure."""
    order = np.argsort(ids, kind="stable")
    sorted_ids = ids[order]
    same_as_next = np.zeros(len(ids), dtype=bool)
    same_as_next[:-1] = sorted_ids[1:] == sorted_ids[:-1]
    following = np.full(len(ids), _NEVER, dtype=np.int64)
    following[order[same_as_next]] = order[1:][same_as_next[:-1]]
    first = np.ones(len(ids), dtype=bool)
    first[order[1:][same_as_next[:-1]]] = False
    return following, first


def belady_misses(hashes: np.ndarray, is_prompt: np.ndarray, capacity_blocks: int) -> tuple[int, int]:
    """(misses of Belady's cache of ``capacity_blocks`` blocks on accesses to blocks seen before, output
    accesses to blocks seen before). Pure."""
    if len(hashes) == 0:
        return 0, 0
    _, ids = np.unique(hashes, return_inverse=True)
    following, first = next_access(ids.astype(np.int64))
    repeats = int(np.count_nonzero(~first & ~is_prompt))
    misses = _simulate_belady(ids.tolist(), following.tolist(), first.tolist(), capacity_blocks)
    return misses, repeats


def _simulate_belady(ids: list[int], following: list[int], first: list[bool], capacity: int) -> int:
    """Belady with bypass over one access sequence. Pure. The heap holds (-next access, block), stale
    entries skipped by comparing with ``due``; it is rebuilt when stale entries outnumber live ones."""
    never = int(_NEVER)
    due: dict[int, int] = {}  # held block -> its next access
    heap: list[tuple[int, int]] = []
    misses = 0
    push, pop = heapq.heappush, heapq.heappop
    for block, nxt, is_first in zip(ids, following, first, strict=True):
        if block in due:
            if nxt == never:
                del due[block]
                continue
            due[block] = nxt
            push(heap, (-nxt, block))
        else:
            if not is_first:
                misses += 1
            if nxt == never or capacity <= 0:
                continue
            due[block] = nxt
            push(heap, (-nxt, block))
            while len(due) > capacity:
                key, victim = pop(heap)
                if due.get(victim) == -key:
                    del due[victim]
        if len(heap) > 4 * capacity + 1024:
            heap = [(-when, held) for held, when in due.items()]
            heapq.heapify(heap)
    return misses
