"""The SwiGLU feed-forward: `down(silu(gate(x)) * up(x))`. Pure; weights are checkpoint views."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F


class SwiGluMlp(NamedTuple):
    gate_proj: torch.Tensor  # [intermediate, hidden]
    up_proj: torch.Tensor  # [intermediate, hidden]
    down_proj: torch.Tensor  # [hidden, intermediate]

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        """`x [t, hidden]` -> `[t, hidden]`."""
        return F.linear(F.silu(F.linear(x, self.gate_proj)) * F.linear(x, self.up_proj), self.down_proj)
