"""The identity a prefix-cache file is valid for (spec §5.5): model artifact, numerics and program build.

A file is loaded only when every field equals the running engine's, so changing the checkpoint (path,
size or modification time), its config, the dtype, the KV layout, the RoPE options, the prefill
signature, or the program itself (version or any source file) invalidates it. Pure functions; reading
the checkpoint directory and the package sources is the only I/O.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import msgspec
import xxhash

from hybridcache import __version__

_PACKAGE_DIR = Path(__file__).resolve().parent.parent


class CacheFingerprint(msgspec.Struct, frozen=True, kw_only=True):
    """Everything a saved cache depends on. Strings for the option-like fields keep files portable."""

    checkpoint_path: str  # absolute
    checkpoint_bytes: int  # total size of the checkpoint's files
    checkpoint_mtime_ns: int  # newest modification time among them
    model_config_hash: str
    dtype: str
    kv_layout: str
    rope: str
    prefill_signature: str
    program_version: str
    build_id: str


def canonical_text(value: object) -> str:
    """A stable text form of an option value (dicts sorted by key). Pure."""
    if isinstance(value, str):
        return value
    return json.dumps(value, sort_keys=True, separators=(",", ":"), default=str)


def checkpoint_identity(path: str | os.PathLike[str]) -> tuple[str, int, int]:
    """(absolute path, total bytes, newest mtime in ns) of a checkpoint file or directory (recursive).

    Raises OSError when the path does not exist."""
    root = Path(path).resolve()
    if root.is_file():
        stat = root.stat()
        return str(root), stat.st_size, stat.st_mtime_ns
    if not root.is_dir():
        raise FileNotFoundError(f"checkpoint {root} does not exist")
    total = newest = 0
    for file in sorted(p for p in root.rglob("*") if p.is_file()):
        stat = file.stat()
        total += stat.st_size
        newest = max(newest, stat.st_mtime_ns)
    return str(root), total, newest


def build_identity(package_dir: Path = _PACKAGE_DIR) -> str:
    """xxh3-64 (hex) over every Python source of the package, by relative path: any edit changes it."""
    digest = xxhash.xxh3_64()
    for source in sorted(package_dir.rglob("*.py")):
        digest.update(str(source.relative_to(package_dir)).encode())
        digest.update(source.read_bytes())
    return digest.hexdigest()


def make_fingerprint(
    checkpoint: str | os.PathLike[str],
    model_config: object,
    dtype: object,
    kv_layout: object,
    rope: object,
    prefill_signature: object,
) -> CacheFingerprint:
    """The running engine's fingerprint. Option values may be strings or JSON-like objects.

    Raises OSError when the checkpoint is missing."""
    path, size, mtime = checkpoint_identity(checkpoint)
    return CacheFingerprint(
        checkpoint_path=path,
        checkpoint_bytes=size,
        checkpoint_mtime_ns=mtime,
        model_config_hash=xxhash.xxh3_64_hexdigest(canonical_text(model_config).encode()),
        dtype=canonical_text(dtype),
        kv_layout=canonical_text(kv_layout),
        rope=canonical_text(rope),
        prefill_signature=canonical_text(prefill_signature),
        program_version=__version__,
        build_id=build_identity(),
    )


def fingerprint_differences(saved: CacheFingerprint, running: CacheFingerprint) -> list[str]:
    """Names of the fields that differ (empty when the file matches). Pure."""
    return [field for field in saved.__struct_fields__ if getattr(saved, field) != getattr(running, field)]
