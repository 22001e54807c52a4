"""Id bookkeeping shared by the readers: disjoint namespaces for scoped ids, and common-prefix id tables.

`IdSpace` belongs to one `load_trace` call and mutates as files are read: it hands out disjoint ranges of
global ids (one per id namespace, e.g. one WEKA file) and position-indexed ids for prefixes made common
to every conversation of a kind (the shared tool + system prefix).
"""

from __future__ import annotations

import numpy as np


class IdSpace:
    """Allocates global block ids for one trace load. Mutable; not shared between loads."""

    def __init__(self) -> None:
        self._next_id = 0
        self._common: dict[str, np.ndarray] = {}

    def reserve(self, count: int) -> int:
        """Mutates: reserves `count` fresh ids and returns the first (they are first .. first + count - 1)."""
        first = self._next_id
        self._next_id += count
        return first

    def common_prefix(self, key: str, length: int) -> np.ndarray:
        """Ids for positions 0 .. length-1 of the prefix named `key`: the same ids for every caller.

        Mutates: grows the table for `key` when `length` exceeds it (new positions get fresh ids).
        """
        table = self._common.get(key, np.zeros(0, dtype=np.int64))
        if length > len(table):
            extra = length - len(table)
            first = self.reserve(extra)
            table = np.concatenate([table, np.arange(first, first + extra, dtype=np.int64)])
            self._common[key] = table
        return table[:length]
