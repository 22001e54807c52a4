"""The SwiGLU feed-forward: `down(silu(gate(x)) * up(x))`. Pure; weights are checkpoint views."""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from hybridcache.gpu.model.linear import linear
from hybridcache.gpu.model.row_tiles import Product


class SwiGluMlp(NamedTuple):
    gate_proj: torch.Tensor  # [intermediate, hidden]
    up_proj: torch.Tensor  # [intermediate, hidden]
    down_proj: torch.Tensor  # [hidden, intermediate]

    def __call__(self, x: torch.Tensor, product: Product = linear) -> torch.Tensor:
        """`x [t, hidden]` -> `[t, hidden]`, each product computed by `product`."""
        return product(F.silu(product(x, self.gate_proj)) * product(x, self.up_proj), self.down_proj)
