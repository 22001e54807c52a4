"""Length-prefixed, CRC32-checked frames: the record format of the event journal.

A frame is `u32 length | u32 crc32(payload) | payload` (little endian). A reader stops at the first frame
that is incomplete or fails its checksum and reports where and why; everything before it stays readable.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterator
from typing import NamedTuple

FRAME_HEADER = struct.Struct("<II")
MAX_FRAME_BYTES = 64 << 20


class FrameDamage(NamedTuple):
    """Where reading stopped, and why (a torn tail from a crash, or corruption)."""

    offset: int
    reason: str


def encode_frame(payload: bytes) -> bytes:
    """One frame around `payload`. Pure."""
    if len(payload) > MAX_FRAME_BYTES:
        raise ValueError(f"a frame holds at most {MAX_FRAME_BYTES} bytes, got {len(payload)}")
    return FRAME_HEADER.pack(len(payload), zlib.crc32(payload)) + payload


class FrameReader:
    """Iterates the payloads of `data[start:]`; `damage` is set when it stopped early."""

    def __init__(self, data: bytes | memoryview, start: int = 0) -> None:
        self._data = memoryview(data)
        self.offset = start
        self.damage: FrameDamage | None = None

    def __iter__(self) -> Iterator[memoryview]:
        data, size = self._data, len(self._data)
        while self.offset < size:
            if size - self.offset < FRAME_HEADER.size:
                self.damage = FrameDamage(self.offset, "torn frame header at the end of the file")
                return
            length, crc = FRAME_HEADER.unpack_from(data, self.offset)
            begin = self.offset + FRAME_HEADER.size
            if length > MAX_FRAME_BYTES:
                self.damage = FrameDamage(self.offset, f"frame length {length} is not plausible")
                return
            if begin + length > size:
                self.damage = FrameDamage(self.offset, "torn frame at the end of the file")
                return
            payload = data[begin : begin + length]
            if zlib.crc32(payload) != crc:
                self.damage = FrameDamage(self.offset, "frame checksum mismatch")
                return
            self.offset = begin + length
            yield payload
