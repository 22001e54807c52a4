"""check_directory: what a restart would restore from a cache directory, computed without an engine.

Folds `DIR/contents` (a torn tail is reported and dropped), then verifies the checksum of every entry a
restart could restore by reading `DIR/slabs` with plain preads, applying the restart's rules: a block is
kept when its parent was kept and its bytes verify; a snapshot when its anchor was kept and its image (and
tail) verify; kept blocks no kept snapshot needs are counted apart. Used by `hybridcache inspect DIR` and
`hybridcache replay DIR`. Reads only; no torch.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

import msgspec
import xxhash

from hybridcache.cache.records import SnapshotKind
from hybridcache.persistence.cache_dir import contents_path, slabs_path
from hybridcache.persistence.contents_file import ContentsRead, read_contents
from hybridcache.persistence.contents_fold import ROOT
from hybridcache.persistence.contents_records import CONTENTS_MAGIC, decode_record
from hybridcache.persistence.framing import FrameReader


class DirectoryCheck(msgspec.Struct, kw_only=True):
    directory: str
    fingerprint: dict[str, object]
    slab_bytes: int
    image_bytes: int
    contents_bytes: int
    slab_file_bytes: int
    base_entries: int
    tail_records: int
    torn_bytes: int
    damage: str | None
    listed_blocks: int
    listed_snapshots: int
    listed_superseded: int
    listed_inexact_blocks: int = 0  # from decode steps (format 2 marks): resumed only with --inexact-resume
    listed_inexact_snapshots: int = 0
    listed_hedges: int = 0  # tail hedges (records.SnapshotKind.HEDGE): a bet on an edit of a prompt's end
    listed_hedge_bytes: int = 0  # their images and tail pages, in slabs
    restorable_blocks: int = 0
    restorable_snapshots: int = 0
    needed_blocks: int = 0  # restorable blocks some restorable snapshot resumes through
    mismatched: int = 0
    unreachable: int = 0
    missing_bytes: int = 0  # entries whose slabs lie past the end of the slab file
    verified_bytes: int = 0
    fold_seconds: float = 0.0
    verify_seconds: float = 0.0
    first_mismatch: str | None = None

    @property
    def clean(self) -> bool:
        return self.mismatched == 0 and self.missing_bytes == 0


def check_directory(directory: str | os.PathLike[str]) -> DirectoryCheck:
    """Fold and verify (see the module docstring). Raises OSError, ContentsFileError."""
    root = Path(directory)
    started = time.perf_counter()
    contents = read_contents(contents_path(root))
    folded = time.perf_counter()
    fold = contents.fold
    slab_file = slabs_path(root)
    slab_bytes = contents.header.geometry.slab_bytes
    hedges = [image for image in fold.images.values() if image.kind == SnapshotKind.HEDGE]
    check = DirectoryCheck(
        directory=str(root),
        fingerprint=msgspec.to_builtins(contents.header.fingerprint),
        slab_bytes=slab_bytes,
        image_bytes=contents.header.geometry.image_bytes,
        contents_bytes=contents.file_bytes,
        slab_file_bytes=slab_file.stat().st_size if slab_file.exists() else 0,
        base_entries=contents.base_entries,
        tail_records=contents.tail_records,
        torn_bytes=contents.dropped_bytes,
        damage=None if contents.damage is None else f"{contents.damage.reason} at {contents.damage.offset}",
        listed_blocks=len(fold.blocks),
        listed_snapshots=len(fold.images),
        listed_superseded=sum(1 for image in fold.images.values() if image.superseded),
        listed_inexact_blocks=sum(1 for block in fold.blocks.values() if block.inexact),
        listed_inexact_snapshots=sum(1 for image in fold.images.values() if image.inexact),
        listed_hedges=len(hedges),
        listed_hedge_bytes=sum(len(i.slabs) + (i.snapshot in fold.tails) for i in hedges) * slab_bytes,
        fold_seconds=folded - started,
    )
    _verify(check, contents, slab_file)
    check.verify_seconds = time.perf_counter() - folded
    return check


def _verify(check: DirectoryCheck, contents: ContentsRead, slab_file: Path) -> None:
    entries = contents.fold.restorable()
    size = check.slab_bytes
    check.unreachable = (check.listed_blocks - len(entries.blocks)) + (
        check.listed_snapshots - len(entries.snapshots)
    )
    fd = os.open(slab_file, os.O_RDONLY) if slab_file.exists() else -1
    file_slabs = check.slab_file_bytes // size

    def verified(slabs: tuple[int, ...], expected: int, what: str) -> bool:
        if fd < 0 or any(slab >= file_slabs for slab in slabs):
            check.missing_bytes += 1
            return False
        digest = xxhash.xxh3_64()
        for slab in slabs:
            digest.update(os.pread(fd, size, slab * size))
        check.verified_bytes += len(slabs) * size
        if digest.intdigest() != expected:
            check.mismatched += 1
            check.first_mismatch = check.first_mismatch or what
            return False
        return True

    try:
        kept = {ROOT}
        parents: dict[int, int] = {}
        for block in entries.blocks:
            if block.parent not in kept:
                check.unreachable += 1
            elif verified((block.slab,), block.checksum, f"block {block.node} (slab {block.slab})"):
                kept.add(block.node)
                parents[block.node] = block.parent
        needed: set[int] = set()
        for image, tail in entries.snapshots:
            if image.anchor not in kept:
                check.unreachable += 1
                continue
            what = f"tail of snapshot {image.snapshot}"
            tail_ok = tail is None or verified((tail.slab,), tail.checksum, what)
            if tail_ok and verified(image.slabs, image.checksum, f"image of snapshot {image.snapshot}"):
                check.restorable_snapshots += 1
                node = image.anchor
                while node != ROOT and node not in needed:
                    needed.add(node)
                    node = parents[node]
        check.restorable_blocks = len(kept) - 1
        check.needed_blocks = len(needed)
    finally:
        if fd >= 0:
            os.close(fd)


def record_counts(directory: str | os.PathLike[str]) -> Counter[str]:
    """Records of the contents journal by type (the base and the tail together). Reads only."""
    data = contents_path(directory).read_bytes()
    frames = iter(FrameReader(data, len(CONTENTS_MAGIC)))
    next(frames, None)  # the header
    counts: Counter[str] = Counter()
    for payload in frames:
        try:
            counts[type(decode_record(payload)).__name__] += 1
        except (msgspec.DecodeError, msgspec.ValidationError):
            break
    return counts
