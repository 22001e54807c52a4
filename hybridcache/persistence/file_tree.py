"""The tree shape a prefix-cache file's tables describe: depths, anchor paths and frontiers. No torch."""

from __future__ import annotations

from hybridcache.cache.ids import BLOCK_TOKENS
from hybridcache.persistence.cache_file import BlockRecord, CacheFileTables, SnapshotRecord

FILE_ROOT = 0
"""The id file records use for the root (it covers no tokens and is never stored)."""


class FileTree:
    """Derived from validated tables (parents before children). Read-only after construction."""

    def __init__(self, tables: CacheFileTables) -> None:
        self.tables = tables
        self.blocks: dict[int, BlockRecord] = {block.node: block for block in tables.blocks}
        self.depth: dict[int, int] = {FILE_ROOT: -1}
        self.children: dict[int, list[int]] = {FILE_ROOT: []}
        for block in tables.blocks:
            self.depth[block.node] = self.depth[block.parent] + 1
            self.children.setdefault(block.parent, []).append(block.node)
            self.children.setdefault(block.node, [])
        self.snapshots_at: dict[int, list[SnapshotRecord]] = {}
        for snap in tables.snapshots:
            self.snapshots_at.setdefault(snap.anchor, []).append(snap)

    def path(self, node: int) -> list[int]:
        """Block ids from block 0 down to ``node`` (the root excluded). Pure."""
        out: list[int] = []
        while node != FILE_ROOT:
            out.append(node)
            node = self.blocks[node].parent
        out.reverse()
        return out

    def frontier(self, snap: SnapshotRecord) -> int:
        """Tokens the snapshot's state covers: its anchor path plus its tail. Pure."""
        return BLOCK_TOKENS * (self.depth[snap.anchor] + 1) + len(snap.tail_tokens)

    def tokens_to(self, node: int) -> list[int]:
        """Every token on the path to ``node``. Pure."""
        return [token for block in self.path(node) for token in self.blocks[block].tokens]
