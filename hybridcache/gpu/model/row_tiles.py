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

    Each tile of `ATTENTION_TILE_TOKENS` positions `[t, t + tile)` (t a multiple of the tile) attends in two
    calls whose shapes depend on t alone: one over the keys `[0, t)`, which every position of the tile sees
    (no mask), and one over the tile's own keys `[t, t + tile)` with the causal mask, zero-padded past
    `end`; the two are merged by their log-sum-exps. Positions of the tile outside the pass are zero
    queries whose rows are dropped. The query heads sharing a KV head attend as that head's rows, so keys
    and values are never repeated per query head.

    Why two calls: a masked call over the whole context costs about twice an unmasked one on the CPU
    (measured at a 50k-token context, 2048 queries: 10.7 s against 5.9 s), and only the diagonal tile
    needs a mask. The split needs the kernel's log-sum-exp, which only the CPU kernel returns through a
    stable call, so other devices keep one masked call per tile (`_masked_tiles`).
    """
    if query.device.type != "cpu":
        return _masked_tiles(query, keys, values, scale)
    group = query.shape[1] // keys.shape[1]
    diagonal_mask = _diagonal_mask(ATTENTION_TILE_TOKENS, group, query.dtype, query.device)

    def attend_tile(grouped: torch.Tensor, tile_start: int, k_heads: torch.Tensor,
                    v_heads: torch.Tensor) -> torch.Tensor:
        own = slice(tile_start, tile_start + ATTENTION_TILE_TOKENS)
        attended, own_lse = _attend(grouped, k_heads[:, :, own], v_heads[:, :, own], scale, diagonal_mask)
        if not tile_start:
            return attended
        earlier = slice(0, tile_start)
        before, before_lse = _attend(grouped, k_heads[:, :, earlier], v_heads[:, :, earlier], scale, None)
        return _merge(before, before_lse, attended, own_lse)

    return _by_tiles(query, keys, values, attend_tile)


def _by_tiles(
    query: torch.Tensor,
    keys: torch.Tensor,
    values: torch.Tensor,
    attend_tile: Callable[[torch.Tensor, int, torch.Tensor, torch.Tensor], torch.Tensor],
) -> torch.Tensor:
    """The frame both forms share: keys and values heads-first and zero-padded to whole tiles, each tile's
    queries as their KV head's rows (`[1, Hkv, tile * group, D]`, zero rows for positions outside the pass),
    `attend_tile(grouped, tile_start, k_heads, v_heads)` for each, the pass's rows put back. Pure."""
    count, heads, dim = query.shape
    end, kv_heads = keys.shape[0], keys.shape[1]
    start, group, tile = end - count, heads // kv_heads, ATTENTION_TILE_TOKENS
    first, last = start - start % tile, -(-end // tile) * tile
    k_heads = _heads_first(keys, last)  # [1, Hkv, last, D]
    v_heads = _heads_first(values, last)
    out = query.new_empty(count, heads, dim)
    for tile_start in range(first, last, tile):
        lo, hi = max(start, tile_start), min(end, tile_start + tile)
        rows = query.new_zeros(tile, heads, dim)
        rows[lo - tile_start : hi - tile_start] = query[lo - start : hi - start]
        grouped = rows.view(tile, kv_heads, group, dim).permute(1, 0, 2, 3).reshape(1, kv_heads, -1, dim)
        attended = attend_tile(grouped, tile_start, k_heads, v_heads)
        # [1, Hkv, tile * group, D], rows in (position, group) order
        per_position = attended.view(kv_heads, tile, group, dim).permute(1, 0, 2, 3).reshape(tile, heads, dim)
        out[lo - start : hi - start] = per_position[lo - tile_start : hi - tile_start]
    return out


def _heads_first(rows: torch.Tensor, length: int) -> torch.Tensor:
    """`[end, Hkv, D]` -> a contiguous `[1, Hkv, length, D]`, zero past `end`. Pure."""
    end, kv_heads, dim = rows.shape
    out = rows.new_zeros(1, kv_heads, length, dim)
    out[0, :, :end] = rows.transpose(0, 1)
    return out


def _diagonal_mask(tile: int, group: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """`[tile * group, tile]` additive mask (the kernel takes it in the query's dtype): the row of (position
    i, group member g) sees the tile's keys 0 .. i. Pure."""
    positions = torch.arange(tile, device=device)
    hidden = (positions[None, :] > positions[:, None]).repeat_interleave(group, dim=0)
    return torch.zeros(hidden.shape, dtype=dtype, device=device).masked_fill(hidden, float("-inf"))


def _attend(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Attention `[1, Hkv, rows, D]` and its fp32 log-sum-exp per row `[1, Hkv, rows]`. Pure.

    The CPU flash-attention kernel that `scaled_dot_product_attention` runs on the CPU, called directly
    because only it returns the log-sum-exp a merge needs."""
    attended, lse = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu(
        query, keys, values, 0.0, False, attn_mask=mask, scale=scale
    )[:2]
    return attended, lse


def _merge(
    first: torch.Tensor, first_lse: torch.Tensor, second: torch.Tensor, second_lse: torch.Tensor
) -> torch.Tensor:
    """Attention over two disjoint key sets merged into attention over their union, in fp32. Pure."""
    weight = torch.sigmoid(first_lse - second_lse).unsqueeze(-1)  # the first set's share of the softmax mass
    merged = second.float() + weight * (first.float() - second.float())
    return merged.to(first.dtype)


def _masked_tiles(
    query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, scale: float
) -> torch.Tensor:
    """`causal_attention_in_tiles` with one masked call per tile over the keys `[0, t + tile)`. Pure."""
    group, tile = query.shape[1] // keys.shape[1], ATTENTION_TILE_TOKENS
    offsets = torch.arange(tile, device=query.device)[:, None]

    def attend_tile(grouped: torch.Tensor, tile_start: int, k_heads: torch.Tensor,
                    v_heads: torch.Tensor) -> torch.Tensor:
        visible = torch.arange(tile_start + tile, device=query.device)[None, :] <= tile_start + offsets
        return F.scaled_dot_product_attention(
            grouped,
            k_heads[:, :, : tile_start + tile],
            v_heads[:, :, : tile_start + tile],
            attn_mask=visible.repeat_interleave(group, dim=0),
            scale=scale,
        )

    return _by_tiles(query, keys, values, attend_tile)
