"""Pieces both OpenAI endpoints render: usage, finish reasons, logprobs, and the streaming error frame.

Everything here is pure (reads a finished or running `Generation`; decodes single tokens).
"""

from __future__ import annotations

from collections.abc import Sequence

from hybridcache.core.api import TokenLogprob
from hybridcache.core.tokenizer import Tokenizer
from hybridcache.http.chat_output import FinishKind
from hybridcache.http.errors import ApiError, error_body
from hybridcache.http.generation import Generation

_FINISH_REASONS: dict[str, str] = {"stop": "stop", "stop_string": "stop", "length": "length",
                                   "tool_calls": "tool_calls"}


def usage(run: Generation) -> dict[str, object]:
    """OpenAI's usage object; ``prompt_tokens_details.cached_tokens`` is the request's reuse_tokens."""
    return {
        "prompt_tokens": run.prompt_tokens,
        "completion_tokens": run.output_tokens,
        "total_tokens": run.prompt_tokens + run.output_tokens,
        "prompt_tokens_details": {"cached_tokens": run.reuse_tokens},
    }


def finish_reason(kind: FinishKind) -> str:
    return _FINISH_REASONS[kind]


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    return tokenizer.decode([token_id], skip_special_tokens=False)


def chat_logprobs(tokenizer: Tokenizer, logprobs: Sequence[TokenLogprob]) -> dict[str, object]:
    """Chat completions' ``logprobs``: ``{"content": [{token, logprob, bytes, top_logprobs}]}``."""
    return {"content": [_chat_entry(tokenizer, item) for item in logprobs]}


def _chat_entry(tokenizer: Tokenizer, item: TokenLogprob) -> dict[str, object]:
    text = token_text(tokenizer, item.token_id)
    return {
        "token": text,
        "logprob": item.logprob,
        "bytes": list(text.encode()),
        "top_logprobs": [
            _alternative(token_text(tokenizer, token_id), logprob) for token_id, logprob in item.top
        ],
    }


def _alternative(text: str, logprob: float) -> dict[str, object]:
    return {"token": text, "logprob": logprob, "bytes": list(text.encode())}


def completion_logprobs(tokenizer: Tokenizer, logprobs: Sequence[TokenLogprob],
                        text_offset: int = 0) -> dict[str, object]:
    """Legacy completions' ``logprobs``: parallel lists of tokens, logprobs, top alternatives, offsets."""
    tokens, offsets = [], []
    for item in logprobs:
        offsets.append(text_offset)
        text = token_text(tokenizer, item.token_id)
        tokens.append(text)
        text_offset += len(text)
    return {
        "tokens": tokens,
        "token_logprobs": [item.logprob for item in logprobs],
        "top_logprobs": [{token_text(tokenizer, token_id): logprob for token_id, logprob in item.top}
                         for item in logprobs],
        "text_offset": offsets,
    }


def stream_error(error: ApiError) -> dict[str, object]:
    """The frame sent when a stream fails after its headers: OpenAI's error envelope."""
    return error_body(error, "openai")
