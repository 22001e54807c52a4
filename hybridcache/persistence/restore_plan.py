"""plan_host_restore: which snapshots (and exactly their path blocks) a host tier restores (spec §5.5).

A tier that holds the whole file restores all of it. A smaller one takes whole snapshots greedily by
density, the GDSF value of §9.3 without its time base::

    density(s) = (1 + hits) · prefill_seconds(base=0, tokens=F_s) / (image + tail + anchor path bytes)

highest first (ties: table order), each with the path blocks it needs that are not already chosen,
skipping any that no longer fits. Pure; reads only the tables, so nothing is read before choosing.
"""

from __future__ import annotations

from typing import NamedTuple

from hybridcache.cache.cost_model import CacheCostModel
from hybridcache.persistence.cache_file import CacheFileTables, SnapshotRecord
from hybridcache.persistence.file_tree import FileTree


class HostRestorePlan(NamedTuple):
    """File ids to restore: snapshots in table order, blocks parents first."""

    snapshots: tuple[int, ...]
    blocks: tuple[int, ...]
    slabs: int  # slabs the plan fills
    file_slabs: int  # slabs the whole file needs

    @property
    def whole(self) -> bool:
        return self.slabs == self.file_slabs


def snapshot_density(tree: FileTree, snap: SnapshotRecord, cost: CacheCostModel) -> float:
    """(1 + hits) × prefill saved from the root, per byte of image, tail and anchor path. Pure."""
    geometry = tree.tables.header.geometry
    tail_bytes = geometry.slab_bytes if snap.tail_tokens else 0
    path_bytes = len(tree.path(snap.anchor)) * geometry.slab_bytes
    size = geometry.image_bytes + tail_bytes + path_bytes
    return (1 + snap.hits) * cost.prefill_seconds(0, tree.frontier(snap)) / max(size, 1)


def plan_host_restore(tables: CacheFileTables, free_slabs: int, cost: CacheCostModel) -> HostRestorePlan:
    """The snapshots and blocks to restore into ``free_slabs`` free host slabs. Pure."""
    total = tables.total_slabs
    if total <= free_slabs:
        return HostRestorePlan(
            tuple(s.snapshot for s in tables.snapshots), tuple(b.node for b in tables.blocks), total, total
        )
    tree = FileTree(tables)
    ranked = sorted(
        enumerate(tables.snapshots), key=lambda item: (-snapshot_density(tree, item[1], cost), item[0])
    )
    chosen_blocks: set[int] = set()
    chosen_snapshots: set[int] = set()
    left = free_slabs
    for _, snap in ranked:
        new_blocks = [node for node in tree.path(snap.anchor) if node not in chosen_blocks]
        need = len(new_blocks) + tables.snapshot_slabs(snap)
        if need <= left:
            left -= need
            chosen_blocks.update(new_blocks)
            chosen_snapshots.add(snap.snapshot)
    return HostRestorePlan(
        tuple(s.snapshot for s in tables.snapshots if s.snapshot in chosen_snapshots),
        tuple(b.node for b in tables.blocks if b.node in chosen_blocks),
        free_slabs - left,
        total,
    )
