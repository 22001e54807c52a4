"""Which device-only blocks get a host copy, and when: write-back (default) or write-through (spec §7.6).

``HostWrite.THROUGH`` is the spec's rule: when a lane releases its path, every device-only block on it is
written to the host in one batch. The host then also holds a copy of nearly everything the device still
holds, so its budget is spent twice on the hottest blocks.

``HostWrite.BACK`` writes a block only when the device is about to lose it. When freeing device pages
finds too few free and host-backed ones, the least recently used unbacked blocks make up the shortfall:
those a live snapshot can still reach are written to the host, in LRU order (a released path is listed
deepest block first, so it is written tail-first, as it is evicted), then dropped from the device like
any host-backed block; those no snapshot can reach are deleted with their subtree, which no snapshot can
reach either (evicting them loses nothing reusable). The host therefore holds what the device does not,
and the two tiers add up; a block restored from the host keeps its host copy only until the host needs
room while a running lane still pins the block (``host_eviction.pinned_duplicates``). The copy is small
beside the prefill it saves (a 2 MiB page of 27B-INT8 KV moves in about 0.1 ms at 25 GB/s; its 64 tokens
take about 15 ms to prefill), but it must finish before a new owner writes the page: the facade hands
each such write to its ``host_copy`` callback, which copies at once (the engine waits for the transfer),
and lands it before dropping the device copies. The spec keeps device eviction free of copies; this
trades that for host capacity, and the wait is one D2H transfer of the pages a request is about to fill
anyway.

Snapshot images and tails are written at publication in both modes, and an orderly stop that saves the
prefix-cache file first writes every reachable device-only block (``blocks_to_flush``), so the file holds
what write-through would have saved.

Measured with ``hybridcache simulate`` on the 142 WEKA Claude Code conversations (27B-INT8 shape, 64 GiB
host, 16,384 device pages, 8 users): computed tokens / the infinite-cache bound 1.219 with write-through,
1.124 with write-back."""

from __future__ import annotations

from enum import StrEnum
from typing import TYPE_CHECKING, NamedTuple

from hybridcache.cache.device_eviction import subtree_removable
from hybridcache.cache.records import BlockNode, LruList, Residency

if TYPE_CHECKING:
    from hybridcache.cache.index import PrefixIndex


class HostWrite(StrEnum):
    BACK = "back"
    THROUGH = "through"


class WriteBackPlan(NamedTuple):
    """What freeing device pages does in BACK mode before the ordinary eviction (``plan_write_back``)."""

    write: list[BlockNode]  # reachable: written to the host, then dropped as host-backed entries
    delete: list[BlockNode]  # unreachable subtrees: deleted without a copy (§9.4)


def plan_write_back(index: PrefixIndex, pages_needed: int, delete_unreachable: bool = True) -> WriteBackPlan:
    """For ``pages_needed`` free pages when free plus host-backed pages fall short: the shortfall's worth
    of the least recently used unbacked blocks, each written back when a live snapshot can reach it, or
    deleted with its (equally unreachable) subtree when none can (unless not ``delete_unreachable``: then
    unreachable blocks are passed over). Pure; nothing without a host tier or when nothing is short."""
    shortfall = pages_needed - index.num_free_pages - index.lru.count(LruList.BACKED)
    plan = WriteBackPlan([], [])
    if index.host is None or shortfall <= 0:
        return plan
    absent = Residency.ABSENT
    write, delete = plan
    for entry in index.lru.iter_lru_first(LruList.UNBACKED):
        if not isinstance(entry, BlockNode):
            continue
        if entry.live_snapshots_below > 0:
            if entry.host_state is absent:
                write.append(entry)
        elif delete_unreachable and subtree_removable(entry):
            delete.append(entry)
        if len(write) + len(delete) >= shortfall:
            break
    return plan


def blocks_to_flush(index: PrefixIndex) -> list[BlockNode]:
    """Every device-only block a live snapshot can reach, parents first (before saving the prefix-cache
    file). Pure; [] without a host tier."""
    if index.host is None:
        return []
    resident, absent = Residency.RESIDENT, Residency.ABSENT
    found = [
        node
        for node in index.nodes.values()
        if node.parent is not None
        and node.live_snapshots_below > 0
        and node.device_state is resident
        and node.host_state is absent
    ]
    found.sort(key=lambda node: node.depth)
    return found
