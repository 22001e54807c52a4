"""Decode's bf16 products on the CPU by a kernel of our own (`cpu_gemv.c`), over oneDNN's packed weights.

Decode multiplies one to a few rows by every weight of the model, so its speed is the rate at which the
weights stream from memory. oneDNN's bf16 matmul, built for many rows, read packed weights at about 60 %
of the streaming rate for one row (profile in issue 16); the kernel here reads the same packed bytes (no
second copy of the weights) at close to it. Prefill keeps oneDNN, whose AMX tiles are much faster for
whole tiles of rows.

The kernel is C compiled once per machine with the system compiler (`cc`, or `$CC`) into the user cache
(`~/.cache/hybridcache/kernels/`, named by a digest of the source and flags) and loaded with ctypes. It
applies only where everything it relies on holds, checked rather than assumed:
- the CPU has AVX512-BF16 (`/proc/cpuinfo`), a compiler builds the source, and torch exposes the packed
  tensor's bytes (`torch.ops.mkldnn.data_ptr`/`_nbytes`);
- the packed layout of each weight shape is the one the kernel reads: blocks of 32 output rows, pairs of
  k interleaved (oneDNN's choice for bf16 on this CPU; `packed_layout` verifies it per shape by packing a
  probe whose every element names its own (row, column) and reading the bytes back).
Anything else (no compiler, another CPU, another oneDNN layout, `HYBRIDCACHE_CPU_GEMV=off`) leaves every
product to oneDNN, and `status()` says why.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import subprocess
import tempfile
import weakref
from dataclasses import dataclass
from pathlib import Path

import torch

from hybridcache.gpu.dtype_choice import cpu_flags
from hybridcache.gpu.model.onednn_packing import reorder
from hybridcache.tools.make_tiny_model import cache_root

SOURCE = Path(__file__).with_name("cpu_gemv.c")
COMPILE_FLAGS = (
    "-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-fopenmp", "-fPIC", "-shared",
)  # fmt: skip
MAX_ROWS = 4
"""Rows of x up to which decode uses the kernel. Up to 4 it matched or beat oneDNN (one row: 1.3-1.9x);
from 8 rows the products are no longer bound by memory and oneDNN's AMX path is faster (measured on the
`small` shapes, 2 threads)."""
BLOCK_ROWS = 32
DISABLE_ENV = "HYBRIDCACHE_CPU_GEMV"


@dataclass(frozen=True)
class GemvStatus:
    """Whether the kernel is in use, and why (for the startup ledger)."""

    active: bool
    reason: str


_layouts: dict[int, tuple[int, int]] = {}
"""id(packed weight) -> (address of its bytes, padded column count), for the weights the kernel reads;
entries leave with their weight (weakref.finalize)."""


def register(packed: torch.Tensor) -> None:
    """Let decode use the kernel on `packed` (a weight from `linear.pack_weight`) when its layout is the
    one the kernel reads; otherwise it stays oneDNN's."""
    if _library() is None:
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
        bias = bias.contiguous()
    _library().hc_packed_gemv_bf16(
        x.data_ptr(), x.stride(0), x.shape[0], address,
        bias.data_ptr() if bias is not None else None,
        out.data_ptr(), n, n, k, padded_columns, torch.get_num_threads(),
    )  # fmt: skip
    return out


def status() -> GemvStatus:
    """Whether decode's products run the kernel here, with the reason (compiles it on first use)."""
    if _library() is None:
        return GemvStatus(False, _build_reason())
    return GemvStatus(True, f"own AVX512-BF16 kernel ({_library_path()})")


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
def _library() -> ctypes.CDLL | None:
    if _build_reason():
        return None
    library = ctypes.CDLL(str(_library_path()))
    function = library.hc_packed_gemv_bf16
    i64, pointer = ctypes.c_int64, ctypes.c_void_p
    function.argtypes = [pointer, i64, i64, pointer, pointer, pointer, i64, i64, i64, i64, ctypes.c_int]
    function.restype = None
    return library


@functools.cache
def _build_reason() -> str:
    """Empty when the kernel is built and usable here; otherwise why not (builds it on first call)."""
    if os.environ.get(DISABLE_ENV, "").lower() in ("0", "off", "false", "no"):
        return f"{DISABLE_ENV}={os.environ[DISABLE_ENV]}"
    if "avx512_bf16" not in cpu_flags():
        return "the CPU has no avx512_bf16"
    if not all(hasattr(torch.ops.mkldnn, name) for name in ("data_ptr", "_nbytes", "_reorder_linear_weight")):
        return "this torch does not expose oneDNN's packed bytes"
    path = _library_path()
    if path.exists():
        return ""
    compiler = os.environ.get("CC", "cc")
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as scratch:
        built = Path(scratch) / path.name
        try:
            result = subprocess.run(
                [compiler, *COMPILE_FLAGS, "-o", str(built), str(SOURCE)],
                capture_output=True, text=True, timeout=120,
            )  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"no C compiler ({compiler}: {error})"
        if result.returncode != 0:
            return f"{compiler} failed: {result.stderr.strip()[-300:]}"
        os.replace(built, path)  # atomic: a concurrent build or load sees the whole file or none
    return ""


@functools.cache
def _library_path() -> Path:
    digest = hashlib.sha256(SOURCE.read_bytes() + " ".join(COMPILE_FLAGS).encode()).hexdigest()[:16]
    return cache_root() / "kernels" / f"cpu_gemv-{digest}.so"
