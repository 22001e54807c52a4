"""CacheDirectory: the crash-consistent host tier (`--cache-dir DIR`).

``DIR/slabs`` holds the host slabs (mapped into memory: `gpu/slab_file.py`), ``DIR/contents`` is their
table of contents (`contents_records`), ``DIR/lock`` keeps a second server off the directory. Every file
is created 0600. At start-up `open_cache_directory` restores what verifies (`contents_restore`), writes
a fresh base table and attaches the sink whose writer thread keeps the contents durable from then on.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING

import msgspec

from hybridcache.logs import get_logger
from hybridcache.persistence.contents_file import (
    ContentsFileError,
    ContentsRead,
    read_contents,
    temporary_name,
    write_contents_file,
)
from hybridcache.persistence.contents_fold import ContentsFold
from hybridcache.persistence.contents_records import CONTENTS_FORMAT, ContentsGeometry, ContentsHeader
from hybridcache.persistence.contents_restore import RestoreCounts, restore_contents
from hybridcache.persistence.contents_sink import ContentsSink
from hybridcache.persistence.contents_writer import DEFAULT_COMPACT_MIN_TAIL, ContentsWriter
from hybridcache.persistence.file_safety import create_private_file
from hybridcache.persistence.fingerprint import CacheFingerprint, fingerprint_differences

if TYPE_CHECKING:
    from hybridcache.cache.facade import Cache
    from hybridcache.gpu.host_tier import HostSlabMemory

log = get_logger(__name__)

SLABS_NAME = "slabs"
CONTENTS_NAME = "contents"
LOCK_NAME = "lock"


# What ``Engine.stats()`` reports without --cache-dir (every figure is in /metrics, so always present).
CACHE_DIR_OFF_STATS: dict[str, object] = {
    "cache_dir_durable_seq": 0,
    "cache_dir_batches": 0,
    "cache_dir_records": 0,
    "cache_dir_compactions": 0,
    "cache_dir_sync_seconds": 0.0,
    "cache_dir_sync_seconds_max": 0.0,
    "cache_dir_contents_bytes": 0,
    "cache_dir_bytes_appended": 0,
    "cache_dir_error": None,
    "cache_dir_restored": {},
}


class CacheDirectoryError(RuntimeError):
    """The directory cannot be used (another server holds it, or it cannot be written)."""


def slabs_path(directory: str | os.PathLike[str]) -> Path:
    return Path(directory) / SLABS_NAME


def contents_path(directory: str | os.PathLike[str]) -> Path:
    return Path(directory) / CONTENTS_NAME


def lock_directory(directory: Path) -> int:
    """Take the directory's lock (a file created 0600); returns its descriptor. Raises
    CacheDirectoryError when another process holds it."""
    lock = directory / LOCK_NAME
    with contextlib.suppress(FileExistsError):
        os.close(create_private_file(lock))
    descriptor = os.open(lock, os.O_RDWR | getattr(os, "O_CLOEXEC", 0))
    try:
        fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(descriptor)
        raise CacheDirectoryError(f"the cache directory {directory} is in use by another process") from None
    return descriptor


def usable_contents(
    path: Path, fingerprint: CacheFingerprint, geometry: ContentsGeometry
) -> tuple[ContentsRead | None, str]:
    """The folded contents file at ``path`` when this engine can restore it, else None and why."""
    if not path.exists():
        return None, "empty cache directory"
    try:
        contents = read_contents(path)
    except (OSError, ContentsFileError) as error:
        return None, f"unusable contents file ({error})"
    differing = fingerprint_differences(contents.header.fingerprint, fingerprint)
    if differing:
        return None, f"fingerprint differs ({', '.join(differing)})"
    if contents.header.geometry != geometry:
        return None, f"host geometry differs ({contents.header.geometry} here, {geometry} now)"
    return contents, ""


class CacheDirectory:
    """An open cache directory: restores at construction, then journals through `sink`. `close()` makes
    the last batch durable and releases the lock."""

    def __init__(
        self,
        directory: str | os.PathLike[str],
        cache: Cache,
        host_memory: HostSlabMemory,
        fingerprint: CacheFingerprint,
        compact_min_tail: int = DEFAULT_COMPACT_MIN_TAIL,
        compaction_pause_s: float = 0.0,
        compact_tail_ratio: float = 2.0,
    ) -> None:
        self.directory = Path(directory)
        self._lock = lock_directory(self.directory)
        index = cache.index
        assert index.host is not None and host_memory.mapped_file is not None
        geometry = ContentsGeometry(
            index.geometry.slab_bytes, index.geometry.image_bytes, index.geometry.image_slabs
        )
        self.header = ContentsHeader(
            format_version=CONTENTS_FORMAT, fingerprint=fingerprint, geometry=geometry,
            created_unix=time.time(),
        )
        path = contents_path(self.directory)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(temporary_name(path))  # a rewrite a crash interrupted; the old file is whole
        contents, reason = usable_contents(path, fingerprint, geometry)
        self.counts = RestoreCounts()
        fold = ContentsFold()
        stored: frozenset[int] = frozenset()
        if contents is not None:
            restored = restore_contents(contents, cache, host_memory)
            self.counts = restored.counts
            for record in restored.base:
                fold.apply(record)
            stored = restored.stored_snapshots
            log.info("%s", self.counts.message(str(self.directory)))
        else:
            log.info("cache directory %s: nothing restored: %s", self.directory, reason)
        write_contents_file(path, self.header, fold.base_records())
        mapped = host_memory.mapped_file
        self.sink = ContentsSink(index, index.host.num_slabs, set(stored))
        self.writer = ContentsWriter(
            path,
            self.header,
            fold,
            read_slab=host_memory.slab_bytes_view,  # type: ignore[arg-type]
            slab_generation=self.sink.generation,
            sync_slabs=mapped.sync,
            compact_min_tail=compact_min_tail,
            clean_seq=lambda: self.sink.clean_seq,
            compaction_pause_s=compaction_pause_s,
            compact_tail_ratio=compact_tail_ratio,
        )
        self.sink.writer = self.writer

    def durable_seq(self) -> int:
        """The event sequence number up to which every landed host write is on disk."""
        clean = self.sink.clean_seq  # read before `queued`: its items were queued before it was set
        if self.writer.error is None and self.writer.queued == 0:
            return max(self.writer.durable_seq, clean)
        return self.writer.durable_seq

    def stats(self) -> dict[str, object]:
        writer = self.writer
        return {
            "cache_dir_durable_seq": self.durable_seq(),
            "cache_dir_batches": writer.batches,
            "cache_dir_records": writer.records_written,
            "cache_dir_compactions": writer.compactions,
            "cache_dir_sync_seconds": round(writer.sync_seconds, 6),
            "cache_dir_sync_seconds_max": round(writer.sync_seconds_max, 6),
            "cache_dir_contents_bytes": writer.contents_bytes,
            "cache_dir_bytes_appended": writer.bytes_appended,
            "cache_dir_hash_seconds": round(writer.hash_seconds, 6),
            "cache_dir_error": None if writer.error is None else f"cache directory: {writer.error}",
            "cache_dir_restored": msgspec.to_builtins(self.counts),
        }

    def close(self) -> None:
        self.writer.close()
        if self._lock >= 0:
            os.close(self._lock)
            self._lock = -1
