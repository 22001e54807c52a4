"""The prefix-cache file format (``--prefix-cache-file``, spec §5.5), format version 1. No torch.

Layout (little endian)::

    prologue   8s magic "HCPREFIX" | u32 format version | u32 reserved (0)
    section    u64 length | u64 xxh3_64(payload) | payload        x3: header, block table, snapshot table
    padding    zeros up to the next 4 KiB boundary: the data region starts there
    data       one run per entry: every block (one slab), then every snapshot (its image slabs, then
               its tail slab when it has tail tokens), in table order

Sections are msgpack: ``CacheFileHeader``, ``list[BlockRecord]`` (parents before children; parent 0 is
the root) and ``list[SnapshotRecord]``. Each record names its run's offset (from the data start) and the
run's xxh3_64, so a loader can choose what to read before reading any slab and a damaged run drops
exactly the entries that depend on it. Ids are the saving index's; a loader maps them to fresh ones.
Format 3 records carry each entry's exactness mark (``cache/exactness.py``), so a restart keeps exact-only
resumes exact; formats 1 and 2 held exact entries only, and their records read as exact.
"""

from __future__ import annotations

import os
import struct
from typing import BinaryIO

import msgspec
import xxhash

from hybridcache.cache.ids import BLOCK_TOKENS
from hybridcache.cache.records import SnapshotKind
from hybridcache.persistence.fingerprint import CacheFingerprint

MAGIC = b"HCPREFIX"
# 2: superseded snapshots are saved too, flagged in their record. 3: inexact entries are saved too, marked
# in their record (a build that reads only 1 and 2 refuses the file rather than take them as exact).
FORMAT_VERSION = 3
READABLE_FORMATS = (1, 2, 3)  # older files read as is: every record they hold is retained and exact
PROLOGUE = struct.Struct("<8sII")
SECTION = struct.Struct("<QQ")
DATA_ALIGN = 4096
MAX_SECTION_BYTES = 1 << 32
_KINDS = frozenset(int(kind) for kind in SnapshotKind)


class CacheFileError(ValueError):
    """The file is not a usable prefix-cache file: ``reason`` says why, ``offset`` where (or None)."""

    def __init__(self, reason: str, offset: int | None = None) -> None:
        super().__init__(reason if offset is None else f"{reason} (at byte {offset})")
        self.reason = reason
        self.offset = offset


class FileGeometry(msgspec.Struct, frozen=True):
    """The host geometry a file's slabs were cut for; a loader needs equal values."""

    slab_bytes: int
    image_bytes: int
    image_slabs: int


class CacheFileHeader(msgspec.Struct, frozen=True, kw_only=True):
    format_version: int
    fingerprint: CacheFingerprint
    geometry: FileGeometry
    blocks: int
    snapshots: int
    data_bytes: int
    saved_seq: int = 0  # the saving index's event sequence (informational)
    saved_unix: float = 0.0  # wall-clock time of the save (informational)


class BlockRecord(msgspec.Struct, frozen=True, array_like=True):
    node: int
    parent: int  # 0: the root
    lookup_hash: int
    tokens: tuple[int, ...]
    extra: int
    offset: int
    checksum: int
    inexact: bool = False  # format 3: its KV came from decode steps (records.BlockNode.inexact)


class SnapshotRecord(msgspec.Struct, frozen=True, array_like=True):
    snapshot: int
    anchor: int  # 0: the root
    kind: int
    tail_tokens: tuple[int, ...]
    hits: int
    gdsf_h: float  # informational: H when saved (its time base is not restored)
    offset: int
    checksum: int
    superseded: bool = False  # format 2: restored as superseded (valued and evicted as such)
    inexact: bool = False  # format 3: records.Snapshot.inexact (an exact-only resume skips it)


class CacheFileTables(msgspec.Struct, frozen=True):
    """Everything before the data region, validated: what a loader plans from."""

    header: CacheFileHeader
    blocks: list[BlockRecord]
    snapshots: list[SnapshotRecord]
    data_start: int
    file_bytes: int

    @property
    def slab_bytes(self) -> int:
        return self.header.geometry.slab_bytes

    def snapshot_slabs(self, record: SnapshotRecord) -> int:
        """Slabs of a snapshot's run: its image, plus one for a tail. Pure."""
        return self.header.geometry.image_slabs + (1 if record.tail_tokens else 0)

    @property
    def total_slabs(self) -> int:
        """Slabs a host tier needs to hold the whole file."""
        return len(self.blocks) + sum(self.snapshot_slabs(s) for s in self.snapshots)


_encode = msgspec.msgpack.Encoder().encode
_decode_header = msgspec.msgpack.Decoder(CacheFileHeader).decode
_decode_blocks = msgspec.msgpack.Decoder(list[BlockRecord]).decode
_decode_snapshots = msgspec.msgpack.Decoder(list[SnapshotRecord]).decode


def checksum(data: bytes | memoryview) -> int:
    """The checksum of sections and runs (xxh3_64). Pure."""
    return xxhash.xxh3_64_intdigest(data)


def align_up(offset: int) -> int:
    return -(-offset // DATA_ALIGN) * DATA_ALIGN


def encode_prelude(
    header: CacheFileHeader, blocks: list[BlockRecord], snapshots: list[SnapshotRecord]
) -> bytes:
    """Prologue, the three sections and the padding: the bytes before the data region. Pure."""
    parts = [PROLOGUE.pack(MAGIC, FORMAT_VERSION, 0)]
    for payload in (_encode(header), _encode(blocks), _encode(snapshots)):
        parts.append(SECTION.pack(len(payload), checksum(payload)))
        parts.append(payload)
    prelude = b"".join(parts)
    return prelude + bytes(align_up(len(prelude)) - len(prelude))


def read_tables(stream: BinaryIO, file_bytes: int) -> CacheFileTables:
    """Read and validate everything before the data region. Reads the stream from its start.

    Raises CacheFileError (with the offset of the first bad byte range) on any damage or mismatch of the
    size with the tables."""
    stream.seek(0)
    raw = stream.read(PROLOGUE.size)
    if len(raw) < PROLOGUE.size:
        raise CacheFileError("file too short for the prologue", 0)
    magic, version, reserved = PROLOGUE.unpack(raw)
    if magic != MAGIC:
        raise CacheFileError("not a hybridcache prefix-cache file (wrong magic bytes)", 0)
    if reserved != 0:  # written as 0 by every format: anything else is damage the checksums do not cover
        raise CacheFileError(f"damaged prologue (reserved field {reserved:#x}, expected 0)", 12)
    if version not in READABLE_FORMATS:
        raise CacheFileError(
            f"file format {version}, this build reads {', '.join(map(str, READABLE_FORMATS))}", 8
        )
    offset = PROLOGUE.size
    sections = []
    for name in ("header", "block table", "snapshot table"):
        payload = _read_section(stream, offset, file_bytes, name)
        sections.append((payload, offset))
        offset += SECTION.size + len(payload)
    header = _decode(sections[0], _decode_header, "header")
    if header.format_version != version:
        raise CacheFileError(f"header says format {header.format_version}", sections[0][1])
    blocks = _decode(sections[1], _decode_blocks, "block table")
    snapshots = _decode(sections[2], _decode_snapshots, "snapshot table")
    tables = CacheFileTables(header, blocks, snapshots, align_up(offset), file_bytes)
    validate_structure(tables)
    stream.seek(offset)
    if any(stream.read(tables.data_start - offset)):
        raise CacheFileError("the padding before the data region is not zero", offset)
    return tables


def open_tables(path: str | os.PathLike[str]) -> CacheFileTables:
    """``read_tables`` on the file at ``path``. Raises OSError, CacheFileError."""
    with open(path, "rb") as stream:
        return read_tables(stream, os.fstat(stream.fileno()).st_size)


def _read_section(stream: BinaryIO, offset: int, file_bytes: int, name: str) -> bytes:
    stream.seek(offset)
    raw = stream.read(SECTION.size)
    if len(raw) < SECTION.size:
        raise CacheFileError(f"file ends inside the {name} section header", offset)
    length, expected = SECTION.unpack(raw)
    if length > MAX_SECTION_BYTES or offset + SECTION.size + length > file_bytes:
        raise CacheFileError(f"{name} length {length} runs past the end of the file", offset)
    payload = stream.read(length)
    if len(payload) != length or checksum(payload) != expected:
        raise CacheFileError(f"{name} checksum mismatch", offset)
    return payload


def _decode(section: tuple[bytes, int], decoder, name: str):
    payload, offset = section
    try:
        return decoder(payload)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise CacheFileError(f"malformed {name}: {error}", offset) from error


def validate_structure(tables: CacheFileTables) -> None:
    """Parents before children, anchors known, runs laid out back to back, the size equal to the tables.
    Pure. Raises CacheFileError naming the first inconsistency."""
    header, geo = tables.header, tables.header.geometry
    if geo.slab_bytes <= 0 or geo.image_slabs != -(-geo.image_bytes // geo.slab_bytes):
        raise CacheFileError(f"inconsistent geometry {geo}")
    if header.blocks != len(tables.blocks) or header.snapshots != len(tables.snapshots):
        raise CacheFileError("header counts differ from the tables")
    seen = {0}
    expected_offset = 0
    for block in tables.blocks:
        if block.node in seen or block.parent not in seen:
            raise CacheFileError(f"block {block.node}: repeated, or listed before its parent {block.parent}")
        if len(block.tokens) != BLOCK_TOKENS or block.offset != expected_offset:
            raise CacheFileError(f"block {block.node}: bad token count or data offset")
        seen.add(block.node)
        expected_offset += geo.slab_bytes
    keys = set()
    for snap in tables.snapshots:
        key = (snap.anchor, tuple(snap.tail_tokens))
        if snap.anchor not in seen or key in keys or len(snap.tail_tokens) >= BLOCK_TOKENS:
            raise CacheFileError(f"snapshot {snap.snapshot}: unknown anchor, repeated key or long tail")
        if snap.kind not in _KINDS or snap.hits < 0:
            raise CacheFileError(f"snapshot {snap.snapshot}: unknown kind {snap.kind} or negative hits")
        if snap.offset != expected_offset:
            raise CacheFileError(f"snapshot {snap.snapshot}: data offset {snap.offset} out of order")
        keys.add(key)
        expected_offset += tables.snapshot_slabs(snap) * geo.slab_bytes
    if header.data_bytes != expected_offset:
        raise CacheFileError(f"header data size {header.data_bytes} differs from the tables")
    described = tables.data_start + expected_offset
    if tables.file_bytes != described:
        raise CacheFileError(
            f"file holds {tables.file_bytes} bytes, the tables describe {described}",
            min(tables.file_bytes, described),
        )
