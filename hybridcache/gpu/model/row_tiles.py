"""Prefill products whose every row is computed the same way however the prompt was cut into passes.

A prefix cache is invisible only when a resumed request computes what a cold one computes, bit for bit.
Prefill passes of a cold and a resumed request cover the same positions in different pieces (the resumed
one starts at its snapshot; chunk sizes and taps cut the rest), so each row's arithmetic must not depend
on which other rows share its call. Matrix products do depend on it: the CPU matmul libraries (oneDNN,
MKL) pick their kernel and blocking from the row count M and the thread count, so a row of `x @ w.T`
computed among 64 rows can differ in the last bits from the same row computed among 2048 (measured for
fp32 and bf16, plain and packed weights). For one fixed M the kernel is fixed and a row's result no longer
depends on its place in the tile nor on the other rows (measured too), so:

- `tiled_linear` computes every prefill projection in tiles of exactly `ROW_TILE_TOKENS` rows (the last
  one zero-padded);
- `causal_attention_in_tiles` attends query tiles of `ATTENTION_TILE_TOKENS` positions aligned to absolute
  positions, each over exactly the keys up to its tile's end, so a query's call shape is a function of
  its position alone.

The delta rule is split-invariant at 64-aligned pass starts by construction (its sub-chunks start at the
pass start), which is why every snapshot a prefill takes lies on a block boundary.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F

from hybridcache.gpu.model.linear import linear

Product = Callable[..., torch.Tensor]
"""`(x, weight, bias=None) -> x @ weight.T + bias`: `linear`, or prefill's `tiled_linear`."""

ROW_TILE_TOKENS = 128
"""Rows per matmul call in prefill. Smaller tiles waste less on short passes but run the matmul library
further from its best blocking; 128 cost about 1.3-1.5x the plain product's time in bf16 (measured on
the `small` shapes, 2 threads), 64 about 2x."""

ATTENTION_TILE_TOKENS = 64
"""Query positions per attention call: one KV block, so tiles and pages line up."""


def tiled_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`linear(x, weight, bias)` for `x [n, in]`, computed `ROW_TILE_TOKENS` rows at a time. Pure."""
    rows = x.shape[0]
    if rows == ROW_TILE_TOKENS:
        return linear(x, weight, bias)
    whole = rows - rows % ROW_TILE_TOKENS
    parts = [linear(x[i : i + ROW_TILE_TOKENS], weight, bias) for i in range(0, whole, ROW_TILE_TOKENS)]
    if whole < rows:
        padded = x.new_zeros(ROW_TILE_TOKENS, *x.shape[1:])
        padded[: rows - whole] = x[whole:]
        parts.append(linear(padded, weight, bias)[: rows - whole])
    return parts[0] if len(parts) == 1 else torch.cat(parts)


LANE_BLOCK = 64
"""Elements per row that `lane_aligned` pads to: more than one unrolled step of torch's vectorized CPU loops
(two vectors of 16 fp32 or 32 bf16 lanes), so that no element falls in a loop's scalar remainder."""


def lane_aligned(function: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor) -> torch.Tensor:
    """`function(x)` for an elementwise `function` and a narrow `x [n, w]` (w < LANE_BLOCK), with each row
    computed in the same vector lanes whatever its index. Pure.

    Torch's elementwise CPU kernels run the transcendental functions (sigmoid, softplus, ...) vectorized
    over a contiguous tensor and finish its last few elements in a scalar loop, whose results differ in the
    last bits (measured: fp32 sigmoid and softplus). A `[n, 1]` tensor's row r lies in lane r mod 16, so the
    same token computed in a pass that starts one position later, or in one that ends a few tokens after
    it (its row then falls in the scalar remainder), can come out different; padded to LANE_BLOCK elements
    per row, every row starts a vector and nothing is left to the scalar loop.
    """
    rows, width = x.shape
    padded = x.new_zeros(rows, LANE_BLOCK)
    padded[:, :width] = x
    return function(padded)[:, :width]


def causal_attention_in_tiles(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float
) -> torch.Tensor:
    """Causal attention of the `n` queries at positions `end - n .. end` over the keys and values of
    positions `0 .. end`. Shapes: query `[n, H, D]`, keys/values `[end, Hkv, D]` (H a multiple of Hkv);
    returns `[n, H, D]`. Pure.

    Each tile of `ATTENTION_TILE_TOKENS` positions `[t, t + tile)` (t a multiple of the tile) is one call
    over the keys `[0, t + tile)`, zero-padded past `end`; positions of the tile outside the pass are zero
    queries whose rows are dropped. The query heads sharing a KV head attend as that head's rows, so keys
    and values are never repeated per query head.
    """
    count, heads, dim = query.shape
    end, kv_heads = keys.shape[0], keys.shape[1]
    start, group, tile = end - count, heads // kv_heads, ATTENTION_TILE_TOKENS
    first, last = start - start % tile, -(-end // tile) * tile
    padded_keys = keys.new_zeros(last, kv_heads, dim)
    padded_values = values.new_zeros(last, kv_heads, dim)
    padded_keys[:end] = keys
    padded_values[:end] = values
    k_heads = padded_keys.permute(1, 0, 2).unsqueeze(0)  # [1, Hkv, last, D]
    v_heads = padded_values.permute(1, 0, 2).unsqueeze(0)
    offsets = torch.arange(tile, device=query.device)[:, None]
    out = query.new_empty(count, heads, dim)
    for tile_start in range(first, last, tile):
        lo, hi = max(start, tile_start), min(end, tile_start + tile)
        rows = query.new_zeros(tile, heads, dim)
        rows[lo - tile_start : hi - tile_start] = query[lo - start : hi - start]
        grouped = rows.view(tile, kv_heads, group, dim).permute(1, 0, 2, 3).reshape(1, kv_heads, -1, dim)
        visible = torch.arange(tile_start + tile, device=query.device)[None, :] <= tile_start + offsets
        attended = F.scaled_dot_product_attention(
            grouped,
            k_heads[:, :, : tile_start + tile],
            v_heads[:, :, : tile_start + tile],
            attn_mask=visible.repeat_interleave(group, dim=0),
            scale=scale,
        )  # [1, Hkv, tile * group, D], rows in (position, group) order
        per_position = attended.view(kv_heads, tile, group, dim).permute(1, 0, 2, 3).reshape(tile, heads, dim)
        out[lo - start : hi - start] = per_position[lo - tile_start : hi - tile_start]
    return out
