"""load_prefix_cache: rebuild host-only entries from the prefix-cache file at engine start (spec §5.5).

The file is accepted only when its fingerprint and host geometry equal the running engine's, its size
matches its tables and the index is still empty. ``plan_host_restore`` chooses what to restore before
any slab is read; only the chosen runs are read, straight into free host slabs, and every run's checksum
is verified before its entry is applied: a bad run drops exactly that entry and what depends on it (a
block's subtree and the snapshots anchored there). Entries arrive as ``BlockLoaded`` (parents first)
and ``SnapshotLoaded`` events applied through the cache facade, so they are journaled like any other;
blocks whose snapshots were all dropped are released again, and the loaded snapshots are valued.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from hybridcache.cache import events as ev
from hybridcache.cache.host_eviction import plan_revalue
from hybridcache.cache.ids import ROOT_NODE, SlabId
from hybridcache.persistence.cache_file import (
    BlockRecord,
    CacheFileError,
    CacheFileTables,
    SnapshotRecord,
    read_tables,
)
from hybridcache.persistence.fingerprint import CacheFingerprint, fingerprint_differences
from hybridcache.persistence.restore_plan import HostRestorePlan, plan_host_restore
from hybridcache.persistence.run_reader import RunReader, assign_slabs
from hybridcache.persistence.save import ProgressCallback

if TYPE_CHECKING:
    from hybridcache.cache.facade import Cache
    from hybridcache.cache.records import BlockNode, Snapshot
    from hybridcache.gpu.host_tier import HostSlabMemory


TABLE_BUFFER_BYTES = 1 << 20  # the tables; slab runs bypass the buffer (see run_reader)


class LoadReport(msgspec.Struct, frozen=True, kw_only=True):
    """What a load restored, or why it restored nothing. ``status``: restored | partial | none |
    refused | absent."""

    path: str
    status: str
    reason: str = ""
    saved_snapshots: int = 0
    saved_blocks: int = 0
    restored_snapshots: int = 0
    restored_blocks: int = 0
    damaged_runs: int = 0  # runs whose checksum failed (their entries were dropped)
    file_host_bytes: int = 0  # the host tier the whole file needs
    bytes_read: int = 0
    seconds: float = 0.0

    @property
    def message(self) -> str:
        """One log line (the spec's startup wording)."""
        need = f"the file needs a host tier of {self.file_host_bytes / 2**20:.1f} MiB"
        rate = self.bytes_read / self.seconds / 2**20 if self.seconds > 0 else 0.0
        read = f"read {self.bytes_read / 2**20:.1f} MiB in {self.seconds:.2f} s ({rate:.0f} MiB/s)"
        kept = (
            f"{self.restored_snapshots}/{self.saved_snapshots} snapshots, "
            f"{self.restored_blocks}/{self.saved_blocks} blocks"
        )
        damaged = f", {self.damaged_runs} damaged runs dropped" if self.damaged_runs else ""
        if self.status == "restored":
            return f"prefix cache restored from {self.path}: {kept}; {read}{damaged}"
        if self.status == "partial":
            return f"prefix cache partly restored from {self.path}: kept {kept}; {need}; {read}{damaged}"
        if self.status == "none":
            return f"prefix cache not restored from {self.path}: {self.reason}; {need}"
        return f"prefix cache not restored from {self.path}: {self.reason}"


def _refusal(path: Path, reason: str, status: str = "refused") -> LoadReport:
    return LoadReport(path=str(path), status=status, reason=reason)


def check_acceptance(
    tables: CacheFileTables, cache: Cache, fingerprint: CacheFingerprint, host_slab_bytes: int
) -> str | None:
    """Why the file cannot load into ``cache`` (None when it can). Pure."""
    differing = fingerprint_differences(tables.header.fingerprint, fingerprint)
    if differing:
        return f"fingerprint differs ({', '.join(differing)})"
    index = cache.index
    geo = tables.header.geometry
    if (geo.slab_bytes, geo.image_bytes) != (index.geometry.slab_bytes, index.geometry.image_bytes):
        return (
            f"host geometry differs (file: slab {geo.slab_bytes} B, image {geo.image_bytes} B; engine: "
            f"slab {index.geometry.slab_bytes} B, image {index.geometry.image_bytes} B)"
        )
    if index.host is None:
        return "the engine has no host tier"
    if host_slab_bytes != index.geometry.slab_bytes:
        return (
            f"host memory slabs of {host_slab_bytes} B do not match the index's {index.geometry.slab_bytes} B"
        )
    if len(index.nodes) > 1 or index.snapshots or index.lanes:
        return "the index already holds entries (a load happens before any request)"
    return None


def load_prefix_cache(
    path: str | os.PathLike[str],
    cache: Cache,
    host_memory: HostSlabMemory,
    fingerprint: CacheFingerprint,
    progress: ProgressCallback | None = None,
) -> LoadReport:
    """Restore what the file holds into an empty ``cache`` (see the module docstring). Mutates the
    cache through events and writes the chosen slabs of ``host_memory``. Never raises for a bad file:
    the report says why nothing (or what) was restored."""
    file_path = Path(path)
    if not file_path.exists():
        return _refusal(file_path, "no prefix-cache file yet", "absent")
    started = time.monotonic()
    try:
        with open(file_path, "rb", buffering=TABLE_BUFFER_BYTES) as stream:
            os.posix_fadvise(stream.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)  # runs are read in file order
            tables = read_tables(stream, os.fstat(stream.fileno()).st_size)
            reason = check_acceptance(tables, cache, fingerprint, host_memory.slab_bytes)
            if reason is not None:
                return _refusal(file_path, reason)
            assert cache.index.host is not None
            plan = plan_host_restore(tables, cache.index.host.num_free, cache.cost)
            base = LoadReport(
                path=str(file_path),
                status="none",
                saved_snapshots=len(tables.snapshots),
                saved_blocks=len(tables.blocks),
                file_host_bytes=tables.total_slabs * tables.slab_bytes,
            )
            if not plan.snapshots:
                slabs = cache.index.host.num_slabs
                reason = (
                    f"a host tier of {slabs} slabs holds none of the snapshots; "
                    "the save at shutdown replaces the file"
                    if tables.snapshots
                    else "the file holds no snapshots"
                )
                return msgspec.structs.replace(base, reason=reason)
            loader = _Loader(stream.fileno(), tables, cache, host_memory, progress)
            loader.run(plan)
    except CacheFileError as error:
        return _refusal(file_path, f"damaged file: {error}")
    except OSError as error:
        return _refusal(file_path, f"unreadable file: {error}")
    restored = len(loader.loaded_snapshots)
    status = "restored" if restored == len(tables.snapshots) else "partial" if restored else "none"
    return msgspec.structs.replace(
        base,
        status=status,
        reason="" if restored else "every chosen snapshot was damaged",
        restored_snapshots=restored,
        restored_blocks=sum(1 for n in loader.loaded_blocks if cache.index.nodes.get(n.id) is n),
        damaged_runs=loader.damaged_runs,
        bytes_read=loader.bytes_read,
        seconds=time.monotonic() - started,
    )


class _Loader:
    """Reads the planned runs into free slabs, then applies the events of those that verified. Single
    use."""

    def __init__(self, fd: int, tables: CacheFileTables, cache: Cache, host_memory, progress) -> None:
        self.tables = tables
        self.cache = cache
        self.reader = RunReader(fd, tables.data_start, host_memory, progress)
        self.node_ids: dict[int, int] = {0: ROOT_NODE}
        self.loaded_blocks: list[BlockNode] = []
        self.loaded_snapshots: list[Snapshot] = []
        self.damaged_runs = 0

    @property
    def bytes_read(self) -> int:
        return self.reader.bytes_read

    def run(self, plan: HostRestorePlan) -> None:
        wanted_blocks, wanted_snapshots = set(plan.blocks), set(plan.snapshots)
        blocks = [b for b in self.tables.blocks if b.node in wanted_blocks]
        snapshots = [s for s in self.tables.snapshots if s.snapshot in wanted_snapshots]
        runs = [(b.offset, 1, b.checksum) for b in blocks]
        runs += [(s.offset, self.tables.snapshot_slabs(s), s.checksum) for s in snapshots]
        host = self.cache.index.host
        assert host is not None
        free = host.peek_free(plan.slabs)
        assert free is not None  # the plan fits the free slabs
        requests = assign_slabs(runs, free)
        verified = self.reader.read(requests)
        self.damaged_runs = verified.count(False)
        entries = [*blocks, *snapshots]  # parents first, then snapshots: the order events must follow
        for entry, request, ok in zip(entries, requests, verified, strict=True):
            if not ok:
                continue
            if isinstance(entry, BlockRecord) and entry.parent in self.node_ids:
                self._load_block(entry, request.slabs[0])
            elif isinstance(entry, SnapshotRecord) and entry.anchor in self.node_ids:
                self._load_snapshot(entry, request.slabs)
        self._drop_unused_blocks()
        for event in plan_revalue(self.cache.index, self.loaded_snapshots, self.cache.cost):
            self._apply(event)

    def _load_block(self, block: BlockRecord, slab: SlabId) -> None:
        index = self.cache.index
        new_id = index.next_node_id
        parent = self.node_ids[block.parent]
        self._apply(
            ev.BlockLoaded(
                0, new_id, parent, block.lookup_hash, block.tokens, block.extra, slab, block.inexact
            )
        )
        self.node_ids[block.node] = new_id
        self.loaded_blocks.append(index.nodes[new_id])  # type: ignore[index]

    def _load_snapshot(self, snap: SnapshotRecord, slabs: tuple[SlabId, ...]) -> None:
        index = self.cache.index
        image_slabs = self.tables.header.geometry.image_slabs
        tail = slabs[image_slabs] if snap.tail_tokens else None
        new_id = index.next_snapshot_id
        anchor = self.node_ids[snap.anchor]
        self._apply(
            ev.SnapshotLoaded(
                0, new_id, anchor, snap.kind, snap.tail_tokens, slabs[:image_slabs], tail, snap.hits,
                snap.inexact,
            )
        )
        if snap.superseded:
            self._apply(ev.SnapshotSuperseded(0, new_id))
        self.loaded_snapshots.append(index.snapshots[new_id])  # type: ignore[index]

    def _apply(self, event: ev.CacheEvent) -> None:
        self.cache._apply(event)  # numbers, applies and journals like every facade mutation

    def _drop_unused_blocks(self) -> None:
        """Blocks whose every snapshot was dropped are dead KV: release them (topmost first)."""
        index = self.cache.index
        for node in self.loaded_blocks:
            if index.nodes.get(node.id) is node and node.live_snapshots_below == 0:
                self._apply(ev.NodeHostDropped(0, node.id))
