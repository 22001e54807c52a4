"""What a prefix-cache file holds, as plain data (for ``hybridcache inspect``), and a full checksum
verification. Reads files only; no torch."""

from __future__ import annotations

import os
from collections import Counter
from typing import NamedTuple

import msgspec
import xxhash

from hybridcache.cache.records import SnapshotKind
from hybridcache.persistence.cache_file import CacheFileError, CacheFileTables, read_tables
from hybridcache.persistence.file_tree import FileTree

_READ_CHUNK = 8 << 20


class KindTotals(msgspec.Struct, frozen=True):
    count: int
    bytes: int


class SnapshotRow(msgspec.Struct, frozen=True):
    id: int
    anchor: int
    frontier: int
    kind: str
    hits: int
    h: float
    bytes: int  # image and tail slabs
    path_blocks: int
    tail_tokens: int
    # False: decode steps produced its state or a block of its path (resumed from only with --inexact-resume)
    exact: bool = True


class FileSummary(msgspec.Struct, frozen=True):
    path: str
    file_bytes: int
    format_version: int
    fingerprint: dict[str, object]
    geometry: dict[str, int]
    saved_seq: int
    saved_unix: float
    kinds: dict[str, KindTotals]  # blocks, images, tails
    hedges: KindTotals  # hedge snapshots (cache/hedge_admission.py): their images and tails, in the above
    host_bytes_needed: int
    block_depths: dict[int, int]  # blocks per depth (block index)
    snapshots: list[SnapshotRow]
    inexact_blocks: int = 0  # blocks whose KV came from decode steps (format 3 marks)
    inexact_snapshots: int = 0


def kind_name(kind: int) -> str:
    return SnapshotKind(kind).name.lower() if kind in SnapshotKind._value2member_map_ else str(kind)


def summarize(path: str, tables: CacheFileTables) -> FileSummary:
    """Counts, bytes, depths and one row per snapshot. Pure."""
    tree = FileTree(tables)
    header, slab = tables.header, tables.slab_bytes
    image_slabs = header.geometry.image_slabs
    tails = sum(1 for s in tables.snapshots if s.tail_tokens)
    rows = [
        SnapshotRow(
            snap.snapshot,
            snap.anchor,
            tree.frontier(snap),
            kind_name(snap.kind),
            snap.hits,
            snap.gdsf_h,
            tables.snapshot_slabs(snap) * slab,
            len(tree.path(snap.anchor)),
            len(snap.tail_tokens),
            not snap.inexact and not any(tree.blocks[b].inexact for b in tree.path(snap.anchor)),
        )
        for snap in tables.snapshots
    ]
    hedge_rows = [row for row in rows if row.kind == kind_name(SnapshotKind.HEDGE)]
    depths = Counter(tree.depth[b.node] for b in tables.blocks)
    return FileSummary(
        path=path,
        file_bytes=tables.file_bytes,
        format_version=header.format_version,
        fingerprint=msgspec.to_builtins(header.fingerprint),
        geometry=msgspec.to_builtins(header.geometry),
        saved_seq=header.saved_seq,
        saved_unix=header.saved_unix,
        kinds={
            "blocks": KindTotals(len(tables.blocks), len(tables.blocks) * slab),
            "images": KindTotals(len(tables.snapshots), len(tables.snapshots) * image_slabs * slab),
            "tails": KindTotals(tails, tails * slab),
        },
        hedges=KindTotals(len(hedge_rows), sum(row.bytes for row in hedge_rows)),
        host_bytes_needed=tables.total_slabs * slab,
        block_depths=dict(sorted(depths.items())),
        snapshots=rows,
        inexact_blocks=sum(1 for b in tables.blocks if b.inexact),
        inexact_snapshots=sum(1 for s in tables.snapshots if s.inexact),
    )


class RunDamage(NamedTuple):
    kind: str  # "block" | "snapshot"
    id: int
    offset: int  # absolute file offset of the run


class Verification(NamedTuple):
    """``tables_error`` set: the tables are unusable (nothing was checked further)."""

    tables_error: CacheFileError | None
    damaged_runs: list[RunDamage]
    runs_checked: int

    @property
    def ok(self) -> bool:
        return self.tables_error is None and not self.damaged_runs

    @property
    def first_bad_offset(self) -> int | None:
        if self.tables_error is not None:
            return self.tables_error.offset if self.tables_error.offset is not None else 0
        return min((d.offset for d in self.damaged_runs), default=None)


def verify_file(path: str | os.PathLike[str]) -> Verification:
    """Check every checksum: the three tables, then every slab run. Reads the whole file.

    Raises OSError when the file cannot be opened."""
    with open(path, "rb", buffering=0) as stream:
        try:
            tables = read_tables(stream, os.fstat(stream.fileno()).st_size)
        except CacheFileError as error:
            return Verification(error, [], 0)
        runs = [("block", b.node, b.offset, 1, b.checksum) for b in tables.blocks]
        runs += [
            ("snapshot", s.snapshot, s.offset, tables.snapshot_slabs(s), s.checksum) for s in tables.snapshots
        ]
        damaged = []
        for kind, entry, offset, slabs, expected in runs:
            start = tables.data_start + offset
            if _run_checksum(stream, start, slabs * tables.slab_bytes) != expected:
                damaged.append(RunDamage(kind, entry, start))
        return Verification(None, damaged, len(runs))


def _run_checksum(stream, start: int, length: int) -> int:
    stream.seek(start)
    digest = xxhash.xxh3_64()
    left = length
    while left:
        chunk = stream.read(min(left, _READ_CHUNK))
        if not chunk:
            break
        digest.update(chunk)
        left -= len(chunk)
    return digest.intdigest()
