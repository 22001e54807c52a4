"""The frontend: turns a request into a `PreparedPrompt`, off the worker (spec §5.1, §7.1, §8.3).

It renders the chat template, tokenizes, computes the chained block hashes under the request's extra
key (a digest of its cache salt), and finds the tap hints: message boundaries (each `<|im_start|>`), the
end of the leading system/tools block (structural), the start of the final generation opener, and the
ends of messages carrying a client cache breakpoint (explicit). Pure with respect to engine state.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import xxhash

from hybridcache.cache.hashing import block_hashes
from hybridcache.cache.records import pack_tokens
from hybridcache.cache.tap_planner import HintKind
from hybridcache.core.api import PreparedPrompt
from hybridcache.core.chat_template import ChatTemplate
from hybridcache.core.tokenizer import FrontendError, Tokenizer

MESSAGE_START = "<|im_start|>"
SALT_SEED = 0x5A17


def salt_key(cache_salt: str | None) -> int:
    """The block extra key of a cache salt: 0 without one, else a nonzero 64-bit digest. Pure."""
    if not cache_salt:
        return 0
    return xxhash.xxh3_64_intdigest(cache_salt.encode(), seed=SALT_SEED) or 1


class Frontend:
    """Prepares prompts for one checkpoint's tokenizer and chat template. Holds no request state."""

    def __init__(
        self, tokenizer: Tokenizer, template: ChatTemplate | None, max_model_len: int, vocab_size: int = 0
    ) -> None:
        self.tokenizer = tokenizer
        self.template = template
        self.max_model_len = max_model_len
        self.vocab_size = max(vocab_size, tokenizer.vocab_size)  # the model's (padded) vocabulary
        self._message_start = tokenizer.token_to_id(MESSAGE_START)

    @classmethod
    def from_dir(
        cls, model_dir: str | Path, max_model_len: int, tokenizer: Tokenizer | None = None
    ) -> Frontend:
        """Load the tokenizer (unless the caller has it loaded, as the engine does) and, if present, the
        chat template. Raises FrontendError naming the file."""
        tokenizer = Tokenizer.from_dir(model_dir) if tokenizer is None else tokenizer
        try:
            template = ChatTemplate.from_dir(model_dir)
        except FrontendError:
            template = None
        return cls(tokenizer, template, max_model_len, _model_vocab_size(Path(model_dir)))

    def render_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        template_kwargs: Mapping[str, Any] | None = None,
    ) -> str:
        if self.template is None:
            raise FrontendError("this checkpoint has no chat template; use /v1/completions")
        return self.template.render(
            messages, tools, add_generation_prompt=add_generation_prompt, **dict(template_kwargs or {})
        )

    def prepare_chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        *,
        add_generation_prompt: bool = True,
        template_kwargs: Mapping[str, Any] | None = None,
        cache_salt: str | None = None,
        breakpoints: Sequence[int] = (),
        prefix_reuse: bool = True,
    ) -> PreparedPrompt:
        """Render, tokenize and hash a chat request. Raises FrontendError on input the template rejects.

        `breakpoints` are indices of messages that end at a client cache breakpoint.
        """
        if not messages:
            raise FrontendError("messages must not be empty")
        text = self.render_chat(
            messages, tools, add_generation_prompt=add_generation_prompt, template_kwargs=template_kwargs
        )
        token_ids = self.tokenizer.encode(text)
        hints = self._chat_hints(token_ids, bool(tools) or messages[0].get("role") in ("system", "developer"))
        if add_generation_prompt:
            hints += self._opener_hint(token_ids)
        for index in sorted(set(breakpoints)):
            if not 0 <= index < len(messages):
                raise FrontendError(f"breakpoint on message {index}, but there are {len(messages)} messages")
            prefix = self.render_chat(
                messages[: index + 1], tools, add_generation_prompt=False, template_kwargs=template_kwargs
            )
            position = _common_prefix_length(self.tokenizer.encode(prefix), token_ids)
            if position > 0:
                hints.append((position, int(HintKind.EXPLICIT)))
        return self._prepared(token_ids, cache_salt, hints, prefix_reuse)

    def prepare_tokens(
        self, token_ids: Sequence[int], cache_salt: str | None = None, prefix_reuse: bool = True
    ) -> PreparedPrompt:
        """A raw token prompt (hints: its message starts, if it uses the chat format)."""
        vocab = self.vocab_size
        for token in token_ids:
            if not 0 <= token < vocab:
                raise FrontendError(f"token id {token} is outside the vocabulary (0..{vocab - 1})")
        return self._prepared(list(token_ids), cache_salt, self._chat_hints(token_ids, False), prefix_reuse)

    def prepare_text(
        self, text: str, cache_salt: str | None = None, prefix_reuse: bool = True
    ) -> PreparedPrompt:
        """A plain-text prompt, tokenized as is."""
        token_ids = self.tokenizer.encode(text)
        return self._prepared(token_ids, cache_salt, self._chat_hints(token_ids, False), prefix_reuse)

    def _prepared(
        self,
        token_ids: Sequence[int],
        cache_salt: str | None,
        hints: list[tuple[int, int]],
        prefix_reuse: bool,
    ) -> PreparedPrompt:
        if not token_ids:
            raise FrontendError("the prompt is empty after tokenization")
        extra = salt_key(cache_salt)
        full_blocks = len(token_ids) // 64
        hashes = block_hashes(token_ids, [extra] * full_blocks if extra else None)
        n = len(token_ids)
        unique = sorted({(p, k) for p, k in hints if 0 < p < n})
        return PreparedPrompt(
            token_ids=tuple(token_ids),
            block_hashes=tuple(hashes),
            extra_key=extra,
            token_bytes=pack_tokens(token_ids),
            tap_hints=tuple(unique),
            prefix_reuse=prefix_reuse,
        )

    def _message_starts(self, token_ids: Sequence[int]) -> list[int]:
        if self._message_start is None:
            return []
        start = self._message_start
        return [i for i, token in enumerate(token_ids) if token == start]

    def _chat_hints(self, token_ids: Sequence[int], leading_block: bool) -> list[tuple[int, int]]:
        starts = self._message_starts(token_ids)
        hints = [(p, int(HintKind.MESSAGE)) for p in starts if p > 0]
        if leading_block and len(starts) > 1:
            hints.append((starts[1], int(HintKind.STRUCTURAL)))  # end of the system/tools block
        return hints

    def _opener_hint(self, token_ids: Sequence[int]) -> list[tuple[int, int]]:
        starts = self._message_starts(token_ids)
        return [(starts[-1], int(HintKind.OPENER))] if starts and starts[-1] > 0 else []


def _model_vocab_size(model_dir: Path) -> int:
    """`vocab_size` of config.json (or its text_config); 0 when unreadable (the tokenizer's then counts)."""
    try:
        raw = json.loads((model_dir / "config.json").read_text())
    except (OSError, ValueError):
        return 0
    text = raw.get("text_config") or raw
    size = text.get("vocab_size", raw.get("vocab_size", 0))
    return size if isinstance(size, int) else 0


def _common_prefix_length(a: Sequence[int], b: Sequence[int]) -> int:
    length = 0
    for x, y in zip(a, b):
        if x != y:
            break
        length += 1
    return length
