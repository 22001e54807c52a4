"""How a prefill is cut into passes, and where FLEXIBLE (ladder) taps land on them. Pure.

A pass runs ``chunk`` tokens from where the last one ended; one that does not end the prompt ends on a
block boundary, so the next starts there (a pass that starts inside a block would compute that block's
delta-rule sub-chunk in two pieces, and its rows would differ from a cold run's in the last bits); an exact
tap ends a pass.

A FLEXIBLE tap lands at the end of the pass that reaches it, or at the start of the final pass when it lies
in that one: it costs no split. Its landing is computed for passes of a fixed length (the engine's tap pass
length, 2048 unless ``--prefill-chunk`` is given), not for the passes the engine actually runs, so a CPU's
shorter passes leave the same snapshots as a GPU's; a landing inside an actual pass is captured there like
an INNER tap. Landed on 512-token passes instead, the ladder rungs of the live replay of four WEKA
conversations (``bench trace``, `tiny`) sat up to 1,024 tokens lower, and it evaluated 1.019x the bound
instead of 1.008x.
"""

from __future__ import annotations

from collections.abc import Sequence

from hybridcache.cache.ids import BLOCK_TOKENS


def pass_end(start: int, n: int, chunk: int, exact: Sequence[int]) -> int:
    """End of the pass of a prompt of ``n`` tokens that starts at ``start`` (see the module note)."""
    end = min(start + chunk, n)
    if end < n and end % BLOCK_TOKENS and end - end % BLOCK_TOKENS > start:
        end -= end % BLOCK_TOKENS
    return min((p for p in exact if start < p < end), default=end)


def flexible_landings(
    flexible: Sequence[int], exact: Sequence[int], base: int, n: int, chunk: int
) -> list[int]:
    """Where the FLEXIBLE taps at ``flexible`` land on passes of ``chunk`` tokens from ``base`` (see the
    module note), sorted and without repeats; one that would land at ``base`` or at ``n`` is dropped."""
    landings: set[int] = set()
    pending = sorted(p for p in flexible if p > base)
    start, next_tap = base, 0
    while start < n and next_tap < len(pending):
        end = pass_end(start, n, chunk, exact)
        frontier = start if end == n else end
        while next_tap < len(pending) and pending[next_tap] <= end:
            if base < frontier < n:
                landings.add(frontier)
            next_tap += 1
        start = end
    return sorted(landings)
