"""Token expansion: block ids to deterministic token ids, lengths exact.

Each block id maps to `block_size` tokens by a counter-based hash (splitmix64 of id, position and salt):
the same id gives the same tokens in every request and conversation, different ids give unrelated
tokens, and a request that ends mid-block gets the first ``input_tokens % block_size`` tokens of its last
id. Ids are global within a `Trace` (readers remap scoped ids), so sharing follows the trace exactly:
local WEKA ids stay per conversation unless the shared prefix was made common at load time.

Tokens fall in ``[low, vocab_size)``; pass the first special-token id as `vocab_size` to keep special
tokens out of the prompts. Pure functions; vectorized with numpy.
"""

from __future__ import annotations

import numpy as np

from hybridcache.tools.traces.model import TraceRequest

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)


def expand_tokens(request: TraceRequest, vocab_size: int, *, low: int = 0, salt: int = 0) -> list[int]:
    """Exactly `request.input_tokens` token ids in [low, vocab_size). Raises ValueError for an empty range."""
    return expand_token_array(request.block_ids, request.block_size, request.input_tokens, vocab_size,
                              low=low, salt=salt).tolist()


def expand_token_array(block_ids: np.ndarray, block_size: int, length: int, vocab_size: int, *,
                       low: int = 0, salt: int = 0) -> np.ndarray:
    """The first `length` tokens of `block_ids` expanded (int64 array). Pure.

    Raises ValueError when [low, vocab_size) is empty or `block_ids` cover fewer than `length` tokens.
    """
    if vocab_size <= low or low < 0:
        raise ValueError(f"vocab_size: the token range [{low}, {vocab_size}) is empty")
    if length > len(block_ids) * block_size or length < 0:
        raise ValueError(f"length: {len(block_ids)} blocks of {block_size} cannot give {length} tokens")
    ids = np.asarray(block_ids, dtype=np.int64).astype(np.uint64)
    positions = np.arange(block_size, dtype=np.uint64)
    with np.errstate(over="ignore"):
        mixed = _splitmix((ids * _GOLDEN)[:, None] + positions[None, :] + np.uint64(salt & (2**64 - 1)))
    tokens = (mixed % np.uint64(vocab_size - low)).astype(np.int64) + low
    return tokens.reshape(-1)[:length]


def _splitmix(values: np.ndarray) -> np.ndarray:
    values = values + _GOLDEN
    values = (values ^ (values >> np.uint64(30))) * _MIX_1
    values = (values ^ (values >> np.uint64(27))) * _MIX_2
    return values ^ (values >> np.uint64(31))
