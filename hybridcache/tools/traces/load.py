"""`load_trace`: read a trace file, a directory of them, or several files, detecting the format.

Detection decodes the file as one JSON object, else its first line: an object with `requests` and
`block_size` is a WEKA conversation file, one with `timestamp` and `hash_ids` a Mooncake line, one with
`conversation` a line of our JSONL format. A directory contributes its ``*.json`` and ``*.jsonl`` files
in name order (others, like LICENSE, are skipped). All files of one load must have the same format and
block size.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import msgspec

from hybridcache.cache.ids import BLOCK_TOKENS
from hybridcache.tools.traces.ids import IdSpace
from hybridcache.tools.traces.jsonl import read_jsonl
from hybridcache.tools.traces.model import Conversation, Trace, TraceFormat, TraceFormatError
from hybridcache.tools.traces.mooncake import read_mooncake
from hybridcache.tools.traces.weka import read_weka

TRACE_SUFFIXES = (".json", ".jsonl")


class _Probe(msgspec.Struct):
    """Which keys the first object of a file has (values skipped unparsed)."""

    requests: msgspec.Raw = msgspec.Raw(b"")
    block_size: msgspec.Raw = msgspec.Raw(b"")
    timestamp: msgspec.Raw = msgspec.Raw(b"")
    hash_ids: msgspec.Raw = msgspec.Raw(b"")
    conversation: msgspec.Raw = msgspec.Raw(b"")


_PROBE = msgspec.json.Decoder(_Probe)


def load_trace(source: str | Path | Sequence[str | Path], *, shared_prefix: bool = False) -> Trace:
    """The trace in `source` (a file, a directory, or a list of either), normalized (see `model.py`).

    `shared_prefix` makes WEKA conversations share their tool + system prefix (ignored by other formats).
    Raises TraceFormatError for a missing, empty, unrecognized, malformed or mixed-format source.
    """
    sources = [source] if isinstance(source, str | Path) else list(source)
    files = [file for item in sources for file in _files(Path(item))]
    if not files:
        raise TraceFormatError(", ".join(map(str, sources)), "no trace files (*.json, *.jsonl)")
    ids = IdSpace()
    formats: set[TraceFormat] = set()
    conversations: list[Conversation] = []
    for file in files:
        data = _read(file)
        kind = detect_format(file, data)
        formats.add(kind)
        if len(formats) > 1:
            raise TraceFormatError(str(file), f"format {kind} mixed with {sorted(formats - {kind})}")
        conversations.extend(_read_file(file, data, kind, ids, shared_prefix))
    kind = formats.pop()
    return Trace(name=", ".join(map(str, sources)), format=kind, block_size=_block_size(files, conversations),
                 clock="conversation" if kind == "weka" else "global", conversations=tuple(conversations))


def detect_format(path: Path, data: bytes) -> TraceFormat:
    """The format of a file's bytes. Pure; raises TraceFormatError when no format matches."""
    probe = _probe(data) or _probe(data.lstrip().split(b"\n", 1)[0])
    if probe is None:
        raise TraceFormatError(str(path), "not a trace: neither a JSON object nor JSON lines")
    if len(probe.requests) > 0 and len(probe.block_size) > 0:
        return "weka"
    if len(probe.timestamp) > 0 and len(probe.hash_ids) > 0:
        return "mooncake"
    if len(probe.conversation) > 0:
        return "jsonl"
    raise TraceFormatError(str(path), "unrecognized trace format (neither WEKA, Mooncake nor our JSONL)")


def _probe(data: bytes) -> _Probe | None:
    try:
        return _PROBE.decode(data)
    except msgspec.DecodeError:
        return None


def _files(path: Path) -> list[Path]:
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.suffix in TRACE_SUFFIXES and p.is_file())
    if not path.exists():
        raise TraceFormatError(str(path), "no such file or directory")
    return [path]


def _read(path: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise TraceFormatError(str(path), f"cannot read: {error.strerror}") from None


def _read_file(path: Path, data: bytes, kind: TraceFormat, ids: IdSpace,
               shared_prefix: bool) -> list[Conversation]:
    if kind == "weka":
        return read_weka(path, data, ids, shared_prefix=shared_prefix)
    if kind == "mooncake":
        return read_mooncake(path, data, ids)
    return read_jsonl(path, data)


def _block_size(files: list[Path], conversations: list[Conversation]) -> int:
    sizes = {r.block_size for c in conversations for r in c.requests}
    if len(sizes) > 1:
        raise TraceFormatError(", ".join(map(str, files)), f"block sizes differ: {sorted(sizes)}")
    return sizes.pop() if sizes else BLOCK_TOKENS
