"""Decode's bf16 products on the CPU by a kernel of our own (`cpu_gemv.c`), over oneDNN's packed weights.

Decode multiplies one to a few rows by every weight of the model, so its speed is the rate at which the
weights stream from memory. oneDNN's bf16 matmul, built for many rows, read the `small` model's packed
weights at 11-12 GiB/s for one row, where a plain sum over memory reads 18.5-19.7 GiB/s; the kernel reads
the same packed bytes (no second copy of the weights) at 17.6 GiB/s (2 threads, this machine). Prefill
keeps oneDNN, whose AMX tiles are much faster for whole tiles of rows.

The kernel (built and loaded by `cpu_kernels.py`) applies only where everything it relies on holds,
checked rather than assumed: the kernels library is in use here, torch exposes the packed tensor's bytes
(`torch.ops.mkldnn.data_ptr`/`_nbytes`), and the packed layout of the weight's shape is the one the kernel
reads: blocks of 32 output rows, pairs of k interleaved (oneDNN's choice for bf16 on this CPU;
`packed_layout` verifies it per shape with a probe). Anything else leaves the product to oneDNN.
"""

from __future__ import annotations

import ctypes
import functools
import weakref

import torch

from hybridcache.gpu.model import cpu_kernels
from hybridcache.gpu.model.onednn_packing import reorder

MAX_ROWS = 4
"""Rows of x up to which decode uses the kernel. Up to 4 it matched or beat oneDNN (one row: 1.3-1.9x);
from 8 rows the products are no longer bound by memory and oneDNN's AMX path is faster (measured on the
`small` shapes, 2 threads)."""
BLOCK_ROWS = 32


_layouts: dict[int, tuple[int, int]] = {}
"""id(packed weight) -> (address of its bytes, padded column count), for the weights the kernel reads;
entries leave with their weight (weakref.finalize)."""


def register(packed: torch.Tensor) -> None:
    """Let decode use the kernel on `packed` (a weight from `linear.pack_weight`) when its layout is the
    one the kernel reads; otherwise it stays oneDNN's."""
    if cpu_kernels.library() is None or not _packed_bytes_exposed():
        return
    n, k = packed.shape
    padded_columns = packed_layout(n, k)
    if padded_columns is None:
        return
    key = id(packed)
    _layouts[key] = (int(torch.ops.mkldnn.data_ptr(packed)), padded_columns)
    weakref.finalize(packed, _layouts.pop, key, None)


def applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `product(x, weight)` runs the kernel: a registered weight, bf16 rows, at most MAX_ROWS."""
    return x.dim() == 2 and x.shape[0] <= MAX_ROWS and x.dtype == torch.bfloat16 and id(weight) in _layouts


def product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ weight.T + bias` for a registered packed `weight` (check `applies` first). Pure."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    address, padded_columns = _layouts[id(weight)]
    n, k = weight.shape
    out = torch.empty(x.shape[0], n, dtype=torch.bfloat16)
    if bias is not None:
        bias = bias.to(torch.bfloat16).contiguous()  # the kernel reads bf16 (the model's biases are)
    cpu_kernels.library().hc_packed_gemv_bf16(
        x.data_ptr(), x.stride(0), x.shape[0], address,
        bias.data_ptr() if bias is not None else None,
        out.data_ptr(), n, n, k, padded_columns, torch.get_num_threads(),
    )  # fmt: skip
    return out


@functools.cache
def packed_layout(n: int, k: int) -> int | None:
    """The padded column count of oneDNN's packing of an `[n, k]` bf16 weight when it is the layout the
    kernel reads (32-row blocks, k pairs interleaved, zero padding), None when it is any other.

    Packs a probe of random normal bf16 numbers (a reorder copies their bits unchanged; each element is a
    random row code plus a random column code) and compares the packed bytes with the probe arranged in
    that layout: another layout would have to match millions of random values by chance.
    """
    if k % 2:
        return None
    generator = torch.Generator().manual_seed(n * 65_537 + k)
    row_codes = torch.randint(0x0080, 0x3F80, (n, 1), dtype=torch.int16, generator=generator)
    column_codes = torch.randint(0, 0x4000, (1, k), dtype=torch.int16, generator=generator)
    probe = row_codes + column_codes  # 0x0080..0x7F7F: positive normal bf16 numbers, cheap to make
    packed = reorder(probe.view(torch.bfloat16))
    rows_padded = -(-n // BLOCK_ROWS) * BLOCK_ROWS
    elements = int(torch.ops.mkldnn._nbytes(packed)) // 2
    padded_columns = elements // rows_padded
    if elements % rows_padded or padded_columns < k or padded_columns % 2:
        return None
    expected = torch.zeros(rows_padded, padded_columns, dtype=torch.int16)
    expected[:n, :k] = probe
    expected = expected.view(rows_padded // BLOCK_ROWS, BLOCK_ROWS, padded_columns // 2, 2).transpose(1, 2)
    size = elements * 2
    raw = torch.frombuffer(
        (ctypes.c_uint8 * size).from_address(int(torch.ops.mkldnn.data_ptr(packed))), dtype=torch.int16
    )
    return padded_columns if torch.equal(raw, expected.reshape(-1)) else None


@functools.cache
def _packed_bytes_exposed() -> bool:
    return all(hasattr(torch.ops.mkldnn, name) for name in ("data_ptr", "_nbytes"))
