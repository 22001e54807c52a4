"""Token embedding rows read from the checkpoint file on demand, for CPUs where the table is not needed whole.

With bf16 weights packed for oneDNN, a tied lm_head is a packed copy and the mapped embedding table serves
only lookups of a few rows per step. Reading those rows through the mapping costs far more resident memory
than it reads: a page fault on a file mapping maps the whole (large) page-cache folio around it, about 1 MiB
per lookup here, so a few hundred prompt tokens made a third of the table resident. `pread` of each row
into a fresh tensor costs exactly the rows (the file stays in the page cache, which is not this process's
memory) at a few microseconds per row.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch


class EmbeddingRows:
    """Rows of a `[rows, columns]` table stored at `offset` in `path` as `stored_dtype`. Holds one open
    file descriptor (closed with `close()` or when garbage collected)."""

    def __init__(
        self, path: Path, offset: int, rows: int, columns: int, stored_dtype: torch.dtype, dtype: torch.dtype
    ) -> None:
        self.rows = rows
        self.columns = columns
        self.stored_dtype = stored_dtype
        self.dtype = dtype
        self._offset = offset
        self._row_bytes = columns * stored_dtype.itemsize
        self._fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))

    def lookup(self, ids: torch.Tensor) -> torch.Tensor:
        """The rows of int64 `ids` (`[n]`) as `[n, columns]` in `dtype`. Raises IndexError for an id outside
        the table and OSError when the file cannot be read. Pure (reads the file)."""
        wanted = ids.tolist()
        out = torch.empty(len(wanted), self.columns, dtype=self.stored_dtype)
        raw = memoryview(out.view(torch.uint8).numpy()).cast("B")
        row_bytes = self._row_bytes
        for index, row in enumerate(wanted):
            if not 0 <= row < self.rows:
                raise IndexError(f"token id {row} is outside the embedding table of {self.rows} rows")
            target = raw[index * row_bytes : (index + 1) * row_bytes]
            if os.preadv(self._fd, [target], self._offset + row * row_bytes) != row_bytes:
                raise OSError(f"short read of embedding row {row}")
        return out if self.dtype == self.stored_dtype else out.to(self.dtype)

    def close(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def __del__(self) -> None:
        self.close()
