"""Decode's own bf16 kernel over oneDNN's packed weights (`gpu/model/cpu_gemv.py`)."""

from __future__ import annotations

import pytest
import torch

from hybridcache.gpu.model import cpu_gemv, cpu_kernels
from hybridcache.gpu.model.linear import linear, pack_weight
from hybridcache.gpu.model.onednn_packing import can_pack

STATUS = cpu_kernels.status()
KERNEL_HERE = STATUS.active and can_pack(torch.bfloat16, "cpu")
pytestmark = pytest.mark.skipif(not KERNEL_HERE, reason=f"kernel not in use here: {STATUS.reason}")

needs_the_layout = pytest.mark.skipif(
    not (KERNEL_HERE and cpu_gemv.packed_layout(96, 64) is not None),
    reason="oneDNN packs bf16 weights on this CPU in a layout the kernel does not read (it reads blocks of "
    "32 rows, seen with AMX, and of 64, seen on AVX-512 BF16 without it), so decode's products stay "
    "oneDNN's; the other tests check that",
)

SHAPES = [(96, 64), (128, 64), (100, 64), (1000, 70), (1024, 2048), (257, 1030)]
"""Whole 32-row blocks (a part 64-row block), whole blocks of either height, a part block, padded columns
(70 -> 96), a real shape, and both paddings at once."""


def _weight(n: int, k: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return (torch.randn(n, k, generator=generator) / k**0.5).to(torch.bfloat16)


def _rows(m: int, k: int, seed: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed + 1)
    return torch.randn(m, k, generator=generator).to(torch.bfloat16)


@needs_the_layout
@pytest.mark.parametrize(("n", "k"), SHAPES)
def test_packed_layout_is_recognized_and_products_match_float64(n: int, k: int) -> None:
    assert cpu_gemv.packed_layout(n, k) is not None
    weight, bias = _weight(n, k, n + k), _rows(1, n, n)[0]
    packed = pack_weight(weight)
    for rows in (1, 3, cpu_gemv.MAX_ROWS):
        x = _rows(rows, k, rows)
        assert cpu_gemv.applies(x, packed)
        got = linear(x, packed, bias)
        exact = x.double() @ weight.double().T + bias.double()
        # float32 sums of bf16 products, rounded to bf16 once: half a bf16 ulp plus float32 summation error
        assert got.dtype == torch.bfloat16 and got.shape == (rows, n)
        assert torch.allclose(got.double(), exact, rtol=2**-8, atol=1e-4 * float(exact.abs().max()))
        onednn = torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")
        assert torch.allclose(got.float(), onednn.float(), rtol=2**-6, atol=1e-2)


def test_each_output_is_independent_of_rows_threads_and_strides() -> None:
    n, k = 1000, 70
    weight, bias = _weight(n, k, 3), _rows(1, n, 9)[0]
    packed = pack_weight(weight)
    x = _rows(cpu_gemv.MAX_ROWS, k, 5)
    together = linear(x, packed, bias)
    one_by_one = torch.cat([linear(x[i : i + 1], packed, bias) for i in range(x.shape[0])])
    assert torch.equal(together, one_by_one)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        single_thread = linear(x, packed, bias)
    finally:
        torch.set_num_threads(threads)
    assert torch.equal(together, single_thread)
    strided = torch.zeros(cpu_gemv.MAX_ROWS, 2 * k, dtype=torch.bfloat16)[:, ::2]
    strided.copy_(x)
    assert torch.equal(linear(strided, packed, bias), together)


def test_without_bias_and_the_rows_it_leaves_to_onednn() -> None:
    weight = _weight(100, 64, 7)
    packed = pack_weight(weight)
    x = _rows(1, 64, 1)
    exact = x.double() @ weight.double().T
    assert torch.allclose(linear(x, packed).double(), exact, rtol=2**-7, atol=2e-3)
    assert not cpu_gemv.applies(_rows(cpu_gemv.MAX_ROWS + 1, 64, 2), packed)
    assert not cpu_gemv.applies(x.float(), packed)
    assert not cpu_gemv.applies(x, weight)  # a plain weight is F.linear's
    assert not cpu_gemv.reads(weight)


def test_odd_columns_are_not_the_kernels_layout() -> None:
    assert cpu_gemv.packed_layout(64, 63) is None
    packed = pack_weight(_weight(64, 63, 1))
    x = _rows(1, 63, 4)
    assert not cpu_gemv.applies(x, packed)
    assert torch.allclose(linear(x, packed).float(), (x.float() @ _weight(64, 63, 1).float().T), atol=2e-2)


@needs_the_layout
def test_a_freed_weight_leaves_the_registry() -> None:
    packed = pack_weight(_weight(96, 64, 2))
    key = id(packed)
    assert cpu_gemv.reads(packed) and key in cpu_gemv._layouts
    del packed
    assert key not in cpu_gemv._layouts


def test_without_a_compiler_or_when_switched_off_it_says_why(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))  # nothing built there yet
    monkeypatch.setenv("CC", str(tmp_path / "no-such-compiler"))
    cpu_kernels.clear_caches()
    try:
        status = cpu_kernels.status()
        assert not status.active and "no C compiler" in status.reason
        monkeypatch.setenv(cpu_kernels.DISABLE_ENV, "off")
        cpu_kernels.clear_caches()
        assert cpu_kernels.status() == cpu_kernels.KernelStatus(False, f"{cpu_kernels.DISABLE_ENV}=off")
    finally:
        monkeypatch.undo()
        cpu_kernels.clear_caches()
    assert cpu_kernels.status().active
