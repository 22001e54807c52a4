"""Zero-filled tensors whose CPU memory is committed page by page as it is first touched.

The KV pool and the state slots are sized for a budget, but an idle or lightly used server touches a small
part of them. `torch.zeros` writes every byte at once, so on a CPU the whole budget would be resident from
the start. An anonymous private mapping reads as zeros and the kernel commits its pages only when they are
touched, so resident memory follows use, up to the budget. (Reading an untouched page commits it too on
some kernels, so this pays only because the forward reads the pages of its lanes' block tables alone.)
On other devices the memory is an ordinary zeroed allocation. `release_pages` hands the pages of a region
whose contents no longer matter back to the system, so resident memory also falls when use does.
"""

from __future__ import annotations

import math
import mmap

import torch

from hybridcache.gpu import madvise
from hybridcache.gpu.madvise import MADV_DONTNEED, PAGE_BYTES, inner_pages

MAPPED_MIN_BYTES = 1 << 20
"""Smaller tensors are plain `torch.zeros`: a mapping per tiny plane would only add system calls."""


def zeroed(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device | str = "cpu") -> torch.Tensor:
    """A zero-filled tensor of `shape`; on a CPU (when at least `MAPPED_MIN_BYTES`) backed by an anonymous
    mapping that commits memory only where written. The tensor owns the mapping (unmapped when freed)."""
    count = math.prod(shape)
    nbytes = count * dtype.itemsize
    if torch.device(device).type != "cpu" or nbytes < MAPPED_MIN_BYTES:
        return torch.zeros(shape, dtype=dtype, device=device)
    mapping = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(mapping, dtype=dtype, count=count).view(shape)


def release_pages(region: torch.Tensor) -> int:
    """Give the whole pages inside the contiguous CPU tensor `region` back to the system; they read as zeros
    afterwards and are committed again when next written. For memory whose contents no longer matter (a
    freed state slot). Returns the bytes released (0 off a CPU, without madvise, or when refused)."""
    call = madvise.MADVISE
    if region.device.type != "cpu" or call is None or not region.is_contiguous():
        return 0
    start, length = inner_pages(region.data_ptr(), region.numel() * region.element_size(), PAGE_BYTES)
    if length == 0 or call(start, length, MADV_DONTNEED) != 0:
        return 0
    return length
