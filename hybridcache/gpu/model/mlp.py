"""The SwiGLU feed-forward: `down(silu(gate(x)) * up(x))`. Pure.

The gate and up projections are one matrix (the gate rows, then the up rows), so a token's input is
multiplied once: one matmul call instead of two, which matters most for decode, where each call streams its
weights for a few rows of input.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from hybridcache.gpu.model.linear import linear
from hybridcache.gpu.model.row_tiles import Product


class SwiGluMlp(NamedTuple):
    gate_up_proj: torch.Tensor  # [2 * intermediate, hidden]: gate rows, then up rows
    down_proj: torch.Tensor  # [hidden, intermediate]

    def __call__(self, x: torch.Tensor, product: Product = linear) -> torch.Tensor:
        """`x [t, hidden]` -> `[t, hidden]`, each product computed by `product`."""
        gate, up = product(x, self.gate_up_proj).chunk(2, dim=-1)
        return product(F.silu(gate).mul_(up), self.down_proj)
