"""Which cache entries reproduce a cold run bit for bit. Pure arithmetic on positions.

A lane's first ``exact_tokens`` positions were computed the way a cold prefill computes them: by the
row-tiled prefill, from an exact source. Positions after them came from decode steps (one-row products
and the recurrent rule), or from a source that was itself inexact, and differ from a cold run in the
last bits. Exact resumes (``PromptInput.exact_only``) use only exact entries.
"""

from __future__ import annotations

from hybridcache.cache.ids import BLOCK_TOKENS


def block_is_exact(block: int, exact_tokens: int | None) -> bool:
    """Whether block ``block`` of a lane whose first ``exact_tokens`` positions are exact holds a cold
    run's KV (None: every position is). Pure."""
    return exact_tokens is None or (block + 1) * BLOCK_TOKENS <= exact_tokens


def snapshot_is_exact(frontier: int, exact_tokens: int | None) -> bool:
    """Whether a resume from a tap the lane's prefill took at ``frontier`` reproduces a cold run bit for
    bit (None: the caller does not track exactness, as the simulator, and every snapshot counts as exact).
    Any position counts, inside a block too: a tap inside a block is captured inside the pass with the
    layer inputs since the block boundary (a pending tail), and the resumed pass recomputes that delta-rule
    sub-chunk whole, as a cold run does; a tap at a pass's end lies on a block boundary. Pure."""
    return exact_tokens is None or frontier <= exact_tokens


def endpoint_is_exact(frontier: int, exact_tokens: int | None) -> bool:
    """Whether the lane's own state at ``frontier``, taken as its endpoint, reproduces a cold run bit for
    bit. Only on a block boundary: the lane's state after its last pass or decode step is plain (no pending
    tail), so a resume inside a block would compute that block's delta-rule sub-chunk in two pieces where a
    cold run computes one. Pure."""
    if exact_tokens is None:
        return True
    return frontier % BLOCK_TOKENS == 0 and frontier <= exact_tokens
