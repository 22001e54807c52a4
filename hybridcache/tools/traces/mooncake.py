"""Reader for Mooncake traces: JSONL, one request per line, 512-token block ids, global ids, no sessions.

Each line has `timestamp` (ms from the trace start), `input_length`, `output_length` and `hash_ids`
(``ceil(input_length / 512)`` ids; the last one may cover a partial block). Ids are global within a file,
so shared prefixes across requests are visible; each file still gets its own id range, so two Mooncake
files loaded together never share blocks by accident. With no session ids, every request is a
conversation of its own (``"<file stem>#<line>"``); the clock is global.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np

from hybridcache.tools.traces.ids import IdSpace
from hybridcache.tools.traces.model import (
    Conversation,
    TraceFormatError,
    TraceRequest,
    blocks_for,
    frozen_ids,
)

MOONCAKE_BLOCK_SIZE = 512


class MooncakeLine(msgspec.Struct):
    timestamp: float
    input_length: int
    output_length: int
    hash_ids: list[int]


_DECODER = msgspec.json.Decoder(MooncakeLine)


def read_mooncake(path: Path, data: bytes, ids: IdSpace) -> list[Conversation]:
    """One single-request conversation per line. Mutates `ids` (reserves the file's id range).

    Raises TraceFormatError naming the line for malformed JSON or a wrong number of hash ids.
    """
    lines = [(number, line) for number, line in enumerate(data.splitlines(), 1) if line.strip()]
    records = [_decode(path, number, line) for number, line in lines]
    arrays = [np.array(r.hash_ids, dtype=np.int64) for r in records]
    for (number, _), record, array in zip(lines, records, arrays):
        _check(path, number, record, array)
    span = 1 + max((int(a.max()) for a in arrays if len(a)), default=-1)
    offset = ids.reserve(span)
    return [_conversation(path, number, record, array + offset)
            for (number, _), record, array in zip(lines, records, arrays)]


def _decode(path: Path, number: int, line: bytes) -> MooncakeLine:
    try:
        return _DECODER.decode(line)
    except msgspec.DecodeError as error:
        raise TraceFormatError(str(path), f"line {number}: {error}") from None


def _check(path: Path, number: int, record: MooncakeLine, ids: np.ndarray) -> None:
    expected = blocks_for(record.input_length, MOONCAKE_BLOCK_SIZE)
    if record.input_length < 0 or len(ids) != expected or (len(ids) and ids.min() < 0):
        raise TraceFormatError(str(path), f"line {number}: {len(ids)} hash ids for {record.input_length} "
                               f"tokens (expected {expected} non-negative ids)")


def _conversation(path: Path, number: int, record: MooncakeLine, ids: np.ndarray) -> Conversation:
    name = f"{path.stem}#{number}"
    arrival = record.timestamp / 1000.0
    request = TraceRequest(conversation=name, parent=None, turn=0, arrival_s=arrival,
                           input_tokens=record.input_length, output_tokens=record.output_length,
                           block_ids=frozen_ids(ids), block_size=MOONCAKE_BLOCK_SIZE)
    return Conversation(id=name, parent=None, start_s=arrival, requests=(request,))
