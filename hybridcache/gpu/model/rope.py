"""Partial rotary position embedding (RoPE over the leading `rotary_dim` dims of each head)."""

from __future__ import annotations

import torch


class RotaryTable:
    """cos/sin rows by position, computed in fp32 and grown on demand (the only mutation: `_grow`)."""

    def __init__(self, rotary_dim: int, theta: float, device: torch.device | str = "cpu") -> None:
        exponents = torch.arange(0, rotary_dim, 2, dtype=torch.float32, device=device) / rotary_dim
        self.inv_freq = 1.0 / (theta**exponents)
        self.rotary_dim = rotary_dim
        self._cos = torch.empty(0, rotary_dim, device=device)
        self._sin = torch.empty(0, rotary_dim, device=device)
        self._cast: dict[torch.dtype, tuple[torch.Tensor, torch.Tensor]] = {}

    def cos_sin(
        self, positions: torch.Tensor, end: int, dtype: torch.dtype
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rows `[len(positions), rotary_dim]` of cos and sin for int64 `positions` (< `end`), in `dtype`."""
        if end > self._cos.shape[0]:
            self._grow(end)
        cos, sin = self._cast[dtype] if dtype in self._cast else self._cast_to(dtype)
        return cos[positions], sin[positions]

    def _grow(self, needed: int) -> None:
        size = max(needed, 2 * self._cos.shape[0], 4096)
        positions = torch.arange(size, dtype=torch.float32, device=self.inv_freq.device)
        freqs = positions[:, None] * self.inv_freq
        angles = torch.cat((freqs, freqs), dim=-1)
        self._cos, self._sin = angles.cos(), angles.sin()
        self._cast = {}

    def _cast_to(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        pair = (self._cos.to(dtype), self._sin.to(dtype))
        self._cast[dtype] = pair
        return pair


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the leading `cos.shape[-1]` dims of `x` `[tokens, heads, head_dim]`; `cos`: `[tokens, dim]`."""
    rotary_dim = cos.shape[-1]
    rotated, passed = x[..., :rotary_dim], x[..., rotary_dim:]
    cos, sin = cos[:, None, :], sin[:, None, :]
    half = rotary_dim // 2
    swapped = torch.cat((-rotated[..., half:], rotated[..., :half]), dim=-1)
    return torch.cat((rotated * cos + swapped * sin, passed), dim=-1)
