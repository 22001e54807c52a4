"""Zero-filled tensors whose CPU memory is committed page by page as it is first touched.

The KV pool and the state slots are sized for a budget, but an idle or lightly used server touches a small
part of them. `torch.zeros` writes every byte at once, so on a CPU the whole budget would be resident from
the start. An anonymous private mapping reads as zeros and the kernel commits its pages only when they are
touched, so resident memory follows use, up to the budget. (Reading an untouched page commits it too on
some kernels, so this pays only because the forward reads the pages of its lanes' block tables alone.)
On other devices the memory is an ordinary zeroed allocation.
"""

from __future__ import annotations

import math
import mmap

import torch

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
