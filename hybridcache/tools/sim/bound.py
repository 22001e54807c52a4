"""The infinite-cache bound: the fewest prompt tokens any cache could compute for the same requests.

A cache with unlimited room and a state snapshot at every position can resume a request at the longest
prefix it shares with any earlier sequence, but never past n - 1 (one token is always computed). The
earlier sequences are what the engine computed before: every earlier prompt, and with echo the output
each request generated (its committed tokens). So per request

    bound = n - min(longest prefix shared with an earlier committed sequence, n - 1)

Sharing is found per 64-token block: leading full blocks whose chained hash was seen (see material.py),
then, inside the first unseen block, the common tokens with the last (partial or full) block of an
earlier prompt or committed sequence under the same parent. A block in the middle of an earlier
sequence that a later prompt repeats only in part is not credited: the bound may count up to 63 such
tokens too many for that request, but no cache resume point can sit there either, because every
snapshot inside a block lies in the last block of a prompt (the prompt-tail tap) or of a committed
sequence (the endpoint); all others are 64-aligned.

``literal_tokens`` keeps the issue's plainer definition alongside: prompt tokens in blocks whose prefix
of prompt blocks never appeared in an earlier prompt, plus one per request. With echo our cache can
beat it (the endpoint covers output tokens no earlier prompt held).

Mutable: ``observe`` each request in admission order.
"""

from __future__ import annotations

import numpy as np

from hybridcache.cache.ids import BLOCK_TOKENS
from hybridcache.tools.sim.material import RequestMaterial

_ROOT_PARENT = -1


class InfiniteCacheBound:
    """Running totals of the bound. Mutated by ``observe``."""

    def __init__(self) -> None:
        self.tokens = 0
        self.literal_tokens = 0
        self.unshared_tokens = 0  # the same without the n - 1 cap (sim/capacity_floor.py builds on it)
        self._seen_blocks: set[int] = set()
        self._last_blocks: dict[int, list[bytes]] = {}
        self._seen_prompt_blocks: set[int] = set()
        self._seen_prompt_tails: set[tuple[int, bytes]] = set()

    def observe(self, material: RequestMaterial) -> int:
        """Add one request (in admission order); returns its bound tokens. Mutates the totals."""
        n = material.prompt_tokens
        shared = self._shared_prefix(material)
        bound = n - min(shared, n - 1)
        self.tokens += bound
        self.unshared_tokens += n - shared
        self.literal_tokens += self._literal(material)
        self._record(material)
        return bound

    def _shared_prefix(self, material: RequestMaterial) -> int:
        n = material.prompt_tokens
        hashes = material.block_hashes
        seen = self._seen_blocks
        full = n // BLOCK_TOKENS
        block = 0
        while block < full and hashes[block] in seen:
            block += 1
        start = block * BLOCK_TOKENS
        if start >= n:
            return n
        parent = hashes[block - 1] if block else _ROOT_PARENT
        candidates = self._last_blocks.get(parent)
        if not candidates:
            return start
        wanted = material.tokens[start : min(start + BLOCK_TOKENS, n)].astype("<u4").tobytes()
        return start + max(_common_tokens(wanted, other) for other in candidates)

    def _record(self, material: RequestMaterial) -> None:
        committed = material.committed_tokens
        self._seen_blocks.update(material.block_hashes[: committed // BLOCK_TOKENS])
        self._record_last_block(material, material.prompt_tokens)
        self._record_last_block(material, committed)

    def _record_last_block(self, material: RequestMaterial, length: int) -> None:
        """Keep the last block of ``material.tokens[:length]`` (where a snapshot may sit inside it)."""
        last = (length - 1) // BLOCK_TOKENS
        if length <= 0:
            return
        parent = material.block_hashes[last - 1] if last else _ROOT_PARENT
        start = last * BLOCK_TOKENS
        packed = material.tokens[start:length].astype("<u4").tobytes()
        bucket = self._last_blocks.setdefault(parent, [])
        if packed not in bucket:
            bucket.append(packed)

    def _literal(self, material: RequestMaterial) -> int:
        n = material.prompt_tokens
        full = n // BLOCK_TOKENS
        hashes = material.block_hashes[:full]
        new_blocks = sum(1 for h in hashes if h not in self._seen_prompt_blocks)
        self._seen_prompt_blocks.update(hashes)
        tail_tokens = n - full * BLOCK_TOKENS
        new_tail = 0
        if tail_tokens:
            parent = hashes[-1] if full else _ROOT_PARENT
            key = (parent, material.tokens[full * BLOCK_TOKENS : n].astype("<u4").tobytes())
            if key not in self._seen_prompt_tails:
                self._seen_prompt_tails.add(key)
                new_tail = tail_tokens
        return new_blocks * BLOCK_TOKENS + new_tail + 1


def _common_tokens(left: bytes, right: bytes) -> int:
    """Leading equal uint32 tokens of two packed blocks. Pure."""
    limit = min(len(left), len(right)) // 4
    if left[: 4 * limit] == right[: 4 * limit]:
        return limit
    a = np.frombuffer(left, dtype="<u4", count=limit)
    b = np.frombuffer(right, dtype="<u4", count=limit)
    return int(np.argmin(a == b))
