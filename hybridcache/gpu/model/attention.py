"""Gated full attention over paged KV: q/k RMSNorm, partial RoPE, GQA, output times sigmoid(gate).

The forward writes the new tokens' K and V into the lane's pages first, then attends over the keys it reads
back through the block table, so a chunk may start anywhere (the prior context is whatever the pages hold).
`AttentionInputs` (built once per forward by the model, shared by every attention layer) says where to write
and where to read.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from hybridcache.gpu.model import cpu_decode_attention
from hybridcache.gpu.model.linear import linear
from hybridcache.gpu.model.norm import rms_norm
from hybridcache.gpu.model.rope import apply_rotary
from hybridcache.gpu.model.row_tiles import Product, causal_attention_in_tiles, tiled_linear

ContextRows = slice | torch.Tensor
"""The rows of one lane's context, in order, in a plane viewed as `[num_pages * 64, kv_heads, head_dim]`: a
slice when the lane's pages are consecutive (read in place, no copy), else an int64 index (gathered)."""


class AttentionInputs(NamedTuple):
    """Where the forward's tokens go and what they see.

    `write_index` holds the flat plane row of each new token (`[n]` for a prefill pass of one lane, `[B]`
    for decode, one token per lane). `contexts` holds, per lane, the rows of its whole context up to and
    including its new tokens; it is empty for a prefill pass that starts at 0 (the pass's own keys are its
    whole context). Prefill attends causally in position-aligned tiles (`row_tiles`); decode attends each
    lane over its own context. Neither needs a mask.
    """

    cos: torch.Tensor
    sin: torch.Tensor
    write_index: torch.Tensor
    contexts: tuple[ContextRows, ...]


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

    def _project(
        self, x: torch.Tensor, io: AttentionInputs, product: Product = linear
    ) -> tuple[torch.Tensor, ...]:
        """(query [t, H, D], gate [t, H*D], key [t, Hkv, D], value [t, Hkv, D]) with RoPE applied."""
        tokens = x.shape[0]
        kv_dim = self.kv_heads * self.head_dim
        query_gate, key, value = product(x, self.qkv_proj, self.qkv_bias).split(
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
        if io.contexts:
            context_k, context_v = _read(flat_k, io.contexts[0]), _read(flat_v, io.contexts[0])
        else:
            context_k, context_v = key, value
        attended = causal_attention_in_tiles(query, context_k, context_v, self.head_dim**-0.5)
        return self._finish(attended.reshape(tokens, -1), gate, tiled_linear)

    def decode(
        self, x: torch.Tensor, planes: tuple[torch.Tensor, torch.Tensor], io: AttentionInputs
    ) -> torch.Tensor:
        """`x [B, hidden]`, one token per lane -> `[B, hidden]`; writes each token's K/V into its page.

        Each lane attends over its own context alone (no padding to the longest lane, no mask), read in
        place where its pages are consecutive, so a lane's attention does not depend on the other lanes of its
        batch. The query heads that share a KV head attend as that head's query rows (`[1, Hkv, group, D]`),
        so the keys and values are read once per KV head rather than once per query head. On a CPU with our
        kernels, `cpu_decode_attention` computes it instead of torch's flash attention.
        """
        lanes = x.shape[0]
        query, gate, key, value = self._project(x, io)
        flat_k, flat_v = self._write(planes, key, value, io)
        group = self.heads // self.kv_heads
        grouped = query.view(lanes, self.kv_heads, group, self.head_dim)
        scale = self.head_dim**-0.5
        if cpu_decode_attention.applies(query, flat_k, group):
            attended = torch.stack(
                [
                    cpu_decode_attention.attend(grouped[lane], flat_k, flat_v, rows, scale)
                    for lane, rows in enumerate(io.contexts)
                ]
            )
        else:
            attended = torch.cat(
                [
                    F.scaled_dot_product_attention(
                        grouped[lane : lane + 1],
                        _read(flat_k, rows).transpose(0, 1).unsqueeze(0),
                        _read(flat_v, rows).transpose(0, 1).unsqueeze(0),
                        scale=scale,
                    )
                    for lane, rows in enumerate(io.contexts)
                ]
            )
        return self._finish(attended.reshape(lanes, -1), gate)
