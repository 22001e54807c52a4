"""save_prefix_cache: write the host tier's retained content to the prefix-cache file (spec §5.5).

Saved: every snapshot, retained or superseded (flagged so, and restored so), whose image and tail are host
resident and whose whole anchor path is host resident, and exactly those paths, parents first: a restart
gives back what the host tier held. Not saved: dead KV, device-only content, anything still being written
(the caller lands every host write first).

The file is written to a temporary file beside the target (mode 0600: it holds users' prompts), fsynced
and renamed into place, then the directory is fsynced. ``abandon`` is checked before each slab run and
before the rename; an abandoned or failed save deletes its temporary file and leaves the previous file
untouched. The index and the host memory are only read.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec
import xxhash

from hybridcache.cache.ids import SlabId
from hybridcache.cache.records import BlockNode, Residency, Snapshot
from hybridcache.persistence.cache_file import (
    FORMAT_VERSION,
    BlockRecord,
    CacheFileHeader,
    FileGeometry,
    SnapshotRecord,
    encode_prelude,
)
from hybridcache.persistence.fingerprint import CacheFingerprint

if TYPE_CHECKING:
    from hybridcache.cache.index import PrefixIndex
    from hybridcache.gpu.host_tier import HostSlabMemory

ProgressCallback = Callable[[int], None]
"""Called with the number of bytes done so far (``hybridcache.logs.Progress.update`` fits)."""


class SaveReport(msgspec.Struct, frozen=True, kw_only=True):
    path: str
    saved: bool  # False: abandoned (the previous file is intact)
    blocks: int = 0
    snapshots: int = 0
    file_bytes: int = 0
    seconds: float = 0.0
    reason: str = ""

    @property
    def message(self) -> str:
        if not self.saved:
            return f"prefix cache not saved to {self.path}: {self.reason}"
        rate = self.file_bytes / self.seconds / 2**20 if self.seconds > 0 else 0.0
        return (
            f"prefix cache saved to {self.path}: {self.snapshots} snapshots, {self.blocks} blocks, "
            f"{self.file_bytes / 2**20:.1f} MiB in {self.seconds:.2f} s ({rate:.0f} MiB/s)"
        )


class _Abandoned(Exception):
    pass


def _path_savable(anchor: BlockNode) -> bool:
    """Every block up to ``anchor`` is on the host."""
    node: BlockNode | None = anchor
    while node is not None and node.parent is not None:
        if node.host_state != Residency.RESIDENT:
            return False
        node = node.parent
    return True


def select_saved(index: PrefixIndex) -> tuple[list[BlockNode], list[Snapshot]]:
    """The blocks (parents first) and snapshots (by id) a save writes: complete on the host, as their
    path. Inexact ones too: their records carry the mark, and a restart resumes from them only as an
    engine with ``--inexact-resume`` would. Pure."""
    snapshots = [
        snap
        for snap in sorted(index.snapshots.values(), key=lambda s: s.id)
        if snap.host_complete and _path_savable(snap.anchor)
    ]
    blocks: dict[int, BlockNode] = {}
    for snap in snapshots:
        node: BlockNode | None = snap.anchor
        while node is not None and node.parent is not None and node.id not in blocks:
            blocks[node.id] = node
            node = node.parent
    return sorted(blocks.values(), key=lambda n: (n.depth, n.id)), snapshots


def _snapshot_slabs(snap: Snapshot) -> tuple[SlabId, ...]:
    tail = () if snap.tail_host_slab is None else (snap.tail_host_slab,)
    return (*snap.host_slabs, *tail)


def _slab_arrays(host_memory: HostSlabMemory, slabs: tuple[SlabId, ...]) -> Iterator[object]:
    for slab in slabs:
        yield host_memory.slab_view(slab).numpy()


def _run_checksum(host_memory: HostSlabMemory, slabs: tuple[SlabId, ...]) -> int:
    digest = xxhash.xxh3_64()
    for array in _slab_arrays(host_memory, slabs):
        digest.update(array)  # type: ignore[arg-type]
    return digest.intdigest()


def _tables(
    index: PrefixIndex, host_memory: HostSlabMemory, blocks: list[BlockNode], snapshots: list[Snapshot]
) -> tuple[list[BlockRecord], list[SnapshotRecord], list[tuple[SlabId, ...]]]:
    slab_bytes = index.geometry.slab_bytes
    block_records, snapshot_records, runs = [], [], []
    offset = 0
    for node in blocks:
        assert node.parent is not None and node.host_slab is not None
        run = (node.host_slab,)
        block_records.append(
            BlockRecord(
                node.id,
                node.parent.id,
                node.lookup_hash,
                node.tokens,
                node.extra,
                offset,
                _run_checksum(host_memory, run),
                node.inexact,
            )
        )
        runs.append(run)
        offset += slab_bytes
    for snap in snapshots:
        run = _snapshot_slabs(snap)
        snapshot_records.append(
            SnapshotRecord(
                snap.id,
                snap.anchor.id,
                int(snap.kind),
                snap.tail_tokens,
                snap.hits,
                snap.gdsf_h,
                offset,
                _run_checksum(host_memory, run),
                snap.superseded,
                snap.inexact,
            )
        )
        runs.append(run)
        offset += len(run) * slab_bytes
    return block_records, snapshot_records, runs


def save_prefix_cache(
    path: str | os.PathLike[str],
    index: PrefixIndex,
    host_memory: HostSlabMemory,
    fingerprint: CacheFingerprint,
    abandon: threading.Event | None = None,
    progress: ProgressCallback | None = None,
) -> SaveReport:
    """Write the file at ``path`` (see the module docstring). Reads the index and the slab bytes only.

    Returns a report; ``saved`` is False when abandoned. Raises OSError when writing fails (the temporary
    file is deleted and the previous file left intact first)."""
    started = time.monotonic()
    target = Path(path)
    blocks, snapshots = select_saved(index)
    block_records, snapshot_records, runs = _tables(index, host_memory, blocks, snapshots)
    geometry = index.geometry
    data_bytes = sum(len(run) for run in runs) * geometry.slab_bytes
    header = CacheFileHeader(
        format_version=FORMAT_VERSION,
        fingerprint=fingerprint,
        geometry=FileGeometry(geometry.slab_bytes, geometry.image_bytes, geometry.image_slabs),
        blocks=len(block_records),
        snapshots=len(snapshot_records),
        data_bytes=data_bytes,
        saved_seq=index.seq,
        saved_unix=time.time(),
    )
    prelude = encode_prelude(header, block_records, snapshot_records)
    # mkstemp creates the file with O_EXCL and mode 0600 in one call: it is never readable by others,
    # not even for a moment (the file holds prompt tokens).
    descriptor, temp_name = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(descriptor, "wb", buffering=0) as stream:
            _write_all(stream, prelude, runs, host_memory, abandon, progress)
            os.fsync(stream.fileno())
        if abandon is not None and abandon.is_set():
            raise _Abandoned
        os.replace(temp_name, target)
    except _Abandoned:
        _remove(temp_name)
        return SaveReport(path=str(target), saved=False, reason="abandoned")
    except BaseException:
        _remove(temp_name)
        raise
    _fsync_directory(target.parent)
    return SaveReport(
        path=str(target),
        saved=True,
        blocks=len(block_records),
        snapshots=len(snapshot_records),
        file_bytes=len(prelude) + data_bytes,
        seconds=time.monotonic() - started,
    )


def _write_all(stream, prelude, runs, host_memory, abandon, progress) -> None:
    stream.write(prelude)
    done = len(prelude)
    for run in runs:
        if abandon is not None and abandon.is_set():
            raise _Abandoned
        for array in _slab_arrays(host_memory, run):
            view = memoryview(array)  # type: ignore[arg-type]
            while view:
                view = view[stream.write(view) :]
            done += len(array)  # type: ignore[arg-type]
        if progress is not None:
            progress(done)


def _remove(name: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(name)


def _fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
