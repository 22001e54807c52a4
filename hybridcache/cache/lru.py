"""The device LRU (§9.1): two intrusive doubly linked lists with sentinels, host-backed and unbacked.

Entries are block nodes and snapshot tails (anything with ``LruLinks``). The head of a list is its
least recently used end; entries join at the MRU end. Owned and mutated only by ``PrefixIndex.apply``.
"""

from __future__ import annotations

from collections.abc import Iterator

from hybridcache.cache.records import LruLinks, LruList


class _Sentinel(LruLinks):
    __slots__ = ()

    def __init__(self) -> None:
        super().__init__()
        self.lru_prev = self
        self.lru_next = self


class DeviceLru:
    """Two lists; ``push_mru`` / ``remove`` are O(1). Mutating calls raise ValueError on misuse."""

    __slots__ = ("_counts", "_sentinels")

    def __init__(self) -> None:
        self._sentinels = {LruList.BACKED: _Sentinel(), LruList.UNBACKED: _Sentinel()}
        self._counts = {LruList.BACKED: 0, LruList.UNBACKED: 0}

    def __len__(self) -> int:
        return self._counts[LruList.BACKED] + self._counts[LruList.UNBACKED]

    def count(self, which: LruList) -> int:
        return self._counts[which]

    def push_mru(self, entry: LruLinks, which: LruList) -> None:
        """Append ``entry`` at the MRU end of ``which``. Mutates; raises ValueError if already listed."""
        if entry.lru_list != LruList.NONE:
            raise ValueError("entry is already on a device LRU list")
        sentinel = self._sentinels[which]
        last = sentinel.lru_prev
        assert last is not None
        entry.lru_prev = last
        entry.lru_next = sentinel
        last.lru_next = entry
        sentinel.lru_prev = entry
        entry.lru_list = which
        self._counts[which] += 1

    def remove(self, entry: LruLinks) -> None:
        """Unlink ``entry`` if listed (no-op otherwise). Mutates."""
        which = entry.lru_list
        if which == LruList.NONE:
            return
        prev, nxt = entry.lru_prev, entry.lru_next
        assert prev is not None and nxt is not None
        prev.lru_next = nxt
        nxt.lru_prev = prev
        entry.lru_prev = entry.lru_next = None
        entry.lru_list = LruList.NONE
        self._counts[which] -= 1

    def iter_lru_first(self, which: LruList) -> Iterator[LruLinks]:
        """Entries of ``which`` from the LRU end. Pure; do not mutate the list while iterating."""
        sentinel = self._sentinels[which]
        entry = sentinel.lru_next
        while entry is not sentinel:
            assert entry is not None
            yield entry
            entry = entry.lru_next
