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

ContextRows = slice | torch.Tensor
"""The rows of one lane's context, in order, in a plane viewed as `[num_pages * 64, kv_heads, head_dim]`: a
slice when the lane's pages are consecutive (read in place, no copy), else an int64 index (gathered)."""


class AttentionInputs(NamedTuple):
    """Where the forward's tokens go and what they see.

    `write_index` holds the flat plane row of each new token (`[n]` for a prefill chunk of one lane, `[B]`
    for decode, one token per lane). `contexts` holds, per lane, the rows of its whole context up to and
    including its new tokens. `mask` (prefill only) is `[n, T]` bool, or None when the chunk starts at 0
    and the chunk is its own context (plain causal).
    """

    cos: torch.Tensor
    sin: torch.Tensor
    write_index: torch.Tensor
    contexts: tuple[ContextRows, ...]
    mask: torch.Tensor | None


def context_rows(
    table: list[int], length: int, page_tokens: int, device: torch.device | str = "cpu"
) -> ContextRows:
    """The rows of the first `length` positions of a lane whose pages are `table`. Pure."""
    pages = -(-length // page_tokens)
    first = table[0]
    if table[:pages] == list(range(first, first + pages)):
        return slice(first * page_tokens, first * page_tokens + length)
    page = torch.as_tensor(table[:pages], dtype=torch.long, device=device)
    offsets = torch.arange(page_tokens, dtype=torch.long, device=device)
    return (page[:, None] * page_tokens + offsets).reshape(-1)[:length]


def _read(flat: torch.Tensor, rows: ContextRows) -> torch.Tensor:
    return flat[rows] if isinstance(rows, slice) else flat.index_select(0, rows)


class FullAttention(NamedTuple):
    """One full-attention layer's weights (views into the checkpoint) and its forward."""

    qkv_proj: torch.Tensor  # [heads * head_dim * 2 + 2 * kv_heads * head_dim, hidden]: q (per head the
    # query then its gate), k and v rows in that order, one matmul call for all three
    o_proj: torch.Tensor
    qkv_bias: torch.Tensor | None
    o_bias: torch.Tensor | None
    q_norm: torch.Tensor  # fp32 1 + w
    k_norm: torch.Tensor
    heads: int
    kv_heads: int
    head_dim: int
    eps: float

    def _project(self, x: torch.Tensor, io: AttentionInputs) -> tuple[torch.Tensor, ...]:
        """(query [t, H, D], gate [t, H*D], key [t, Hkv, D], value [t, Hkv, D]) with RoPE applied."""
        tokens = x.shape[0]
        kv_dim = self.kv_heads * self.head_dim
        query_gate, key, value = linear(x, self.qkv_proj, self.qkv_bias).split(
            (2 * self.heads * self.head_dim, kv_dim, kv_dim), dim=-1
        )
        query, gate = query_gate.reshape(tokens, self.heads, 2 * self.head_dim).split(self.head_dim, dim=-1)
        query = rms_norm(query, self.q_norm, self.eps)
        key = rms_norm(key.reshape(tokens, self.kv_heads, self.head_dim), self.k_norm, self.eps)
        value = value.reshape(tokens, self.kv_heads, self.head_dim)
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

    def _finish(self, attended: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
        return linear(attended * torch.sigmoid(gate), self.o_proj, self.o_bias)

    def prefill(
        self, x: torch.Tensor, planes: tuple[torch.Tensor, torch.Tensor], io: AttentionInputs
    ) -> torch.Tensor:
        """`x [n, hidden]` of one lane -> `[n, hidden]`. Writes the chunk's K/V into the lane's pages."""
        tokens = x.shape[0]
        query, gate, key, value = self._project(x, io)
        flat_k, flat_v = self._write(planes, key, value, io)
        if io.mask is not None:
            key, value = _read(flat_k, io.contexts[0]), _read(flat_v, io.contexts[0])
        attended = F.scaled_dot_product_attention(
            query.transpose(0, 1).unsqueeze(0),
            key.transpose(0, 1).unsqueeze(0),
            value.transpose(0, 1).unsqueeze(0),
            attn_mask=io.mask,
            is_causal=io.mask is None,
            scale=self.head_dim**-0.5,
            enable_gqa=self.heads != self.kv_heads,
        )
        return self._finish(attended[0].transpose(0, 1).reshape(tokens, -1), gate)

    def decode(
        self, x: torch.Tensor, planes: tuple[torch.Tensor, torch.Tensor], io: AttentionInputs
    ) -> torch.Tensor:
        """`x [B, hidden]`, one token per lane -> `[B, hidden]`; writes each token's K/V into its page.

        Each lane attends over its own context alone (no padding to the longest lane, no mask), read in
        place where its pages are consecutive, so a lane's result does not depend on the other lanes of its
        batch. The query heads that share a KV head attend as that head's query rows (`[1, Hkv, group, D]`),
        so the keys and values are read once per KV head rather than once per query head.
        """
        lanes = x.shape[0]
        query, gate, key, value = self._project(x, io)
        flat_k, flat_v = self._write(planes, key, value, io)
        grouped = query.view(lanes, self.kv_heads, self.heads // self.kv_heads, self.head_dim)
        attended = torch.cat(
            [
                F.scaled_dot_product_attention(
                    grouped[lane : lane + 1],
                    _read(flat_k, rows).transpose(0, 1).unsqueeze(0),
                    _read(flat_v, rows).transpose(0, 1).unsqueeze(0),
                    scale=self.head_dim**-0.5,
                )
                for lane, rows in enumerate(io.contexts)
            ]
        )
        return self._finish(attended.reshape(lanes, -1), gate)
