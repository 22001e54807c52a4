"""Decode's own attention kernel (`gpu/model/cpu_decode_attention.py`) against float64 and torch."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hybridcache.gpu.model import cpu_decode_attention, cpu_kernels

STATUS = cpu_kernels.status()
pytestmark = pytest.mark.skipif(not STATUS.active, reason=f"kernel not in use here: {STATUS.reason}")


def _inputs(length: int, kv_heads: int, group: int, head_dim: int, seed: int):
    generator = torch.Generator().manual_seed(seed)
    shape = (length + 200, kv_heads, head_dim)
    planes = [torch.randn(shape, generator=generator).to(torch.bfloat16) for _ in "kv"]
    query = (torch.randn(kv_heads, group, head_dim, generator=generator) * 0.7).to(torch.bfloat16)
    return query, planes[0], planes[1]


def _exact(query, flat_k, flat_v, rows) -> torch.Tensor:
    keys, values = flat_k[rows].double(), flat_v[rows].double()
    scores = torch.einsum("hgd,thd->hgt", query.double(), keys) * query.shape[-1] ** -0.5
    return torch.einsum("hgt,thd->hgd", torch.softmax(scores, dim=-1), values)


def _paged_rows(length: int, seed: int) -> torch.Tensor:
    """The rows of `length` positions on shuffled 64-row pages (a lane whose pages are not consecutive)."""
    pages = torch.randperm(-(-length // 64) + 2, generator=torch.Generator().manual_seed(seed))
    return (pages[:, None] * 64 + torch.arange(64)).reshape(-1)[:length]


@pytest.mark.parametrize(
    ("length", "kv_heads", "group", "head_dim"),
    [(1, 1, 1, 32), (63, 2, 2, 32), (256, 2, 4, 256), (257, 1, 8, 64), (1000, 4, 3, 128), (3000, 2, 4, 256)],
)
def test_matches_float64_and_torch_on_consecutive_and_paged_rows(length, kv_heads, group, head_dim) -> None:
    query, flat_k, flat_v = _inputs(length, kv_heads, group, head_dim, length)
    assert cpu_decode_attention.applies(query, flat_k, group)
    scale = head_dim**-0.5
    for rows in (slice(100, 100 + length), _paged_rows(length, length)):
        got = cpu_decode_attention.attend(query, flat_k, flat_v, rows, scale)
        exact = _exact(query, flat_k, flat_v, rows)
        assert got.dtype == torch.bfloat16 and got.shape == query.shape
        # float32 throughout, rounded to bf16 once: half a bf16 ulp of the largest output plus summation error
        assert torch.allclose(got.double(), exact, rtol=2**-8, atol=2**-9 * float(exact.abs().max()))
        torch_form = F.scaled_dot_product_attention(
            query[None], flat_k[rows].transpose(0, 1)[None], flat_v[rows].transpose(0, 1)[None], scale=scale
        )[0]
        # never further from the exact result than torch's own bf16 attention, up to one bf16 rounding
        ours_error = (got.double() - exact).abs().max()
        torch_error = (torch_form.double() - exact).abs().max()
        assert ours_error <= torch_error + 2**-8 * float(exact.abs().max())


def test_the_bits_do_not_depend_on_threads_or_on_how_the_rows_lie_in_pages() -> None:
    length, kv_heads, group, head_dim = 1500, 2, 4, 256
    query, flat_k, flat_v = _inputs(length, kv_heads, group, head_dim, 7)
    paged = _paged_rows(length, 3)
    together = cpu_decode_attention.attend(query, flat_k, flat_v, paged, 0.0625)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single_thread = cpu_decode_attention.attend(query, flat_k, flat_v, paged, 0.0625)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(together, single_thread)
    moved_k, moved_v = torch.zeros_like(flat_k), torch.zeros_like(flat_v)
    moved_k[50 : 50 + length], moved_v[50 : 50 + length] = flat_k[paged], flat_v[paged]
    consecutive = cpu_decode_attention.attend(query, moved_k, moved_v, slice(50, 50 + length), 0.0625)
    assert torch.equal(together, consecutive)


def test_a_dominant_key_and_large_scores_stay_finite() -> None:
    query, flat_k, flat_v = _inputs(600, 1, 2, 64, 5)
    flat_k[300] = query[0, 0] * 40  # scores in the thousands: the block maxima keep exp() in range
    got = cpu_decode_attention.attend(query, flat_k, flat_v, slice(0, 600), 1.0)
    assert torch.isfinite(got.float()).all()
    assert torch.allclose(got[0, 0].double(), flat_v[300, 0].double(), rtol=2**-7, atol=1e-3)


def test_what_it_leaves_to_torch() -> None:
    query, flat_k, _ = _inputs(10, 2, 4, 64, 1)
    assert cpu_decode_attention.applies(query, flat_k, 4)
    assert not cpu_decode_attention.applies(query.float(), flat_k.float(), 4)
    assert not cpu_decode_attention.applies(query, flat_k, cpu_decode_attention.MAX_GROUP + 1)
    odd_query, odd_k, _ = _inputs(10, 2, 4, 48, 1)
    assert not cpu_decode_attention.applies(odd_query, odd_k, 4)
    assert not cpu_decode_attention.applies(query, flat_k[:, :1], 4)  # not contiguous
