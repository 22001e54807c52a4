"""`hybridcache inspect DIR` and `hybridcache replay DIR` on a cache directory (`--cache-dir`).

Both fold the contents journal and verify every restorable entry against the slab file exactly as a
restart would (`persistence/contents_check.py`); `inspect` reports the directory's contents, `replay` the
fold (records by type, where a torn tail begins) and the verification. Exit status: 0 when every entry a
restart could restore verifies, 1 when some fail (a restart drops them), 2 when the directory is unusable.
"""

from __future__ import annotations

import sys
from pathlib import Path

import msgspec

from hybridcache.persistence.contents_check import DirectoryCheck, check_directory, record_counts
from hybridcache.persistence.contents_file import ContentsFileError


def _checked(command: str, directory: Path) -> DirectoryCheck | None:
    try:
        return check_directory(directory)
    except (OSError, ContentsFileError) as error:
        print(f"hybridcache {command}: {directory}: {error}", file=sys.stderr)
        return None


def inspect_directory(directory: Path, as_json: bool) -> int:
    check = _checked("inspect", directory)
    if check is None:
        return 2
    if as_json:
        print(msgspec.json.encode(check).decode())
    else:
        print("\n".join(summary_lines(check)))
    return 0 if check.clean else 1


def replay_directory(directory: Path, as_json: bool) -> int:
    check = _checked("replay", directory)
    if check is None:
        return 2
    counts = record_counts(directory)
    if as_json:
        print(msgspec.json.encode({"check": check, "records": dict(counts)}).decode())
        return 0 if check.clean else 1
    lines = [f"contents      {check.base_entries} base entries, {check.tail_records} tail records, folded "
             f"in {check.fold_seconds * 1e3:.1f} ms"]
    lines += [f"  {name:<18} {count}" for name, count in sorted(counts.items())]
    lines += summary_lines(check, fingerprint=False)[1:]
    print("\n".join(lines))
    return 0 if check.clean else 1


def summary_lines(check: DirectoryCheck, fingerprint: bool = True) -> list[str]:
    """The text report. Pure."""
    rate = check.verified_bytes / check.verify_seconds / 2**20 if check.verify_seconds > 0 else 0.0
    shown = ["fingerprint", *(f"  {name:<20} {value}" for name, value in check.fingerprint.items())]
    return [
        f"directory     {check.directory} (contents {check.contents_bytes} bytes, slabs "
        f"{check.slab_file_bytes / 2**20:.1f} MiB)",
        *(shown if fingerprint else []),
        f"geometry      slab_bytes {check.slab_bytes}, image_bytes {check.image_bytes}",
        f"journal       base {check.base_entries} entries + tail {check.tail_records} records"
        + (f"; torn tail of {check.torn_bytes} bytes ({check.damage})" if check.torn_bytes else ""),
        f"listed        {check.listed_snapshots} snapshots ({check.listed_superseded} superseded), "
        f"{check.listed_blocks} blocks",
        f"  of which hedges {check.listed_hedges} snapshots, {check.listed_hedge_bytes / 2**20:.2f} MiB "
        "(images and tails)",
        f"inexact       {check.listed_inexact_snapshots} snapshots, {check.listed_inexact_blocks} blocks "
        "listed (from decode steps: resumed from only with --inexact-resume)",
        f"restorable    {check.restorable_snapshots} snapshots, {check.restorable_blocks} blocks "
        f"({check.needed_blocks} needed by a snapshot)",
        f"dropped       {check.mismatched} failed their checksum"
        + (f" (first: {check.first_mismatch})" if check.first_mismatch else "")
        + f", {check.missing_bytes} past the slab file's end, {check.unreachable} unreachable",
        f"verified      {check.verified_bytes / 2**20:.2f} MiB in {check.verify_seconds * 1e3:.1f} ms "
        f"({rate:.0f} MiB/s)",
    ]
