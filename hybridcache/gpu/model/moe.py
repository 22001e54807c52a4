"""The MoE feed-forward of Qwen3.5-MoE: softmax top-k routing (renormalised), SwiGLU experts, and a shared
expert scaled by `sigmoid(shared_expert_gate(x))`. Pure; expert weights are checkpoint views (per-expert
tensors, or slices of the fused `[E, 2I, H]` / `[E, H, I]` layout), never stacked copies.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from hybridcache.gpu.model.linear import linear
from hybridcache.gpu.model.mlp import SwiGluMlp
from hybridcache.gpu.model.row_tiles import Product, lane_aligned


class MoeBlock(NamedTuple):
    router: torch.Tensor  # [experts, hidden]
    experts: tuple[SwiGluMlp, ...]
    shared_expert: SwiGluMlp
    shared_expert_gate: torch.Tensor  # [1, hidden]
    top_k: int

    def __call__(self, x: torch.Tensor, product: Product = linear) -> torch.Tensor:
        """`x [t, hidden]` -> `[t, hidden]`, each product computed by `product` (prefill's row-tiled one
        makes an expert's rows independent of which other tokens were routed to it)."""
        logits = product(x, self.router)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)
        weights, chosen = torch.topk(probs, self.top_k, dim=-1)
        weights = (weights / weights.sum(dim=-1, keepdim=True)).to(logits.dtype)
        routed = torch.zeros_like(x)
        for expert_index in torch.unique(chosen).tolist():
            token_index, rank = torch.where(chosen == expert_index)
            expert = self.experts[expert_index]
            expert_out = expert(x[token_index], product) * weights[token_index, rank, None]
            routed.index_add_(0, token_index, expert_out.to(routed.dtype))
        shared_gate = lane_aligned(torch.sigmoid, product(x, self.shared_expert_gate))
        shared = shared_gate * self.shared_expert(x, product)
        return routed + shared
