"""Where the tokens a simulated cache computes beyond the infinite-cache bound come from.

A request's excess is ``computed - bound``: it resumed at ``base`` where a cache with a state at every
position would have resumed at its divergence point ``d = n - bound`` (its longest prefix shared with
anything earlier, bound.py). Every excess token lies in ``(base, d]`` and is charged to one cause:

- **capacity** (``excess_capacity_tokens``): ``(base, s]``, where ``s`` is the deepest snapshot ever
  published at or before ``d`` on this prompt's path. The cache once held a state there and evicted it
  (host room, device slots or supersession): keeping more would have saved them.
- **no snapshot near the divergence point** (``excess_placement_tokens``): ``(max(base, s), d]``. No
  snapshot was ever taken closer to where this request diverges: placement (taps, hedges, endpoints),
  not capacity, decides them.

Snapshots are keyed by the chained lookup hash of their anchor block plus their tail tokens (the same
prefix gives the same key), recorded as they are published. Mutable; ``published`` every snapshot,
``charge`` every request in admission order.
"""

from __future__ import annotations

from hybridcache.cache.ids import BLOCK_TOKENS
from hybridcache.tools.sim.material import RequestMaterial


class ExcessSplit:
    """Every snapshot key ever published, and the running split. Mutated by its methods."""

    def __init__(self) -> None:
        self._tails: dict[int, set[tuple[int, ...]]] = {}  # anchor lookup hash -> tails published there
        self.capacity_tokens = 0
        self.placement_tokens = 0
        self.capacity_requests = 0  # requests with a capacity share
        self.placement_requests = 0  # requests with a placement share

    def published(self, anchor_hash: int, tail: tuple[int, ...]) -> None:
        """Record a snapshot anchored after the block whose lookup hash is ``anchor_hash``."""
        self._tails.setdefault(anchor_hash, set()).add(tuple(tail))

    def charge(self, material: RequestMaterial, computed: int, bound: int) -> None:
        """Split one request's excess (``computed`` tokens against its ``bound``) between the causes."""
        excess = computed - bound
        if excess <= 0:
            return
        n = material.prompt_tokens
        base, divergence = n - computed, n - bound
        deepest = self._deepest_published(material, base, divergence)
        capacity = max(deepest - base, 0)
        self.capacity_tokens += capacity
        self.placement_tokens += excess - capacity
        self.capacity_requests += capacity > 0
        self.placement_requests += excess > capacity

    def _deepest_published(self, material: RequestMaterial, base: int, divergence: int) -> int:
        """The deepest frontier in (base, divergence] at which a snapshot of this path was ever published;
        ``base`` when none was."""
        hashes, tokens = material.block_hashes, material.tokens
        block = min(divergence // BLOCK_TOKENS, len(hashes)) - 1
        while block >= 0 and BLOCK_TOKENS * (block + 1) > base:
            tails = self._tails.get(int(hashes[block]))
            if tails:
                start = BLOCK_TOKENS * (block + 1)
                best = -1
                for tail in tails:
                    end = start + len(tail)
                    if end <= divergence and len(tail) > best and tuple(tokens[start:end].tolist()) == tail:
                        best = len(tail)
                if best >= 0:
                    return start + best
            block -= 1
        return base
