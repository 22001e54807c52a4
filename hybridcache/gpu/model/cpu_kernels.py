"""Our CPU kernels (`cpu_gemv.c`, `cpu_gdn_step.c`, `cpu_rms_norm.c`, `cpu_decode_attention.c`, with the
shared `cpu_simd.h`): built once per machine, loaded.

The C sources are compiled together with the system compiler (`cc`, or `$CC`) into one shared library in
the user cache (`~/.cache/hybridcache/kernels/`, named by a digest of the sources and flags, written
atomically so concurrent starts never load half a file), then loaded with ctypes. They use AVX512-BF16 and
OpenMP; the library links the OpenMP runtime by its soname, which resolves to the one torch already loaded,
so the kernels share torch's thread pool.

`library()` is None, and `status()` says why, when the CPU lacks AVX512-BF16, no compiler builds the
sources, or `HYBRIDCACHE_CPU_KERNELS=off`; the model then runs torch's code for everything.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import os
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hybridcache.gpu.dtype_choice import cpu_flags
from hybridcache.tools.make_tiny_model import cache_root

SOURCES = tuple(
    Path(__file__).with_name(name)
    for name in ("cpu_gemv.c", "cpu_gdn_step.c", "cpu_rms_norm.c", "cpu_decode_attention.c")
)
HEADERS = (Path(__file__).with_name("cpu_simd.h"),)
COMPILE_FLAGS = (
    "-O3", "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512bf16", "-fopenmp", "-fPIC", "-shared",
)  # fmt: skip
DISABLE_ENV = "HYBRIDCACHE_CPU_KERNELS"
COMPILE_TIMEOUT_S = 120

_I64, _PTR, _INT, _FLOAT = ctypes.c_int64, ctypes.c_void_p, ctypes.c_int, ctypes.c_float
SIGNATURES = {
    "hc_packed_gemv_bf16": [_PTR, _I64, _I64, _PTR, _PTR, _PTR, _I64, _I64, _I64, _I64, _I64, _INT],
    "hc_gdn_decode_step": [_PTR, _I64] + [_PTR] * 9 + [_I64] * 6 + [_FLOAT, _FLOAT, _INT],
    "hc_rms_norm_bf16": [_PTR, _I64, _I64, _PTR, _FLOAT, _PTR, _INT],
    "hc_decode_attention_bf16": [_PTR] * 4 + [_I64] * 5 + [_FLOAT, _PTR, _INT],
}
RETURNS = {"hc_decode_attention_bf16": ctypes.c_int}


@dataclass(frozen=True)
class KernelStatus:
    """Whether the kernels are in use, and why (for the startup ledger)."""

    active: bool
    reason: str


def status() -> KernelStatus:
    """Whether decode runs the kernels here, with the reason (builds them on first use)."""
    if library() is None:
        return KernelStatus(False, _build_reason())
    return KernelStatus(True, f"own AVX512-BF16 kernels ({library_path()})")


@functools.cache
def library() -> ctypes.CDLL | None:
    """The loaded kernels, their argument types declared; None where they cannot run here."""
    if _build_reason():
        return None
    loaded = ctypes.CDLL(str(library_path()))
    for name, arguments in SIGNATURES.items():
        function = getattr(loaded, name)
        function.argtypes = arguments
        function.restype = RETURNS.get(name)
    return loaded


@functools.cache
def library_path() -> Path:
    digest = hashlib.sha256()
    for source in SOURCES + HEADERS:
        digest.update(source.read_bytes())
    digest.update(" ".join(COMPILE_FLAGS).encode())
    return cache_root() / "kernels" / f"cpu_kernels-{digest.hexdigest()[:16]}.so"


@functools.cache
def _build_reason() -> str:
    """Empty when the library is built and usable here; otherwise why not (builds it on first call)."""
    if os.environ.get(DISABLE_ENV, "").lower() in ("0", "off", "false", "no"):
        return f"{DISABLE_ENV}={os.environ[DISABLE_ENV]}"
    if "avx512_bf16" not in cpu_flags():
        return "the CPU has no avx512_bf16"
    path = library_path()
    if path.exists():
        return ""
    compiler = os.environ.get("CC", "cc")
    path.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=path.parent) as scratch:
        built = Path(scratch) / path.name
        command = [compiler, *COMPILE_FLAGS, "-o", str(built), *map(str, SOURCES), "-lm"]
        try:
            result = subprocess.run(command, capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as error:
            return f"no C compiler ({compiler}: {error})"
        if result.returncode != 0:
            return f"{compiler} failed: {result.stderr.strip()[-300:]}"
        os.replace(built, path)  # atomic: a concurrent build or load sees the whole file or none
    return ""


def clear_caches() -> None:
    """Forget the build outcome (tests that change the environment)."""
    for cached in (_build_reason, library_path, library):
        cached.cache_clear()
