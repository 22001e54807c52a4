"""Giving freed heap memory back to the operating system when the engine goes idle.

A prefill chunk allocates a few hundred MiB of intermediates (delta-rule chunk tensors, MLP activations)
and frees them when it ends. glibc keeps freed blocks below its mmap threshold (which grows up to 32 MiB as
large blocks are freed) inside its heaps, so the resident size of an idle server stayed several hundred
MiB above what it holds. `malloc_trim(0)` returns the free pages of every heap; it takes tens of
milliseconds, so it runs once per busy-to-idle transition, on the compute thread, and once when the worker
first goes idle after start: loading the tokenizer after the weights (whose packing `ModelRuntime` trims
at once) frees about 140 MiB of parsed JSON, which an idle server held until its first request.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable


def heap_trimmer() -> Callable[[], None] | None:
    """A function that returns free heap pages to the OS (glibc's `malloc_trim`), or None where the C
    library has none (musl, macOS)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        trim = ctypes.CDLL(name).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int

    def trim_now() -> None:
        trim(0)

    return trim_now
