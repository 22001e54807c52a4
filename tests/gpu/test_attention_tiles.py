"""Prefill's tiled causal attention is causal attention: each tile attends to the keys before it without a
mask and to its own keys with one, and the two parts merge by their log-sum-exps into what one masked call
over the whole context gives, up to rounding."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hybridcache.gpu.model.row_tiles import ATTENTION_TILE_TOKENS, causal_attention_in_tiles
from hybridcache.gpu.model.tolerance import relative_error

HEADS, KV_HEADS, DIM = 4, 2, 32
SCALE = DIM**-0.5


def plain_causal_attention(query: torch.Tensor, keys: torch.Tensor, values: torch.Tensor) -> torch.Tensor:
    """The reference: one masked fp32 call, each KV head repeated for its query heads."""
    count, end = query.shape[0], keys.shape[0]
    group = HEADS // KV_HEADS
    positions = torch.arange(end - count, end)[:, None]
    visible = torch.arange(end)[None, :] <= positions
    attended = F.scaled_dot_product_attention(
        query.float().transpose(0, 1),
        keys.float().repeat_interleave(group, dim=1).transpose(0, 1),
        values.float().repeat_interleave(group, dim=1).transpose(0, 1),
        attn_mask=visible,
        scale=SCALE,
    )
    return attended.transpose(0, 1)


def random_pass(end: int, count: int, dtype: torch.dtype):
    generator = torch.Generator().manual_seed(end * 1000 + count)
    keys = torch.randn(end, KV_HEADS, DIM, generator=generator).to(dtype)
    values = torch.randn(end, KV_HEADS, DIM, generator=generator).to(dtype)
    query = torch.randn(count, HEADS, DIM, generator=generator).to(dtype)
    return query, keys, values


# (context length, queries in the pass): inside the first tile, a whole tile, passes that start and end
# inside tiles, a pass that starts on a tile boundary after several tiles of earlier context.
PASSES = [(5, 5), (ATTENTION_TILE_TOKENS, ATTENTION_TILE_TOKENS), (130, 130), (300, 77), (321, 1), (512, 128)]


@pytest.mark.parametrize(("end", "count"), PASSES)
def test_tiled_attention_equals_one_masked_call_in_float32(end: int, count: int):
    query, keys, values = random_pass(end, count, torch.float32)
    tiled = causal_attention_in_tiles(query, keys, values, SCALE)
    assert tiled.shape == (count, HEADS, DIM)
    assert relative_error(tiled, plain_causal_attention(query, keys, values)) < 1e-5


@pytest.mark.parametrize(("end", "count"), PASSES)
def test_tiled_attention_in_bfloat16_is_within_rounding_of_float32(end: int, count: int):
    query, keys, values = random_pass(end, count, torch.bfloat16)
    tiled = causal_attention_in_tiles(query, keys, values, SCALE)
    assert tiled.dtype == torch.bfloat16
    # bf16 keeps 8 bits: each part and the merge round once, so a few units of 2^-8 at most
    assert relative_error(tiled, plain_causal_attention(query, keys, values)) < 4 * 2**-8


def test_the_one_call_per_tile_form_that_other_devices_run_is_causal_attention_too():
    from hybridcache.gpu.model.row_tiles import _masked_tiles

    query, keys, values = random_pass(300, 77, torch.float32)
    tiled = _masked_tiles(query, keys, values, SCALE)
    assert relative_error(tiled, plain_causal_attention(query, keys, values)) < 1e-5
