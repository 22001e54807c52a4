"""Block lookup hashes (spec §5.1).

``lookup_hash(b) = xxh3_64(lookup_hash(b-1) || tokens[64b:64b+64] || extra(b))`` with
``lookup_hash(-1) = HASH_SEED``. The hash only selects a child in the parent's child map; a hit always
compares tokens and extra exactly, so a collision can cost a miss but never a false hit.

Byte layout of one hashed record (all little-endian):

    previous hash   8 bytes, uint64
    tokens          4 bytes each, uint32 (a block is 64 tokens, 256 bytes)
    extra           8 bytes, uint64 (the media key; 0 when no media overlaps the block)

The xxh3 seed is ``HASH_SEED`` as well. Both are fixed forever: persisted caches key on these values.
Everything here is pure; nothing mutates shared state.
"""

import sys
from array import array
from collections.abc import Sequence

import xxhash

from hybridcache.cache.ids import BLOCK_TOKENS

HASH_SEED: int = 0x6879_6272_6964_6331
"""Chain start (``lookup_hash(-1)``) and xxh3 seed; ASCII "hybridc1". Never change: persisted keys use it."""

_U64_MASK = (1 << 64) - 1
_TOKEN_BYTES = 4
_BLOCK_BYTES = BLOCK_TOKENS * _TOKEN_BYTES


def _token_bytes(tokens: Sequence[int]) -> bytes:
    """Tokens as packed little-endian uint32. Raises ValueError for a token outside [0, 2**32)."""
    try:
        packed = array("I", tokens)
    except OverflowError as exc:
        raise ValueError(f"token ids must fit in uint32: {exc}") from None
    if packed.itemsize != _TOKEN_BYTES:  # pragma: no cover - platforms where C int is not 32-bit
        packed = array("L", tokens)
        if packed.itemsize != _TOKEN_BYTES:
            raise RuntimeError("no 32-bit unsigned array type on this platform")
    if sys.byteorder == "big":  # pragma: no cover - little-endian everywhere we run
        packed.byteswap()
    return packed.tobytes()


def _u64(value: int, what: str) -> bytes:
    if not 0 <= value <= _U64_MASK:
        raise ValueError(f"{what} must fit in uint64, got {value}")
    return value.to_bytes(8, "little")


def block_hash(prev_hash: int, tokens: Sequence[int], extra: int = 0) -> int:
    """The lookup hash of one block after ``prev_hash``; pure.

    ``tokens`` is usually one full block of 64 tokens, but any length is hashed as given.
    Raises ValueError when a token, ``prev_hash`` or ``extra`` does not fit its unsigned width.
    """
    record = _u64(prev_hash, "prev_hash") + _token_bytes(tokens) + _u64(extra, "extra")
    return xxhash.xxh3_64_intdigest(record, HASH_SEED)


def block_hashes(tokens: Sequence[int], extras: Sequence[int] | None = None) -> list[int]:
    """The chained lookup hash of every FULL 64-token block of ``tokens``; pure.

    A trailing partial block is ignored. ``extras`` gives each full block's extra key (media key) and
    must then hold at least one value per full block; ``None`` means 0 for every block.
    Raises ValueError for out-of-range tokens or extras, or when ``extras`` is too short.
    Equivalent to folding ``block_hash`` from ``HASH_SEED``, but packs the tokens once.
    """
    num_blocks = len(tokens) // BLOCK_TOKENS
    if extras is not None and len(extras) < num_blocks:
        raise ValueError(f"extras holds {len(extras)} values for {num_blocks} full blocks")
    packed = memoryview(_token_bytes(tokens[: num_blocks * BLOCK_TOKENS]))
    digest = xxhash.xxh3_64_intdigest
    seed = HASH_SEED
    zero_extra = bytes(8)
    hashes: list[int] = []
    prev = seed
    for block in range(num_blocks):
        start = block * _BLOCK_BYTES
        extra_bytes = zero_extra if extras is None else _u64(extras[block], "extra")
        record = b"".join((prev.to_bytes(8, "little"), packed[start : start + _BLOCK_BYTES], extra_bytes))
        prev = digest(record, seed)
        hashes.append(prev)
    return hashes
