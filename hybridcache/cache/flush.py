"""Planning a cache flush (`POST /flush_cache`): every cached prefix that no running request holds goes.

Pure: reads the index, returns events to apply. A subtree goes whole (`SubtreeDeleted`, which frees its
device pages, host slabs and snapshots) when nothing in it is pinned or has a copy in flight; otherwise
the walk descends and deletes the removable subtrees below. What stays is the path a running request
holds (and any snapshot anchored on it): it is in use, and dropping it would not free its memory.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from hybridcache.cache import events as ev
from hybridcache.cache.device_eviction import subtree_removable

if TYPE_CHECKING:
    from hybridcache.cache.index import PrefixIndex


def plan_flush(index: PrefixIndex) -> list[ev.CacheEvent]:
    """One `SubtreeDeleted` per largest removable subtree (seq 0; the caller numbers them)."""
    events: list[ev.CacheEvent] = []
    pending = index.root.iter_children()
    while pending:
        node = pending.pop()
        if subtree_removable(node):
            events.append(ev.SubtreeDeleted(0, node.id))
        else:
            pending.extend(node.iter_children())
    return events
