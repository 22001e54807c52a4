"""What one simulated request feeds the cache: its tokens, packed prompt bytes and block lookup hashes.

A trace request's block ids expand into deterministic tokens (`expand_token_array`: the same id gives the
same tokens), so reuse is found by exact token comparison, as in the engine. The request then "generates"
``max(output_tokens, 1)`` tokens:

- with echo (``assume_echo`` and the next request of its conversation extends this one block for block
  and is at least as long as prompt + output), the generated tokens are the next prompt's tokens at those
  positions: the client echoed the output, so this request's endpoint is a valid resume point there;
- otherwise fresh tokens nobody else has (a per-request salt), so decode blocks and the endpoint are
  never reused.

The engine commits prompt + generated minus the last sampled token (it is never computed).

Lookup hashes: the simulator does not use the engine's xxh3 chain (a Python loop per block); it chains a
vectorized 64-bit fingerprint of each 64-token block, ``H_b = P * H_(b-1) + f_b (mod 2^64)``, then mixes
it. Equal token prefixes give equal hashes, which is all the index needs: it compares tokens exactly,
so a collision could only cost a miss. Pure functions over numpy arrays.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import overload

import msgspec
import numpy as np

from hybridcache.cache.ids import BLOCK_TOKENS
from hybridcache.tools.traces import TraceRequest, expand_token_array

VOCAB_SIZE = 151_643  # Qwen's first special token id: expanded tokens stay ordinary text tokens
FRESH_SALT_BASE = 0x5EED_0000_0000
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX_1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX_2 = np.uint64(0x94D049BB133111EB)
_CHAIN_P = 0x100000001B3  # odd, so invertible mod 2^64
_CHAIN_SEED = 0x6879627269646331
_U64 = 1 << 64


class TokenView(Sequence[int]):
    """A read-only view of an int64 token array that hands out Python ints (slices as lists).

    The index slices prompts (tails, new blocks) but never walks them whole, so converting on demand
    avoids building a Python list of every token of every request.
    """

    __slots__ = ("_array",)

    def __init__(self, array: np.ndarray) -> None:
        self._array = array

    def __len__(self) -> int:
        return len(self._array)

    @overload
    def __getitem__(self, index: int) -> int: ...
    @overload
    def __getitem__(self, index: slice) -> list[int]: ...
    def __getitem__(self, index):
        if isinstance(index, slice):
            return self._array[index].tolist()
        return int(self._array[index])


class RequestMaterial(msgspec.Struct, frozen=True, kw_only=True):
    """Tokens and hashes of one request. ``tokens`` holds prompt + generated (read-only int64)."""

    tokens: np.ndarray
    prompt_tokens: int
    generated_tokens: int
    echoed: bool
    block_hashes: list[int]  # one per full block of ``tokens``
    prompt_bytes: bytes  # the prompt as packed uint32 little-endian (PromptInput.token_bytes)

    @property
    def committed_tokens(self) -> int:
        """Tokens the engine computes: every one but the last sampled token."""
        return self.prompt_tokens + self.generated_tokens - 1


def _splitmix(values: np.ndarray) -> np.ndarray:
    values = values + _GOLDEN
    values = (values ^ (values >> np.uint64(30))) * _MIX_1
    values = (values ^ (values >> np.uint64(27))) * _MIX_2
    return values ^ (values >> np.uint64(31))


def chain_hashes(tokens: np.ndarray) -> np.ndarray:
    """Lookup hashes (uint64) of every full 64-token block of ``tokens``, chained from the start. Pure."""
    blocks = len(tokens) // BLOCK_TOKENS
    if blocks == 0:
        return np.zeros(0, dtype=np.uint64)
    positions = np.arange(BLOCK_TOKENS, dtype=np.uint64) * _GOLDEN
    grid = tokens[: blocks * BLOCK_TOKENS].astype(np.uint64).reshape(blocks, BLOCK_TOKENS)
    with np.errstate(over="ignore"):
        fingerprints = _splitmix(grid + positions[None, :]).sum(axis=1, dtype=np.uint64)
        powers = _powers(_CHAIN_P, blocks + 1)
        inverse = _powers(pow(_CHAIN_P, -1, _U64), blocks)
        running = np.cumsum(fingerprints * inverse, dtype=np.uint64)
        chained = powers[:-1] * running + powers[1:] * np.uint64(_CHAIN_SEED)
        return _splitmix(chained)


def _powers(base: int, count: int) -> np.ndarray:
    """base^0 .. base^(count-1) mod 2^64."""
    factors = np.full(count, base, dtype=np.uint64)
    factors[0] = 1
    with np.errstate(over="ignore"):
        return np.cumprod(factors, dtype=np.uint64)


def echoes_into(request: TraceRequest, following: TraceRequest | None) -> bool:
    """Whether ``following`` extends ``request`` block for block and holds its whole output. Pure."""
    if following is None:
        return False
    ids, later = request.block_ids, following.block_ids
    if len(later) < len(ids) or not np.array_equal(later[: len(ids)], ids):
        return False
    return following.input_tokens >= request.input_tokens + generated_count(request)


def generated_count(request: TraceRequest) -> int:
    """Tokens the simulated request generates: its output length, at least one (the first sample)."""
    return max(request.output_tokens, 1)


def build_material(
    request: TraceRequest, following: TraceRequest | None, assume_echo: bool, fresh_salt: int
) -> RequestMaterial:
    """The material of ``request`` (``following``: the next request of its conversation). Pure.

    ``fresh_salt`` must differ between requests: it seeds the tokens of an output nobody echoes.
    """
    size, prompt = request.block_size, request.input_tokens
    generated = generated_count(request)
    echoed = assume_echo and echoes_into(request, following)
    if echoed:
        assert following is not None
        tokens = expand_token_array(following.block_ids, size, prompt + generated, VOCAB_SIZE)
    else:
        head = expand_token_array(request.block_ids, size, prompt, VOCAB_SIZE)
        fresh_ids = np.arange(-(-generated // size), dtype=np.int64)
        tail = expand_token_array(fresh_ids, size, generated, VOCAB_SIZE, salt=FRESH_SALT_BASE + fresh_salt)
        tokens = np.concatenate([head, tail])
    tokens.setflags(write=False)
    return RequestMaterial(
        tokens=tokens,
        prompt_tokens=prompt,
        generated_tokens=generated,
        echoed=echoed,
        block_hashes=chain_hashes(tokens).tolist(),
        prompt_bytes=tokens[:prompt].astype("<u4").tobytes(),
    )
