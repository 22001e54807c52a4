"""`madvise(2)` through the C library, for the memory helpers (`huge_pages`, `zeroed_memory`).

Python's `mmap.madvise` needs the mapping object; tensors hand out addresses. None where there is no such
call (not Linux, no C library found).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from collections.abc import Callable

PAGE_BYTES = 4096
MADV_DONTNEED = 4
MADV_HUGEPAGE = 14
MADV_COLLAPSE = 25


def _load() -> Callable[[int, int, int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    try:
        function = ctypes.CDLL(name, use_errno=True).madvise
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    function.restype = ctypes.c_int
    return function


MADVISE = _load()
"""madvise(address, length, advice) -> 0 on success; None where unavailable."""


def inner_pages(address: int, nbytes: int, page_bytes: int) -> tuple[int, int]:
    """The whole pages of `page_bytes` inside [address, address + nbytes): (start, length), length 0 if
    none. Pure."""
    start = -(-address // page_bytes) * page_bytes
    end = (address + nbytes) // page_bytes * page_bytes
    return start, max(end - start, 0)
