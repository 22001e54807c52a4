"""Memory-mapped safetensors reading: single-file or sharded (`model.safetensors.index.json`) checkpoints.

Each file is mapped once (copy-on-write, so nothing is ever written back) and every tensor is a zero-copy
view into its mapping: the weights are read from disk page by page as the forward first touches them, and
loading never holds a second copy. The header is parsed and checked here, so a truncated or corrupt file
fails with a `CheckpointError` naming it rather than crashing later.
"""

from __future__ import annotations

import json
import math
import mmap
import struct
from pathlib import Path
from typing import NamedTuple

import torch

from hybridcache.gpu.model.errors import CheckpointError

SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"
HEADER_LENGTH_BYTES = 8
MAX_HEADER_BYTES = 100 * 1024 * 1024

SAFETENSORS_DTYPES: dict[str, torch.dtype] = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}


class TensorEntry(NamedTuple):
    """Where one tensor lies inside its file's data section."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int
    end: int


class SafetensorsFile:
    """One memory-mapped .safetensors file. Construction validates the header; raises `CheckpointError`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._mapping = _map_file(path)
        self.data_start, self.entries = _parse_header(path, self._mapping)

    def tensor(self, name: str) -> torch.Tensor:
        """A zero-copy view of tensor `name` (raises KeyError when absent). Does not mutate."""
        entry = self.entries[name]
        nbytes = entry.end - entry.begin
        if nbytes == 0:
            return torch.empty(entry.shape, dtype=entry.dtype)
        raw = torch.frombuffer(
            self._mapping, dtype=torch.uint8, count=nbytes, offset=self.data_start + entry.begin
        )
        return raw.view(entry.dtype).reshape(entry.shape)

    def release(self, name: str, rows: slice) -> None:
        """Drop this process's resident pages of tensor `name`'s rows `rows` (whole pages inside them only).

        The mapping is copy-on-write and never written, so a later read of those rows faults the file's
        bytes back in: views stay valid. Used after a weight was copied (packed or converted), so that
        loading does not keep two resident copies. Raises KeyError when `name` is absent.
        """
        entry = self.entries[name]
        row_bytes = (entry.end - entry.begin) // max(entry.shape[0], 1) if entry.shape else 0
        first, stop, _ = rows.indices(entry.shape[0] if entry.shape else 0)
        start = self.data_start + entry.begin + first * row_bytes
        end = self.data_start + entry.begin + stop * row_bytes
        page = mmap.PAGESIZE
        low, high = -(-start // page) * page, end // page * page
        if high > low:
            self._mapping.madvise(mmap.MADV_DONTNEED, low, high - low)


class CheckpointWeights:
    """Every weight of a checkpoint directory by name, each file mapped once and lazily.

    `tensor(name)` raises `CheckpointError` naming the file that should hold the weight.
    """

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self._owner = _weight_files(directory)
        self._files: dict[Path, SafetensorsFile] = {}

    def names(self) -> list[str]:
        """Every weight name the checkpoint declares."""
        return list(self._owner)

    def has(self, name: str) -> bool:
        return name in self._owner

    def file_of(self, name: str) -> Path:
        """The file that holds (or, when absent, should hold) weight `name`."""
        return self._owner.get(name) or self._declaring_file()

    def tensor(self, name: str) -> torch.Tensor:
        """A zero-copy view of weight `name`. Maps its file on first use; raises `CheckpointError`."""
        path = self._owner.get(name)
        if path is None:
            raise CheckpointError(self._declaring_file(), f"missing weight {name!r}")
        file = self._files.get(path)
        if file is None:
            file = self._files[path] = SafetensorsFile(path)
        if name not in file.entries:
            raise CheckpointError(path, f"missing weight {name!r} (listed in {INDEX_FILE})")
        return file.tensor(name)

    def release(self, name: str, rows: slice = slice(None)) -> None:
        """Drop the resident pages of weight `name` (its rows `rows`); see `SafetensorsFile.release`.

        Mutates nothing a reader can see; raises `CheckpointError` when the weight is missing.
        """
        self.tensor(name)  # maps the file and checks the name
        self._files[self._owner[name]].release(name, rows)

    def location(self, name: str) -> tuple[Path, int, TensorEntry]:
        """(file, byte offset of the tensor's first element in it, entry) of weight `name`. Raises
        `CheckpointError` when it is missing."""
        self.tensor(name)  # maps the file and checks the name
        path = self._owner[name]
        file = self._files[path]
        entry = file.entries[name]
        return path, file.data_start + entry.begin, entry

    def nbytes(self) -> int:
        """Total bytes of the weight files (what memory-mapping all of them costs at most)."""
        return sum(path.stat().st_size for path in set(self._owner.values()))

    def _declaring_file(self) -> Path:
        index = self.directory / INDEX_FILE
        return index if index.exists() else self.directory / SINGLE_FILE


def _weight_files(directory: Path) -> dict[str, Path]:
    """Weight name -> the file that holds it. Single files are opened to read their header."""
    if not directory.is_dir():
        raise CheckpointError(directory, "not a checkpoint directory")
    index = directory / INDEX_FILE
    if index.exists():
        return _read_index(index)
    single = directory / SINGLE_FILE
    if not single.exists():
        raise CheckpointError(
            single, f"missing: no {SINGLE_FILE} or {INDEX_FILE} in the checkpoint directory"
        )
    return dict.fromkeys(SafetensorsFile(single).entries, single)


def _read_index(index: Path) -> dict[str, Path]:
    try:
        raw = json.loads(index.read_text(encoding="utf-8"))
        weight_map = raw["weight_map"]
        if not isinstance(weight_map, dict):
            raise TypeError("weight_map is not an object")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError) as exc:
        raise CheckpointError(index, f"malformed index ({exc})") from None
    owners: dict[str, Path] = {}
    for name, filename in weight_map.items():
        shard = index.parent / str(filename)
        if not shard.exists():
            raise CheckpointError(shard, f"missing shard (listed in {INDEX_FILE})")
        owners[name] = shard
    return owners


def _map_file(path: Path) -> mmap.mmap:
    try:
        with path.open("rb") as handle:
            size = path.stat().st_size
            if size < HEADER_LENGTH_BYTES:
                raise CheckpointError(path, "corrupt safetensors: shorter than its header length")
            return mmap.mmap(handle.fileno(), 0, access=mmap.ACCESS_COPY)
    except OSError as exc:
        raise CheckpointError(path, f"cannot read ({exc})") from None


def _parse_header(path: Path, mapping: mmap.mmap) -> tuple[int, dict[str, TensorEntry]]:
    """(data section start, entries). Raises `CheckpointError` for any inconsistency."""
    (header_len,) = struct.unpack("<Q", mapping[:HEADER_LENGTH_BYTES])
    data_start = HEADER_LENGTH_BYTES + header_len
    if header_len > MAX_HEADER_BYTES or data_start > len(mapping):
        raise CheckpointError(path, f"corrupt safetensors: header length {header_len} exceeds the file")
    try:
        header = json.loads(bytes(mapping[HEADER_LENGTH_BYTES:data_start]))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise CheckpointError(path, f"corrupt safetensors: header is not JSON ({exc})") from None
    if not isinstance(header, dict):
        raise CheckpointError(path, "corrupt safetensors: header is not a JSON object")
    data_bytes = len(mapping) - data_start
    entries = {}
    for name, spec in header.items():
        if name != "__metadata__":
            entries[name] = _entry(path, name, spec, data_bytes)
    return data_start, entries


def _entry(path: Path, name: str, spec: object, data_bytes: int) -> TensorEntry:
    try:
        dtype = SAFETENSORS_DTYPES[spec["dtype"]]  # type: ignore[index]
        shape = tuple(int(d) for d in spec["shape"])  # type: ignore[index]
        begin, end = (int(o) for o in spec["data_offsets"])  # type: ignore[index]
    except (KeyError, TypeError, ValueError) as exc:
        raise CheckpointError(path, f"corrupt safetensors: bad entry for {name!r} ({exc!r})") from None
    expected = math.prod(shape) * dtype.itemsize
    if not 0 <= begin <= end <= data_bytes or end - begin != expected:
        raise CheckpointError(
            path,
            f"corrupt safetensors: {name!r} data [{begin}, {end}) does not fit "
            f"{data_bytes} data bytes / {expected} expected",
        )
    return TensorEntry(dtype, shape, begin, end)
