"""MappedSlabFile: host slab memory backed by a file (`--cache-dir DIR`: `DIR/slabs`), mapped shared.

The file is as long as the host tier (sparse: blocks never written take no disk space) and slab `s` lives
at byte `s * slab_bytes` (chunks are consecutive, every chunk holds whole slabs). The engine copies into
the mapping exactly as into anonymous memory; `sync()` (fdatasync) pushes the dirty pages to the disk,
and a restart maps the same bytes back without reading them into a second buffer.
"""

from __future__ import annotations

import contextlib
import mmap
import os
from pathlib import Path

import torch

from hybridcache.persistence.file_safety import create_private_file


class MappedSlabFile:
    """Opens (creating it 0600 when absent) and sizes the slab file; `map(offset, nbytes)` maps a
    chunk. Raises OSError."""

    def __init__(self, path: str | os.PathLike[str], file_bytes: int) -> None:
        self.path = Path(path)
        with contextlib.suppress(FileExistsError):  # a restart maps the existing file
            os.close(create_private_file(self.path))
        self._fd = os.open(self.path, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
        self.file_bytes = file_bytes
        if os.fstat(self._fd).st_size != file_bytes:
            os.ftruncate(self._fd, file_bytes)  # a changed budget keeps the slabs that still fit
        self._maps: list[mmap.mmap] = []

    def map(self, offset: int, nbytes: int) -> torch.Tensor:
        """The bytes ``[offset, offset + nbytes)`` as a writable uint8 tensor over a shared mapping."""
        mapping = mmap.mmap(self._fd, nbytes, flags=mmap.MAP_SHARED, offset=offset)
        self._maps.append(mapping)
        return torch.frombuffer(mapping, dtype=torch.uint8)

    def sync(self) -> None:
        """Make every byte written through the mappings durable (fdatasync flushes their dirty pages)."""
        os.fdatasync(self._fd)

    def close(self) -> None:
        """Close the descriptor; the mappings stay valid until the tensors over them are freed."""
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
