"""Reading and (re)writing a cache directory's contents journal (layout: `contents_records`).

A new contents file (at a restart, and at every compaction) is written whole to a temporary file created
0600, fsynced, renamed over the old one and the directory fsynced: a crash at any moment leaves either
the old file or the new one, never a mix. Appends then go to the renamed file.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterable
from pathlib import Path

import msgspec

from hybridcache.persistence.contents_fold import ContentsFold
from hybridcache.persistence.contents_records import (
    CONTENTS_MAGIC,
    READABLE_CONTENTS_FORMATS,
    BaseEnd,
    ContentsHeader,
    ContentsRecord,
    decode_header,
    decode_record,
    encode_header,
    encode_record,
)
from hybridcache.persistence.file_safety import create_private_file
from hybridcache.persistence.framing import FrameDamage, FrameReader, encode_frame


class ContentsFileError(ValueError):
    """The contents file is not one, or of another format; nothing in it can be trusted."""


class ContentsRead(msgspec.Struct, frozen=True):
    """A folded contents file: ``damage`` says where a torn or corrupt tail was dropped (None: clean)."""

    header: ContentsHeader
    fold: ContentsFold
    base_entries: int  # records in the base table
    tail_records: int  # records after it that were folded
    damage: FrameDamage | None
    dropped_bytes: int  # bytes after the last good frame
    file_bytes: int


def temporary_name(path: Path) -> Path:
    return path.with_name(f".{path.name}.tmp")


def read_contents(path: str | os.PathLike[str]) -> ContentsRead:
    """Fold the file at ``path`` up to its last intact frame. Raises OSError, ContentsFileError (wrong
    magic, unreadable header, other format: the whole file is unusable)."""
    data = Path(path).read_bytes()
    if not data.startswith(CONTENTS_MAGIC):
        raise ContentsFileError(f"{path} is not a cache-directory contents file (wrong magic bytes)")
    frames = FrameReader(data, len(CONTENTS_MAGIC))
    payloads = iter(frames)
    first = next(payloads, None)
    if first is None:
        raise ContentsFileError(f"{path}: unreadable header ({frames.damage})")
    try:
        header = decode_header(first)
    except (msgspec.DecodeError, msgspec.ValidationError) as error:
        raise ContentsFileError(f"{path}: malformed header: {error}") from error
    if header.format_version not in READABLE_CONTENTS_FORMATS:
        readable = ", ".join(map(str, READABLE_CONTENTS_FORMATS))
        raise ContentsFileError(f"{path}: contents format {header.format_version}, this build reads "
                                f"{readable}")
    fold = ContentsFold()
    base_entries = tail = 0
    in_base = True
    damage = frames.damage
    for payload in payloads:
        try:
            record = decode_record(payload)
        except (msgspec.DecodeError, msgspec.ValidationError) as error:
            damage = FrameDamage(frames.offset, f"undecodable record: {error}")
            break
        fold.apply(record)
        if in_base:
            if isinstance(record, BaseEnd):
                in_base = False
            else:
                base_entries += 1
        else:
            tail += 1
    damage = damage or frames.damage
    end = frames.offset if damage is None else damage.offset
    return ContentsRead(header, fold, base_entries, tail, damage, len(data) - end, len(data))


def encode_records(records: Iterable[ContentsRecord]) -> bytes:
    """The frames of ``records``, concatenated. Pure."""
    return b"".join(encode_frame(encode_record(record)) for record in records)


def write_contents_file(
    path: str | os.PathLike[str],
    header: ContentsHeader,
    records: Iterable[ContentsRecord],
    before_rename: Callable[[], None] | None = None,
) -> None:
    """Replace the file at ``path`` atomically with ``header`` and ``records`` (a base table), durably.
    ``before_rename`` runs once the temporary file is complete (the crash trials widen that window).
    Raises OSError (the old file is left in place and the temporary file removed)."""
    target = Path(path)
    temporary = temporary_name(target)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(temporary)  # left by a crash during an earlier rewrite
    descriptor = create_private_file(temporary)
    try:
        with os.fdopen(descriptor, "wb") as stream:
            stream.write(CONTENTS_MAGIC + encode_frame(encode_header(header)))
            stream.write(encode_records(records))
            stream.flush()
            os.fsync(stream.fileno())
        if before_rename is not None:
            before_rename()
        os.replace(temporary, target)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary)
        raise
    fsync_directory(target.parent)


def open_for_append(path: str | os.PathLike[str]) -> int:
    """A descriptor appending to the existing file at ``path``. Raises OSError."""
    return os.open(path, os.O_WRONLY | os.O_APPEND | getattr(os, "O_CLOEXEC", 0))


def fsync_directory(directory: Path) -> None:
    descriptor = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
