"""The context-cost model that ranks admission sources and values snapshots (spec §6.2, §11.4).

``prefill_seconds(base, tokens)`` prices computing ``tokens`` new tokens after ``base`` cached ones:

    token_seconds · tokens                                   (weights, MLPs, GDN: linear in tokens)
  + pair_seconds  · (base · tokens + tokens · (tokens + 1) / 2)   (attention pairs: B·S + S(S+1)/2)
  + chunk_seconds · ceil(tokens / prefill_chunk_tokens)       (fixed cost of each forward pass)

``restore_seconds(nbytes)`` prices one host-to-device restore batch: ``nbytes / h2d_bytes_per_second``
plus a fixed ``restore_batch_seconds``. The model only ranks feasible choices; its absolute values need
not be accurate, only their ratios. Everything here is pure; instances are frozen.
"""

import math

import msgspec

_GENERIC = "generic"
_QWEN35_27B_RTX5090 = "qwen3.5-27b-rtx5090"


class CacheCostModel(msgspec.Struct, frozen=True, kw_only=True):
    """Prefill and restore coefficients. Construction raises ValueError for nonsensical values.

    token_seconds: seconds per prefilled token, independent of context (>= 0).
    pair_seconds: seconds per attention (query, key) pair (>= 0).
    chunk_seconds: fixed seconds per prefill forward pass (>= 0).
    prefill_chunk_tokens: tokens per prefill pass (> 0).
    h2d_bytes_per_second: host-to-device copy bandwidth (> 0).
    restore_batch_seconds: fixed latency of one restore batch (>= 0).
    """

    token_seconds: float
    pair_seconds: float
    chunk_seconds: float
    prefill_chunk_tokens: int
    h2d_bytes_per_second: float
    restore_batch_seconds: float

    def __post_init__(self) -> None:
        for name in ("token_seconds", "pair_seconds", "chunk_seconds", "restore_batch_seconds"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"{name} must be a finite non-negative number, got {value!r}")
        if not (math.isfinite(self.h2d_bytes_per_second) and self.h2d_bytes_per_second > 0):
            raise ValueError(f"h2d_bytes_per_second must be positive, got {self.h2d_bytes_per_second!r}")
        if self.prefill_chunk_tokens <= 0:
            raise ValueError(f"prefill_chunk_tokens must be positive, got {self.prefill_chunk_tokens!r}")

    @classmethod
    def default(cls) -> "CacheCostModel":
        """Generic, uncalibrated coefficients (the spec's "index's generic defaults").

        Round numbers for a mid-size model on one modern GPU: 10 k tok/s at short context, attention
        doubling the per-token cost near 100 k tokens of context, 5 ms per forward pass in 2048-token
        chunks, 20 GB/s host-to-device and 50 µs per restore batch. Only their ratios matter for ranking.
        """
        return cls(
            token_seconds=1.0e-4,
            pair_seconds=1.0e-9,
            chunk_seconds=5.0e-3,
            prefill_chunk_tokens=2048,
            h2d_bytes_per_second=20.0e9,
            restore_batch_seconds=50.0e-6,
        )

    @classmethod
    def qwen35_27b_rtx5090(cls, prefill_chunk_tokens: int = 2048) -> "CacheCostModel":
        """The spec §3 planning figures for a 27B Qwen3.5 on one RTX 5090.

        Origin of each number:
        - chunk_seconds 15 ms: spec Status, "an exact tap costs one prefill split (about 15 ms per turn
          on 27B)" — the fixed cost of one extra forward pass.
        - h2d 25 GB/s: spec §3.3, "restores move 24–27 GB/s" on the measuring machine (PCIe 5.0 x8); the
          design value for x16 is 50 GB/s.
        - token/pair split: spec §3.3 gives "100 k tokens ≈ 24 s" (≈ 4.2 k tok/s at ~121 k context). The
          spec does not split it; we ASSUME two thirds linear (16 s → 1.6e-4 s/token) and one third
          attention pairs (8 s over ~5e9 pairs → 1.6e-9 s/pair). Calibrate before trusting absolutes.
        - restore_batch_seconds 50 µs: an assumed launch + event latency per batch, not from the spec.
        - prefill_chunk_tokens: the engine's --prefill-chunk; 2048 is an assumed default.
        """
        return cls(
            token_seconds=1.6e-4,
            pair_seconds=1.6e-9,
            chunk_seconds=15.0e-3,
            prefill_chunk_tokens=prefill_chunk_tokens,
            h2d_bytes_per_second=25.0e9,
            restore_batch_seconds=50.0e-6,
        )

    @classmethod
    def preset(cls, name: str) -> "CacheCostModel":
        """The named preset (see ``preset_names()``). Raises ValueError for an unknown name."""
        if name == _GENERIC:
            return cls.default()
        if name == _QWEN35_27B_RTX5090:
            return cls.qwen35_27b_rtx5090()
        raise ValueError(f"unknown cost-model preset {name!r}; known: {', '.join(preset_names())}")

    def prefill_seconds(self, base: int, tokens: int) -> float:
        """Seconds to prefill ``tokens`` new tokens after ``base`` cached ones; 0.0 for 0 tokens.

        Pure. Raises ValueError when ``base`` or ``tokens`` is negative.
        """
        if base < 0 or tokens < 0:
            raise ValueError(f"base and tokens must be non-negative, got base={base} tokens={tokens}")
        if tokens == 0:
            return 0.0
        pairs = base * tokens + tokens * (tokens + 1) // 2
        passes = -(-tokens // self.prefill_chunk_tokens)
        return self.token_seconds * tokens + self.pair_seconds * pairs + self.chunk_seconds * passes

    def restore_seconds(self, nbytes: int) -> float:
        """Seconds for one host-to-device restore batch of ``nbytes``; 0.0 when nothing moves.

        Pure. Raises ValueError when ``nbytes`` is negative.
        """
        if nbytes < 0:
            raise ValueError(f"nbytes must be non-negative, got {nbytes}")
        if nbytes == 0:
            return 0.0
        return nbytes / self.h2d_bytes_per_second + self.restore_batch_seconds


def preset_names() -> tuple[str, ...]:
    """Names ``CacheCostModel.preset`` accepts."""
    return (_GENERIC, _QWEN35_27B_RTX5090)
