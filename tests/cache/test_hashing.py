"""Block lookup hashes (spec §5.1): a chain over full 64-token blocks, with media extras in the key."""

import struct

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridcache.cache.hashing import HASH_SEED, block_hash, block_hashes
from hybridcache.cache.ids import BLOCK_TOKENS

token_ids = st.integers(min_value=0, max_value=2**32 - 1)


def prompt_of(num_tokens: int, start: int = 0) -> list[int]:
    """A deterministic prompt of `num_tokens` distinct-ish token ids."""
    return [(start + 7919 * i) % 151_936 for i in range(num_tokens)]


def folded(tokens: list[int], extras: list[int] | None = None) -> list[int]:
    """The reference chain: block_hash folded block by block from HASH_SEED."""
    hashes, prev = [], HASH_SEED
    for block in range(len(tokens) // BLOCK_TOKENS):
        extra = 0 if extras is None else extras[block]
        prev = block_hash(prev, tokens[block * BLOCK_TOKENS : (block + 1) * BLOCK_TOKENS], extra)
        hashes.append(prev)
    return hashes


def test_a_record_is_prev_tokens_extra_little_endian_under_the_fixed_seed():
    tokens = list(range(BLOCK_TOKENS))
    record = struct.pack("<Q", 12345) + struct.pack(f"<{BLOCK_TOKENS}I", *tokens) + struct.pack("<Q", 9)
    assert block_hash(12345, tokens, 9) == xxhash.xxh3_64_intdigest(record, HASH_SEED)


def test_known_value_is_pinned_across_runs_and_versions():
    # Persisted caches key on these values: changing the layout or the seed must fail this test.
    assert HASH_SEED == 0x6879_6272_6964_6331
    assert block_hashes(list(range(BLOCK_TOKENS))) == [0x472391ABE13C9624]


def test_one_hash_per_full_block_and_the_partial_block_is_ignored():
    tokens = prompt_of(3 * BLOCK_TOKENS + 17)
    hashes = block_hashes(tokens)
    assert len(hashes) == 3
    assert hashes == block_hashes(tokens[: 3 * BLOCK_TOKENS])
    assert block_hashes(prompt_of(BLOCK_TOKENS - 1)) == []


def test_hashes_chain_so_an_early_difference_changes_every_later_block():
    tokens = prompt_of(4 * BLOCK_TOKENS)
    edited = list(tokens)
    edited[5] += 1
    original, changed = block_hashes(tokens), block_hashes(edited)
    assert all(a != b for a, b in zip(original, changed))


def test_a_late_difference_keeps_the_shared_prefix_hashes():
    tokens = prompt_of(4 * BLOCK_TOKENS)
    edited = list(tokens)
    edited[2 * BLOCK_TOKENS + 3] += 1
    original, changed = block_hashes(tokens), block_hashes(edited)
    assert original[:2] == changed[:2]
    assert original[2] != changed[2] and original[3] != changed[3]


def test_extras_change_the_hash_of_their_block_and_everything_after():
    tokens = prompt_of(3 * BLOCK_TOKENS)
    plain = block_hashes(tokens)
    with_media = block_hashes(tokens, [0, 0xDEADBEEF, 0])
    assert with_media[0] == plain[0]
    assert with_media[1] != plain[1] and with_media[2] != plain[2]
    assert block_hashes(tokens, [0, 0, 0]) == plain


def test_too_few_extras_and_out_of_range_values_are_rejected():
    tokens = prompt_of(2 * BLOCK_TOKENS)
    with pytest.raises(ValueError, match="extras"):
        block_hashes(tokens, [0])
    with pytest.raises(ValueError, match="uint32"):
        block_hashes([-1] * BLOCK_TOKENS)
    with pytest.raises(ValueError, match="uint32"):
        block_hash(HASH_SEED, [2**32])
    with pytest.raises(ValueError, match="extra"):
        block_hash(HASH_SEED, [1], extra=2**64)


@settings(max_examples=60, deadline=None)
@given(
    tokens=st.lists(token_ids, max_size=5 * BLOCK_TOKENS),
    extras=st.lists(st.integers(min_value=0, max_value=2**64 - 1), min_size=5, max_size=5),
)
def test_the_fast_path_equals_the_folded_reference(tokens, extras):
    assert block_hashes(tokens) == folded(tokens)
    assert block_hashes(tokens, extras) == folded(tokens, extras)


def test_any_int_sequence_hashes_like_a_list():
    tokens = prompt_of(2 * BLOCK_TOKENS)
    assert block_hashes(tuple(tokens)) == block_hashes(tokens)
    assert block_hashes(range(2 * BLOCK_TOKENS)) == block_hashes(list(range(2 * BLOCK_TOKENS)))
