"""The records of a cache directory's table of contents (`--cache-dir DIR`, file `DIR/contents`).

The contents file is a journal of what the slab file (`DIR/slabs`) holds: the magic bytes, a header frame
(`ContentsHeader`: format, the engine fingerprint, the host geometry), a base table (one `*Stored`
record per durable entry, then `BaseEnd`), then a tail of changes. Frames are the event journal's
(`framing`: length, CRC32, payload), so a torn tail is found and dropped exactly as there. Folding the
records in order gives the durable entries (`contents_fold.ContentsFold`); each `*Stored` record carries
the xxh3_64 of its slab bytes, so a restart serves nothing whose bytes did not reach the disk.

Ids are the writing run's node and snapshot ids (the root is node 0); a restart maps them to fresh ones
and writes a new base.
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec

from hybridcache.persistence.fingerprint import CacheFingerprint

CONTENTS_MAGIC = b"HCCONTENTS\x00"
# 2: inexact blocks and snapshots are stored too, marked in their record (a build that reads only 1
# refuses the directory rather than take them as exact).
CONTENTS_FORMAT = 2
READABLE_CONTENTS_FORMATS = (1, 2)  # format 1 stored exact entries only: its records read as exact


class ContentsGeometry(msgspec.Struct, frozen=True):
    """The slab file's layout: a restart needs equal slab and image sizes (the slab count may change)."""

    slab_bytes: int
    image_bytes: int
    image_slabs: int


class ContentsHeader(msgspec.Struct, frozen=True, kw_only=True):
    format_version: int
    fingerprint: CacheFingerprint
    geometry: ContentsGeometry
    created_unix: float = 0.0


class _Record(msgspec.Struct, frozen=True, tag=True, array_like=True):
    pass


class BlockStored(_Record, frozen=True):
    """A block's bytes are in ``slab`` (their xxh3_64 is ``checksum``), under ``parent`` (0: the root)."""

    node: int
    parent: int
    lookup_hash: int
    tokens: tuple[int, ...]
    extra: int
    slab: int
    checksum: int
    inexact: bool = False  # format 2: its KV came from decode steps (records.BlockNode.inexact)


class ImageStored(_Record, frozen=True):
    """A snapshot's state image is in ``slabs`` (one checksum over them, in order)."""

    snapshot: int
    anchor: int
    kind: int
    tail_tokens: tuple[int, ...]
    slabs: tuple[int, ...]
    checksum: int
    hits: int = 0
    superseded: bool = False
    inexact: bool = False  # format 2: records.Snapshot.inexact (an exact-only resume skips it)


class TailStored(_Record, frozen=True):
    """A snapshot's tail page (its ``tail_tokens``' KV) is in ``slab``."""

    snapshot: int
    slab: int
    checksum: int


class SnapshotState(_Record, frozen=True):
    """A stored snapshot's hits or supersession changed (no bytes involved)."""

    snapshot: int
    hits: int
    superseded: bool


class BlockReleased(_Record, frozen=True):
    """The block's host copy was freed; the node lives on (on the device), so its stored children stay
    listed but cannot be restored until the block is stored again."""

    node: int


class NodeLinked(_Record, frozen=True):
    """Base tables only: ``node`` (whose block is not stored, its host copy released) lies under
    ``parent``; its stored descendants hang on this link until a removal takes the subtree."""

    node: int
    parent: int


class NodeRemoved(_Record, frozen=True):
    """The node, its whole subtree and every snapshot anchored there are gone."""

    node: int


class SnapshotRemoved(_Record, frozen=True):
    """The snapshot's host copy (image and tail) is gone."""

    snapshot: int


class BaseEnd(_Record, frozen=True):
    """The end of the base table: ``entries`` records came before it."""

    entries: int


ContentsRecord = (
    BlockStored
    | ImageStored
    | TailStored
    | SnapshotState
    | BlockReleased
    | NodeLinked
    | NodeRemoved
    | SnapshotRemoved
    | BaseEnd
)

encode_header: Callable[[ContentsHeader], bytes] = msgspec.msgpack.Encoder().encode
decode_header: Callable[[bytes], ContentsHeader] = msgspec.msgpack.Decoder(ContentsHeader).decode
encode_record: Callable[[ContentsRecord], bytes] = msgspec.msgpack.Encoder().encode
decode_record: Callable[[bytes], ContentsRecord] = msgspec.msgpack.Decoder(ContentsRecord).decode  # type: ignore[arg-type]
