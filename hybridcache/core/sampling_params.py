"""Per-request sampling parameters, validated once when a request is built.

`SamplingParams` is a frozen msgspec Struct: constructing one with an invalid value raises `ValueError`
whose message starts with the field's name (``"top_p: must be in (0, 1], got 0"``), so the HTTP layer can
map it to the request field at fault. Nothing here mutates anything.

Conventions (the sampler in `gpu/sampler.py` implements them):

- ``temperature == 0`` is greedy decoding (argmax); top-k/top-p/min-p and the seed are then unused.
- ``top_k == 0`` disables top-k (the Hugging Face convention); ``top_p == 1`` and ``min_p == 0`` disable
  theirs.
- ``repetition_penalty`` has Hugging Face semantics over prompt and output tokens; ``presence_penalty`` and
  ``frequency_penalty`` have OpenAI semantics over output tokens only.
- ``seed`` set: the request gets its own generator seeded with it (same seed, same tokens). Unset: the
  request's generator is seeded from the engine-level generator.
- Stop token ids and end-of-sequence handling belong to the caller (see `gpu.sampler.is_stop`);
  ``ignore_eos`` keeps generating past the model's end-of-sequence tokens (not past ``stop_token_ids``).
- ``logit_bias`` (OpenAI's): (token id, bias) pairs, each bias in [-100, 100] added to that token's logit
  after the penalties and before greedy or sampled choice; logprobs are those of the biased logits. The
  caller checks the ids against the vocabulary (the HTTP layer does, against the tokenizer's).
- ``logprobs`` asks for the chosen token's log-probability; ``top_logprobs`` (0..20) for the n most
  likely alternatives as well, and needs ``logprobs``.
"""

from __future__ import annotations

import math

import msgspec

MAX_TOP_LOGPROBS = 20
PENALTY_LIMIT = 2.0
LOGIT_BIAS_LIMIT = 100.0
MAX_SEED = 2**63 - 1


class SamplingParams(msgspec.Struct, frozen=True, kw_only=True):
    """How one request picks its tokens. Raises `ValueError` (field named first) when invalid."""

    max_tokens: int = 256
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0 disables top-k
    min_p: float = 0.0
    seed: int | None = None  # None: seeded from the engine-level generator
    repetition_penalty: float = 1.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    stop_token_ids: tuple[int, ...] = ()
    logprobs: bool = False
    top_logprobs: int = 0
    ignore_eos: bool = False
    logit_bias: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        _check_int("max_tokens", self.max_tokens, low=1)
        _check_float("temperature", self.temperature, low=0.0, high=None)
        _check_float("top_p", self.top_p, low=0.0, high=1.0, low_open=True)
        _check_int("top_k", self.top_k, low=0)
        _check_float("min_p", self.min_p, low=0.0, high=1.0)
        if self.seed is not None:
            _check_int("seed", self.seed, low=0, high=MAX_SEED)
        _check_float("repetition_penalty", self.repetition_penalty, low=0.0, high=None, low_open=True)
        _check_float("presence_penalty", self.presence_penalty, low=-PENALTY_LIMIT, high=PENALTY_LIMIT)
        _check_float("frequency_penalty", self.frequency_penalty, low=-PENALTY_LIMIT, high=PENALTY_LIMIT)
        for token in self.stop_token_ids:
            _check_int("stop_token_ids", token, low=0)
        for token, bias in self.logit_bias:
            _check_int("logit_bias", token, low=0)
            _check_float("logit_bias", bias, low=-LOGIT_BIAS_LIMIT, high=LOGIT_BIAS_LIMIT)
        if len({token for token, _ in self.logit_bias}) != len(self.logit_bias):
            raise ValueError("logit_bias: a token id appears twice")
        _check_int("top_logprobs", self.top_logprobs, low=0, high=MAX_TOP_LOGPROBS)
        if self.top_logprobs > 0 and not self.logprobs:
            raise ValueError("top_logprobs: needs logprobs to be true")

    @property
    def greedy(self) -> bool:
        """True when the request decodes by argmax (temperature 0)."""
        return self.temperature == 0.0

    @property
    def uses_penalties(self) -> bool:
        """True when any of the repetition, presence or frequency penalties changes the logits."""
        return self.repetition_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0


def _check_int(field: str, value: object, *, low: int, high: int | None = None) -> None:
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"{field}: must be an integer, got {value!r}")
    if value < low or (high is not None and value > high):
        upper = "" if high is None else f" and <= {high}"
        raise ValueError(f"{field}: must be >= {low}{upper}, got {value}")


def _check_float(
    field: str, value: object, *, low: float, high: float | None, low_open: bool = False
) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise ValueError(f"{field}: must be a finite number, got {value!r}")
    below = value <= low if low_open else value < low
    if below or (high is not None and value > high):
        left = "(" if low_open else "["
        right = "inf)" if high is None else f"{high}]"
        raise ValueError(f"{field}: must be in {left}{low}, {right}, got {value}")
