"""restore_contents: rebuild the host tier from a cache directory at start-up, after an orderly stop or a
crash alike (`--cache-dir`).

The contents journal is folded up to its last intact frame (a torn tail is dropped). Of what it names,
only entries reachable from the root are candidates; each one's slab bytes, already in place in the
mapped slab file, are hashed and compared with the checksum its record carries. A block that fails drops
its subtree, a snapshot that fails (image or tail) drops itself, and blocks no restored snapshot needs
are released again: nothing unverified enters the index. Entries come back as ``BlockLoaded`` /
``SnapshotLoaded`` events through the facade (fresh ids, the same slabs), superseded ones flagged so,
and the loaded snapshots are valued like after a file load.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

import msgspec
import xxhash

from hybridcache.cache import events as ev
from hybridcache.cache.errors import EventRejected
from hybridcache.cache.host_eviction import plan_revalue
from hybridcache.cache.ids import ROOT_NODE
from hybridcache.persistence.contents_file import ContentsRead
from hybridcache.persistence.contents_records import (
    BlockStored,
    ContentsRecord,
    ImageStored,
    TailStored,
)

if TYPE_CHECKING:
    from hybridcache.cache.facade import Cache
    from hybridcache.gpu.host_tier import HostSlabMemory


class RestoreCounts(msgspec.Struct, kw_only=True):
    """What a restart found and kept. ``mismatched``: entries whose bytes did not verify (a slab write
    that never landed, or was overwritten after its record); ``unreachable``: entries whose parent or
    anchor was not restored; ``out_of_range``: entries in slabs past a smaller host tier."""

    listed_blocks: int = 0
    listed_snapshots: int = 0
    restored_blocks: int = 0
    restored_snapshots: int = 0
    restored_superseded: int = 0
    mismatched: int = 0
    unreachable: int = 0
    out_of_range: int = 0
    released_blocks: int = 0  # verified blocks that no restored snapshot needed
    inconsistent: int = 0  # verified entries the index refused (a key listed twice): dropped, not fatal
    torn_bytes: int = 0  # bytes of the contents file after its last intact frame
    verified_bytes: int = 0
    seconds: float = 0.0

    def message(self, directory: str) -> str:
        """The one start-up log line."""
        rate = self.verified_bytes / self.seconds / 2**20 if self.seconds > 0 else 0.0
        return (
            f"cache directory {directory}: restored {self.restored_snapshots}/{self.listed_snapshots} "
            f"snapshots ({self.restored_superseded} superseded) and "
            f"{self.restored_blocks}/{self.listed_blocks} blocks; dropped {self.mismatched} that failed "
            f"their checksum, {self.unreachable} unreachable, {self.out_of_range} outside the host tier, "
            f"{self.released_blocks} blocks no snapshot needs, {self.inconsistent} inconsistent, "
            f"a torn tail of {self.torn_bytes} bytes; "
            f"verified {self.verified_bytes / 2**20:.1f} MiB in {self.seconds:.2f} s ({rate:.0f} MiB/s)"
        )


class RestoredContents(msgspec.Struct, frozen=True):
    """The outcome: counts, and the base table of the new contents file (the restored entries under
    their new ids)."""

    counts: RestoreCounts
    base: list[ContentsRecord]
    stored_snapshots: frozenset[int]


def slabs_checksum(host_memory: HostSlabMemory, slabs: tuple[int, ...]) -> int:
    """xxh3_64 over the slabs' bytes, in order. Reads only."""
    digest = xxhash.xxh3_64()
    for slab in slabs:
        digest.update(host_memory.slab_bytes_view(slab))  # type: ignore[arg-type]
    return digest.intdigest()


def restore_contents(contents: ContentsRead, cache: Cache, host_memory: HostSlabMemory) -> RestoredContents:
    """Restore the verified entries of ``contents`` into the empty ``cache`` (see the module docstring).
    Mutates the cache through events; reads the slab bytes."""
    started = time.monotonic()
    restorer = _Restorer(cache, host_memory)
    restorer.counts.torn_bytes = contents.dropped_bytes
    restorer.run(contents)
    restorer.counts.seconds = time.monotonic() - started
    return RestoredContents(restorer.counts, restorer.base(), frozenset(restorer.snapshot_ids.values()))


class _Restorer:
    def __init__(self, cache: Cache, host_memory: HostSlabMemory) -> None:
        self.cache = cache
        self.host_memory = host_memory
        assert cache.index.host is not None
        self.num_slabs = cache.index.host.num_slabs
        self.counts = RestoreCounts()
        self.node_ids: dict[int, int] = {0: ROOT_NODE}
        self.snapshot_ids: dict[int, int] = {}
        self.blocks: list[BlockStored] = []
        self.images: list[tuple[ImageStored, TailStored | None]] = []
        self._used_slabs: set[int] = set()

    def run(self, contents: ContentsRead) -> None:
        fold = contents.fold
        entries = fold.restorable()
        counts = self.counts
        counts.listed_blocks = len(fold.blocks)
        counts.listed_snapshots = len(fold.images)
        counts.unreachable = (len(fold.blocks) - len(entries.blocks)) + (
            len(fold.images) - len(entries.snapshots)
        )
        for block in entries.blocks:
            if block.parent not in self.node_ids:
                counts.unreachable += 1
            elif self._verified((block.slab,), block.checksum):
                try:
                    self._load_block(block)
                except EventRejected:  # validated before any mutation: the index is unchanged
                    self.counts.inconsistent += 1
                    self._used_slabs.discard(block.slab)
        loaded = []
        for image, tail in entries.snapshots:
            if image.anchor not in self.node_ids:
                counts.unreachable += 1
                continue
            tail_ok = tail is None or self._verified((tail.slab,), tail.checksum)
            if tail_ok and self._verified(image.slabs, image.checksum):
                try:
                    loaded.append(self._load_snapshot(image, tail))
                except EventRejected:
                    self.counts.inconsistent += 1
        self._release_unused_blocks()
        index = self.cache.index
        live = [index.snapshots[s] for s in loaded]
        for event in plan_revalue(index, live, self.cache.cost):
            self.cache._apply(event)
        counts.restored_blocks = len(self.blocks)
        counts.restored_snapshots = len(self.images)
        counts.restored_superseded = sum(1 for image, _ in self.images if image.superseded)

    def _verified(self, slabs: tuple[int, ...], expected: int) -> bool:
        if any(slab >= self.num_slabs for slab in slabs):
            self.counts.out_of_range += 1
            return False
        if any(slab in self._used_slabs for slab in slabs):
            self.counts.mismatched += 1  # two entries cannot share a slab: at most one is right
            return False
        self.counts.verified_bytes += len(slabs) * self.host_memory.slab_bytes
        if slabs_checksum(self.host_memory, slabs) != expected:
            self.counts.mismatched += 1
            return False
        self._used_slabs.update(slabs)
        return True

    def _load_block(self, block: BlockStored) -> None:
        index = self.cache.index
        new_id = index.next_node_id
        parent = self.node_ids[block.parent]
        self.cache._apply(
            ev.BlockLoaded(
                0, new_id, parent, block.lookup_hash, block.tokens, block.extra, block.slab, block.inexact
            )
        )
        self.node_ids[block.node] = new_id
        self.blocks.append(msgspec.structs.replace(block, node=new_id, parent=parent))

    def _load_snapshot(self, image: ImageStored, tail: TailStored | None) -> int:
        index = self.cache.index
        new_id = index.next_snapshot_id
        anchor = self.node_ids[image.anchor]
        self.cache._apply(
            ev.SnapshotLoaded(
                0, new_id, anchor, image.kind, image.tail_tokens, image.slabs,
                None if tail is None else tail.slab, image.hits, image.inexact,
            )
        )
        if image.superseded:
            self.cache._apply(ev.SnapshotSuperseded(0, new_id))
        self.snapshot_ids[image.snapshot] = new_id
        renamed_tail = None if tail is None else msgspec.structs.replace(tail, snapshot=new_id)
        self.images.append((msgspec.structs.replace(image, snapshot=new_id, anchor=anchor), renamed_tail))
        return new_id

    def _release_unused_blocks(self) -> None:
        """Blocks whose every snapshot was dropped are dead KV: release them (their slabs are reused)."""
        index = self.cache.index
        kept = []
        for block in self.blocks:
            node = index.nodes.get(block.node)  # type: ignore[call-overload]
            if node is not None and node.live_snapshots_below == 0:
                self.cache._apply(ev.NodeHostDropped(0, node.id))
                self.counts.released_blocks += 1
            elif node is not None:
                kept.append(block)
        self.blocks = [b for b in kept if b.node in index.nodes]

    def base(self) -> list[ContentsRecord]:
        records: list[ContentsRecord] = list(self.blocks)
        records += [image for image, _ in self.images]
        records += [tail for _, tail in self.images if tail is not None]
        return records
