"""Gated full attention over paged KV: q/k RMSNorm, partial RoPE, GQA, output times sigmoid(gate).

The forward writes the new tokens' K and V into the lane's pages first, then attends over the keys it reads
back through the block table, so a chunk may start anywhere (the prior context is whatever the pages hold).
`AttentionInputs` (built once per forward by the model, shared by every attention layer) says where to write,
where to read and what to mask.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from hybridcache.gpu.model.linear import linear
from hybridcache.gpu.model.norm import rms_norm
from hybridcache.gpu.model.rope import apply_rotary
from hybridcache.gpu.model.row_tiles import Product, causal_attention_in_tiles, tiled_linear


class AttentionInputs(NamedTuple):
    """Where the forward's tokens go and what they see.

    Prefill (one lane, `n` tokens, context `T` = start + n): `write_index [n]` and `read_index [T]` are flat
    rows of a plane viewed as `[num_pages * 64, kv_heads, head_dim]`; `mask` is None (the pass attends
    causally in position-aligned tiles). Decode (`B` lanes, one token each): `write_index [B]`,
    `read_index [B, L]` (L = longest context), `mask [B, 1, 1, L]`, or None when every lane sees all `L`.
    """

    cos: torch.Tensor
    sin: torch.Tensor
    write_index: torch.Tensor
    read_index: torch.Tensor
    mask: torch.Tensor | None


class FullAttention(NamedTuple):
    """One full-attention layer's weights (views into the checkpoint) and its forward."""

    q_proj: torch.Tensor  # [heads * head_dim * 2, hidden]: per head, the query then its gate
    k_proj: torch.Tensor
    v_proj: torch.Tensor
    o_proj: torch.Tensor
    q_bias: torch.Tensor | None
    k_bias: torch.Tensor | None
    v_bias: torch.Tensor | None
    o_bias: torch.Tensor | None
    q_norm: torch.Tensor  # fp32 1 + w
    k_norm: torch.Tensor
    heads: int
    kv_heads: int
    head_dim: int
    eps: float

    def _project(
        self, x: torch.Tensor, io: AttentionInputs, product: Product = linear
    ) -> tuple[torch.Tensor, ...]:
        """(query [t, H, D], gate [t, H*D], key [t, Hkv, D], value [t, Hkv, D]) with RoPE applied."""
        tokens = x.shape[0]
        query_gate = product(x, self.q_proj, self.q_bias).view(tokens, self.heads, 2 * self.head_dim)
        query, gate = query_gate.split(self.head_dim, dim=-1)
        query = rms_norm(query, self.q_norm, self.eps)
        key = rms_norm(
            product(x, self.k_proj, self.k_bias).view(tokens, self.kv_heads, self.head_dim),
            self.k_norm,
            self.eps,
        )
        value = product(x, self.v_proj, self.v_bias).view(tokens, self.kv_heads, self.head_dim)
        query = apply_rotary(query, io.cos, io.sin)
        key = apply_rotary(key, io.cos, io.sin)
        return query, gate.reshape(tokens, -1), key, value

    def _write(
        self,
        planes: tuple[torch.Tensor, torch.Tensor],
        key: torch.Tensor,
        value: torch.Tensor,
        io: AttentionInputs,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Store key/value rows in the pages; return the planes as flat `[rows, Hkv, D]` views."""
        flat_k = planes[0].view(-1, self.kv_heads, self.head_dim)
        flat_v = planes[1].view(-1, self.kv_heads, self.head_dim)
        flat_k.index_copy_(0, io.write_index, key)
        flat_v.index_copy_(0, io.write_index, value)
        return flat_k, flat_v

    def _finish(self, attended: torch.Tensor, gate: torch.Tensor, product: Product = linear) -> torch.Tensor:
        return product(attended * torch.sigmoid(gate), self.o_proj, self.o_bias)

    def prefill(
        self, x: torch.Tensor, planes: tuple[torch.Tensor, torch.Tensor], io: AttentionInputs
    ) -> torch.Tensor:
        """`x [n, hidden]` of one lane -> `[n, hidden]`. Writes the chunk's K/V into the lane's pages.

        Split-invariant (see `row_tiles`): each row comes out the same whatever pass it was computed in.
        """
        tokens = x.shape[0]
        query, gate, key, value = self._project(x, io, tiled_linear)
        flat_k, flat_v = self._write(planes, key, value, io)
        if io.read_index.shape[0] == tokens:  # the pass starts at 0: its own keys are the whole context
            context_k, context_v = key, value
        else:
            context_k = flat_k.index_select(0, io.read_index)
            context_v = flat_v.index_select(0, io.read_index)
        attended = causal_attention_in_tiles(query, context_k, context_v, self.head_dim**-0.5)
        return self._finish(attended.reshape(tokens, -1), gate, tiled_linear)

    def decode(
        self, x: torch.Tensor, planes: tuple[torch.Tensor, torch.Tensor], io: AttentionInputs
    ) -> torch.Tensor:
        """`x [B, hidden]`, one token per lane -> `[B, hidden]`; writes each token's K/V into its page.

        The query heads that share a KV head attend as that head's query rows (`[B, Hkv, group, D]`), so each
        lane's keys and values are read once per KV head rather than once per query head.
        """
        lanes = x.shape[0]
        query, gate, key, value = self._project(x, io)
        flat_k, flat_v = self._write(planes, key, value, io)
        attended = F.scaled_dot_product_attention(
            query.view(lanes, self.kv_heads, self.heads // self.kv_heads, self.head_dim),
            self._gather(flat_k, io.read_index),
            self._gather(flat_v, io.read_index),
            attn_mask=io.mask,
            scale=self.head_dim**-0.5,
        )
        return self._finish(attended.reshape(lanes, -1), gate)

    def _gather(self, flat: torch.Tensor, read_index: torch.Tensor) -> torch.Tensor:
        """Rows `read_index [B, L]` of a flat plane as `[B, Hkv, L, D]` (a copy; a strided view of it)."""
        lanes, context = read_index.shape
        rows = flat.index_select(0, read_index.reshape(-1))
        return rows.view(lanes, context, self.kv_heads, self.head_dim).transpose(1, 2)
