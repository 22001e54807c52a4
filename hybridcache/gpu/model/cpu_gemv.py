"""Decode's bf16 products on the CPU by a kernel of our own (`cpu_gemv.c`), over oneDNN's packed weights.

Decode multiplies one to a few rows by every weight of the model, so its speed is the rate at which the
weights stream from memory. oneDNN's bf16 matmul, built for many rows, read the `small` model's packed
weights at 11-12 GiB/s for one row, where a plain sum over memory reads 18.5-19.7 GiB/s; the kernel reads
the same packed bytes (no second copy of the weights) at 17.6 GiB/s (2 threads, this machine). Prefill
keeps oneDNN, whose AMX tiles are much faster for whole tiles of rows.

The kernel (built and loaded by `cpu_kernels.py`) applies only where everything it relies on holds,
checked rather than assumed: the kernels library is in use here, torch exposes the packed tensor's bytes
(`torch.ops.mkldnn.data_ptr`/`_nbytes`), and the packed layout of the weight's shape is one the kernel
reads: blocks of 32 or 64 output rows, pairs of k interleaved (oneDNN's choice for bf16: 32 on a CPU with
AMX, 64 on AVX512-BF16 without it; `packed_layout` verifies it per shape with a probe). Anything else
leaves the product to oneDNN. On an AVX512-BF16 CPU without AMX (AMD EPYC, 2 threads), where oneDNN packs
64-row blocks, the kernel read the `small` lm_head at 27.4 GiB/s for one row against oneDNN's 16.8 (one
busy window; with the machine quiet it read 56-58 GiB/s, as fast as a plain AVX-512 sum over as many
bytes, so prefetch distance and streams per thread have nothing left to gain), and `bench peer` decoded
23.3 / 16.3 tok/s at 2k / 8k context against 15.8 / 11.9 with the products left to oneDNN (llama.cpp on
the same machine: 18.7 / 16.4).
"""

from __future__ import annotations

import ctypes
import functools
import weakref
from typing import NamedTuple

import torch

from hybridcache.gpu.model import cpu_kernels
from hybridcache.gpu.model.onednn_packing import reorder

MAX_ROWS = 4
"""Rows of x up to which decode uses the kernel. Up to 4 it matched or beat oneDNN (one row: 1.3-1.9x);
from 8 rows the products are no longer bound by memory and oneDNN's AMX path is faster (measured on the
`small` shapes, 2 threads)."""
BLOCK_ROWS = (32, 64)
"""The block heights of oneDNN's bf16 packing that the kernel reads."""


class PackedLayout(NamedTuple):
    block_rows: int  # output rows per block (one of BLOCK_ROWS)
    padded_columns: int  # k padded with zeros


_layouts: dict[int, tuple[int, PackedLayout]] = {}
"""id(packed weight) -> (address of its bytes, its layout), for the weights the kernel reads; entries
leave with their weight (weakref.finalize)."""


def register(packed: torch.Tensor) -> None:
    """Let decode use the kernel on `packed` (a weight from `linear.pack_weight`) when its layout is the
    one the kernel reads; otherwise it stays oneDNN's."""
    if cpu_kernels.library() is None or not _packed_bytes_exposed():
        return
    n, k = packed.shape
    layout = packed_layout(n, k)
    if layout is None:
        return
    key = id(packed)
    _layouts[key] = (int(torch.ops.mkldnn.data_ptr(packed)), layout)
    weakref.finalize(packed, _layouts.pop, key, None)


def reads(weight: torch.Tensor) -> bool:
    """Whether the kernel reads `weight` (registered: packed in a layout it knows)."""
    return id(weight) in _layouts


def applies(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `product(x, weight)` runs the kernel: a registered weight, bf16 rows, at most MAX_ROWS."""
    return x.dim() == 2 and x.shape[0] <= MAX_ROWS and x.dtype == torch.bfloat16 and reads(weight)


def product(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """`x @ weight.T + bias` for a registered packed `weight` (check `applies` first). Pure."""
    if x.stride(-1) != 1:
        x = x.contiguous()
    address, layout = _layouts[id(weight)]
    n, k = weight.shape
    out = torch.empty(x.shape[0], n, dtype=torch.bfloat16)
    if bias is not None:
        bias = bias.to(torch.bfloat16).contiguous()  # the kernel reads bf16 (the model's biases are)
    cpu_kernels.library().hc_packed_gemv_bf16(
        x.data_ptr(), x.stride(0), x.shape[0], address,
        bias.data_ptr() if bias is not None else None,
        out.data_ptr(), n, n, k, layout.padded_columns, layout.block_rows, torch.get_num_threads(),
    )  # fmt: skip
    return out


@functools.cache
def packed_layout(n: int, k: int) -> PackedLayout | None:
    """oneDNN's packing of an `[n, k]` bf16 weight when it is a layout the kernel reads (blocks of
    BLOCK_ROWS rows, k pairs interleaved, zero padding), None when it is any other.

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
    elements = int(torch.ops.mkldnn._nbytes(packed)) // 2
    raw = torch.frombuffer(
        (ctypes.c_uint8 * (elements * 2)).from_address(int(torch.ops.mkldnn.data_ptr(packed))),
        dtype=torch.int16,
    )
    for block_rows in BLOCK_ROWS:
        rows_padded = -(-n // block_rows) * block_rows
        padded_columns = elements // rows_padded
        if elements % rows_padded or padded_columns < k or padded_columns % 2:
            continue
        expected = torch.zeros(rows_padded, padded_columns, dtype=torch.int16)
        expected[:n, :k] = probe
        blocks = expected.view(rows_padded // block_rows, block_rows, padded_columns // 2, 2).transpose(1, 2)
        if torch.equal(raw, blocks.reshape(-1)):
            return PackedLayout(block_rows, padded_columns)
    return None


@functools.cache
def _packed_bytes_exposed() -> bool:
    return all(hasattr(torch.ops.mkldnn, name) for name in ("data_ptr", "_nbytes"))
