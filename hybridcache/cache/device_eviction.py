"""Device LRU eviction planning (§9.1, §9.4). Pure: reads the index, returns events to apply.

Host-backed entries are consumed first (dropping a device copy is bookkeeping); an unbacked entry is
its last copy, so evicting it deletes the node's subtree (§9.4) or the tail's snapshot. Pinned entries
are never on the LRU, and an unbacked node whose subtree holds anything pinned is skipped.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybridcache.cache import events as ev
from hybridcache.cache.records import BlockNode, LruList, Residency, Snapshot

if TYPE_CHECKING:
    from hybridcache.cache.index import PrefixIndex


def plan_device_eviction(index: PrefixIndex, pages_needed: int) -> list[ev.CacheEvent]:
    """Events that free pages toward ``pages_needed`` more free pages (seq 0; the caller numbers them).

    Returns every host-backed drop needed, and at most one unbacked victim (its subtree deletion frees
    an amount only applying reveals): call again until enough pages are free or [] comes back.
    """
    shortfall = pages_needed - index.num_free_pages
    if shortfall <= 0:
        return []
    nodes: list[int] = []
    tails: list[int] = []
    for entry in index.lru.iter_lru_first(LruList.BACKED):
        if len(nodes) + len(tails) == shortfall:
            break
        (tails if isinstance(entry, Snapshot) else nodes).append(entry.id)  # type: ignore[attr-defined]
    if nodes or tails:
        return [ev.DeviceCopiesDropped(0, tuple(nodes), tuple(tails))]
    for entry in index.lru.iter_lru_first(LruList.UNBACKED):
        if isinstance(entry, Snapshot):
            if entry.restore_pins == 0:
                return [ev.SnapshotDeleted(0, entry.id)]
            continue
        assert isinstance(entry, BlockNode)
        if subtree_removable(entry):
            return [ev.SubtreeDeleted(0, entry.id)]
    return []


def subtree_removable(top: BlockNode) -> bool:
    """No node or snapshot in ``top``'s subtree is pinned or has a copy in flight. Pure."""
    stack = [top]
    while stack:
        node = stack.pop()
        if not subtree_removable_node(node):
            return False
        stack.extend(node.iter_children())
    return True


def subtree_removable_node(node: BlockNode) -> bool:
    """``node`` itself and its snapshots are neither pinned nor have a copy in flight. Pure."""
    if node.pinned or Residency.FILLING in (node.device_state, node.host_state):
        return False
    for snap in node.snapshots:
        states = (snap.device_state, snap.host_state, snap.tail_device_state, snap.tail_host_state)
        if snap.restore_pins > 0 or Residency.FILLING in states:
            return False
    return True
