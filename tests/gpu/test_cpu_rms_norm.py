"""RMSNorm of bf16 rows by our CPU kernel (`gpu/model/cpu_rms_norm.c`, through `norm.rms_norm`)."""

from __future__ import annotations

import pytest
import torch

from hybridcache.gpu.model import cpu_kernels, norm

STATUS = cpu_kernels.status()
pytestmark = pytest.mark.skipif(not STATUS.active, reason=f"CPU kernels not in use here: {STATUS.reason}")


def _torch_form(x: torch.Tensor, scale: torch.Tensor, eps: float) -> torch.Tensor:
    return torch.rms_norm(x.float(), scale.shape, scale, eps).to(x.dtype)


@pytest.mark.parametrize("width", [16, 20, 33, 256, 1024])
def test_the_kernel_computes_the_torch_form_within_a_bf16_rounding(width: int):
    generator = torch.Generator().manual_seed(width)
    x = (torch.randn(130, width, generator=generator) * 3).to(torch.bfloat16)
    scale = 1 + torch.randn(width, generator=generator) * 0.2
    assert norm._kernel_applies(x, scale)
    got = norm.rms_norm(x, scale, 1e-6)
    expected = _torch_form(x, scale, 1e-6)
    assert got.dtype == torch.bfloat16 and got.shape == x.shape
    # float32 sums in another order can move a result across one bf16 rounding boundary, never further
    assert torch.allclose(got.float(), expected.float(), rtol=2**-7, atol=0)


def test_a_row_does_not_depend_on_the_rows_beside_it_or_the_threads():
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(2, 70, 48, generator=generator).to(torch.bfloat16)  # 140 rows: the threaded path
    scale = 1 + torch.randn(48, generator=generator) * 0.2
    together = norm.rms_norm(x, scale, 1e-6)
    one_by_one = torch.stack([torch.stack([norm.rms_norm(row[None], scale, 1e-6)[0] for row in block])
                              for block in x])
    assert torch.equal(together, one_by_one)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        assert torch.equal(norm.rms_norm(x, scale, 1e-6), together)
    finally:
        torch.set_num_threads(threads)
    strided = torch.zeros(2, 70, 96, dtype=torch.bfloat16)[..., ::2]
    strided.copy_(x)
    assert torch.equal(norm.rms_norm(strided, scale, 1e-6), together)


def test_other_dtypes_keep_the_torch_form():
    x = torch.randn(3, 32)
    scale = torch.ones(32)
    assert not norm._kernel_applies(x, scale)
    assert not norm._kernel_applies(x.bfloat16(), scale.bfloat16())
    assert torch.equal(norm.rms_norm(x, scale, 1e-6), _torch_form(x, scale, 1e-6))
