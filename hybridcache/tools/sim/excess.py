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
prefix gives the same key), recorded as they are published. Only snapshots published before the request
was admitted count: the simulator prefills a request inside its admission, so its own taps (one at its
divergence point, when a hint puts it there) are published before it is charged. Counting them charged
217,704 tokens of placement excess to capacity (whole WEKA set, 27B-INT8, 64 GiB, 8 users: 4,687,600 vs
4,469,896 capacity tokens; for example a conversation forking off another's prefix where that one had no
snapshot, then tapping the fork itself).
The capacity share is also split by how long the request's conversation had been idle (since its previous
request finished; a conversation's first request has no previous one). On the whole WEKA set (27B-INT8,
64 GiB, 8 users) 65 % of it went to requests whose conversation had been idle for more than 5 minutes, 35 %
to those idle for more than 30.

Mutable; ``admitting`` before each admission, ``published`` every snapshot, ``charge`` every admitted
request in admission order, ``settle`` for an admission that was not charged (blocked or dropped).
"""

from __future__ import annotations

from hybridcache.cache.ids import BLOCK_TOKENS
from hybridcache.tools.sim.material import RequestMaterial

IDLE_BUCKETS = ((300.0, "idle_under_5m"), (1800.0, "idle_5_to_30m"), (float("inf"), "idle_over_30m"))
"""Upper bounds (seconds) of the idle-time classes of ``capacity_by_idle``, with their names."""
FIRST_REQUEST = "first_request"


class ExcessSplit:
    """Every snapshot key ever published, and the running split. Mutated by its methods."""

    def __init__(self) -> None:
        self._tails: dict[int, set[tuple[int, ...]]] = {}  # anchor lookup hash -> tails published there
        self.capacity_tokens = 0
        self.placement_tokens = 0
        self.capacity_requests = 0  # requests with a capacity share
        self.placement_requests = 0  # requests with a placement share
        self.capacity_by_idle = dict.fromkeys([FIRST_REQUEST, *(name for _, name in IDLE_BUCKETS)], 0)
        self._admitting: list[tuple[int, tuple[int, ...]]] | None = None  # published during an admission

    def admitting(self) -> None:
        """A request is being admitted: what it publishes counts only after it is charged (or settled)."""
        self._admitting = []

    def published(self, anchor_hash: int, tail: tuple[int, ...]) -> None:
        """Record a snapshot anchored after the block whose lookup hash is ``anchor_hash``."""
        if self._admitting is not None:
            self._admitting.append((anchor_hash, tuple(tail)))
        else:
            self._tails.setdefault(anchor_hash, set()).add(tuple(tail))

    def settle(self) -> None:
        """The admission is over: record what it published."""
        held, self._admitting = self._admitting or [], None
        for anchor_hash, tail in held:
            self.published(anchor_hash, tail)

    def charge(
        self, material: RequestMaterial, computed: int, bound: int, idle_s: float | None = None
    ) -> None:
        """Split one request's excess (``computed`` tokens against its ``bound``) between the causes, by
        the snapshots published before its admission; then record its own (``settle``). ``idle_s``: how
        long its conversation had been idle (None for a conversation's first request)."""
        excess = computed - bound
        if excess > 0:
            self._split(material, computed, bound, excess, idle_s)
        self.settle()

    def _split(
        self, material: RequestMaterial, computed: int, bound: int, excess: int, idle_s: float | None
    ) -> None:
        n = material.prompt_tokens
        base, divergence = n - computed, n - bound
        deepest = self._deepest_published(material, base, divergence)
        capacity = max(deepest - base, 0)
        self.capacity_tokens += capacity
        self.capacity_by_idle[idle_class(idle_s)] += capacity
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


def idle_class(idle_s: float | None) -> str:
    """The ``capacity_by_idle`` class of a request whose conversation was idle ``idle_s`` seconds. Pure."""
    if idle_s is None:
        return FIRST_REQUEST
    return next(name for bound, name in IDLE_BUCKETS if idle_s < bound)
