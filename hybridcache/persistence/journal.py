"""The event journal (`--event-log PATH`): every cache event, appended off the worker's critical path.

Layout of one segment file: the magic bytes, then a header frame (msgpack `JournalHeader`: format version,
engine fingerprint, options, the segment number and the sequence number of its first event), then one
frame per encoded event (see `framing`). The worker calls `append_record()` (a list append under a
lock: no encoding on the worker); a writer thread encodes, frames and writes batches. When a segment
passes `max_segment_bytes` it is renamed to `PATH.<n>` (n = 1, 2, … oldest first) and a new `PATH`
begins, so `PATH` is always the newest segment. A crash leaves at most a torn last frame, which readers
report and stop at. Nothing on disk changes until the first batch is written (a previous run's `PATH`
is renamed away then, not when the writer is made), so a start that fails before it serves leaves the
journal as it found it. Segments are created 0600 (see `file_safety`).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, BinaryIO

import msgspec

from hybridcache.logs import get_logger
from hybridcache.persistence.file_safety import create_private_file
from hybridcache.persistence.framing import FrameDamage, FrameReader, encode_frame

log = get_logger(__name__)

MAGIC = b"HCJOURNAL\x00"
FORMAT_VERSION = 4  # 2: LaneStaged names its path by the deepest node (path_end); 3: Checkpoint digests
# hash live_snapshots_below saturated at LIVE_BELOW_CAP (see BlockNode); 4: a Checkpoint may digest one
# slice of the state (part, parts; cache/checkpoint_round.py)
READABLE_FORMATS = (3, 4)  # a format-3 journal reads as is: its Checkpoints are whole-state digests
DEFAULT_MAX_SEGMENT_BYTES = 256 << 20


class JournalError(ValueError):
    """A journal file is not a journal, or of another format version."""


class JournalHeader(msgspec.Struct, frozen=True, kw_only=True):
    format_version: int
    segment: int
    first_seq: int
    fingerprint: dict[str, str] = {}
    options: dict[str, object] = {}


_encode_header = msgspec.msgpack.Encoder().encode
_decode_header = msgspec.msgpack.Decoder(JournalHeader).decode


def create_segment_file(path: Path) -> BinaryIO:
    """A new segment file at `path`, created 0600 in one call. Raises OSError (FileExistsError if it
    exists)."""
    return os.fdopen(create_private_file(path), "wb")


class JournalWriter:
    """Appends events to a journal in a background thread.

    `append()` (encoded bytes) and `append_record()` (an immutable record the writer thread encodes with
    `encode`) never block on I/O and never encode on the caller's thread: they queue under a lock. The
    writer thread sleeps while nothing is queued; the first queued event wakes it, it lets a batch gather
    for `flush_interval_s` (the most an event waits to reach the file), then encodes, frames and writes
    the batch with one write call. `flush()` returns once everything appended so far is on disk (with
    `fsync=True`, durably). `close()` flushes and stops the thread.

    With `hold=True` events queue but nothing is written (and no file is touched) until `release()`,
    `flush()` or `close()`: the engine holds its journal until it starts serving.

    A write error (disk full, I/O error) is logged at once, counted in `write_errors`, passed to
    `on_error` (on the writer thread), and raised by the next `flush()`/`close()`. Journaling stops there:
    later events are counted in `events_dropped`, never written after a gap, so the file stays a
    replayable prefix of the history.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        fingerprint: dict[str, str] | None = None,
        options: dict[str, object] | None = None,
        max_segment_bytes: int = DEFAULT_MAX_SEGMENT_BYTES,
        flush_interval_s: float = 0.05,
        encode: Callable[[Any], bytes] | None = None,
        hold: bool = False,
        open_segment: Callable[[Path], BinaryIO] | None = None,
        on_error: Callable[[BaseException], None] | None = None,
    ) -> None:
        self.path = Path(path)
        self._fingerprint = dict(fingerprint or {})
        self._options = dict(options or {})
        self._max_segment_bytes = max_segment_bytes
        self._flush_interval_s = flush_interval_s
        self._encode = encode
        self._open_file = open_segment or create_segment_file  # tests inject failing files here
        self._on_error = on_error
        self._pending: list[tuple[int, Any]] = []
        self._lock = threading.Condition(threading.Lock())
        self._appended = 0
        self._written = 0
        self.batches_written = 0  # write calls so far (the writer thread's wake-ups that found events)
        self.write_errors = 0  # failed writes (at most one: journaling stops at the first)
        self.events_dropped = 0  # events not written because of a failed write
        self._held = hold
        self._flush_wanted = False
        self._closing = False
        self._error: BaseException | None = None
        self._segment: int | None = None  # the number the next rotation gives PATH; set at the first write
        self._file: BinaryIO | None = None
        self._file_bytes = 0
        self._thread = threading.Thread(target=self._run, name="hybridcache-journal", daemon=True)
        self._thread.start()

    @property
    def failed(self) -> BaseException | None:
        """The write error that stopped journaling, or None while it works."""
        return self._error

    def append(self, seq: int, payload: bytes) -> None:
        """Queue one encoded event with its sequence number. Cheap; never touches the disk."""
        self._queue(seq, payload)

    def append_record(self, seq: int, record: Any) -> None:
        """Queue one record that the writer thread encodes with `encode`; the record must never change
        afterwards (cache events are frozen). Cheap. Raises ValueError when the writer has no `encode`."""
        if self._encode is None:
            raise ValueError("this journal writer was made without an encode function")
        self._queue(seq, record)

    def _queue(self, seq: int, item: Any) -> None:
        with self._lock:
            self._pending.append((seq, item))
            self._appended += 1
            if len(self._pending) == 1:  # the writer sleeps until a batch begins
                self._lock.notify_all()

    def release(self) -> None:
        """End a hold: queued events are written from now on. Idempotent."""
        with self._lock:
            self._held = False
            self._lock.notify_all()

    def flush(self, fsync: bool = False) -> None:
        """Block until every appended event is written; raises the writer's error if it had one."""
        with self._lock:
            target = self._appended
            self._held = False
            self._flush_wanted = True
            self._lock.notify_all()
            while self._written < target and self._error is None and self._thread.is_alive():
                self._lock.wait(0.1)
        self._raise_if_failed()
        if fsync and self._file is not None:
            with self._lock:
                os.fsync(self._file.fileno())

    def close(self) -> None:
        """Flush, fsync and stop the writer thread; the file is closed even after a write error, which is
        then raised as OSError. Idempotent."""
        with self._lock:
            self._held = False
            self._closing = True
            self._lock.notify_all()
        self._thread.join()
        if self._file is not None:
            file, self._file = self._file, None
            try:
                file.flush()
                os.fsync(file.fileno())
            except OSError as error:
                self._fail(error)
            finally:
                try:
                    file.close()
                except OSError as error:
                    self._fail(error)
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise OSError(f"event journal {self.path}: {self._error}") from self._error

    def _fail(self, error: BaseException) -> None:
        """Record a write error and report it at once (on the writer thread)."""
        first = self._error is None
        if first:  # logged before it is counted: whoever sees the count finds the line already written
            log.error("event journal %s: write failed: %s; journaling stopped (later events are not "
                      "recorded; the cache keeps serving)", self.path, error)
            self._error = error
        self.write_errors += 1
        if self._on_error is not None:
            self._on_error(error)

    def _run(self) -> None:
        while True:
            with self._lock:
                while (not self._pending or self._held) and not self._closing:
                    self._lock.wait()
                if not self._closing and not self._flush_wanted:
                    self._lock.wait(self._flush_interval_s)  # let the batch gather (flush/close cut it short)
                batch, self._pending = self._pending, []
                self._flush_wanted = False
                closing = self._closing
            if batch and self._error is None:
                try:
                    self._write(batch)
                except Exception as error:  # a write or an encode failed: kept for flush()/close()
                    self._fail(error)
                    self.events_dropped += len(batch)
            elif batch:
                self.events_dropped += len(batch)
            with self._lock:
                self._written += len(batch)
                self._lock.notify_all()
                if closing and not self._pending:
                    return

    def _write(self, batch: list[tuple[int, Any]]) -> None:
        frames: list[bytes] = []
        for seq, item in batch:
            payload = item if isinstance(item, bytes) else self._encode(item)  # type: ignore[misc]
            if self._file is not None and self._file_bytes >= self._max_segment_bytes:
                self._file.write(b"".join(frames))
                frames.clear()
                self._rotate()
            if self._file is None:
                self._open_segment(seq)
            frame = encode_frame(payload)
            frames.append(frame)
            self._file_bytes += len(frame)
        assert self._file is not None
        self._file.write(b"".join(frames))
        self._file.flush()
        self.batches_written += 1

    def _rotate(self) -> None:
        """Close the full segment and rename it `PATH.<n>`; the next frame opens a new `PATH`."""
        assert self._file is not None and self._segment is not None
        self._file.close()
        self._file = None
        os.replace(self.path, self.path.with_name(f"{self.path.name}.{self._segment}"))
        self._segment += 1

    def _open_segment(self, first_seq: int) -> None:
        if self._segment is None:  # the first write: a previous run's newest segment is kept, never truncated
            self._segment = _next_segment_number(self.path)
            if self.path.exists():
                os.replace(self.path, self.path.with_name(f"{self.path.name}.{self._segment}"))
                self._segment += 1
        header = JournalHeader(
            format_version=FORMAT_VERSION,
            segment=self._segment,
            first_seq=first_seq,
            fingerprint=self._fingerprint,
            options=self._options,
        )
        prologue = MAGIC + encode_frame(_encode_header(header))
        self._file = self._open_file(self.path)
        self._file.write(prologue)
        self._file_bytes = len(prologue)


def journal_segments(path: str | os.PathLike[str]) -> list[Path]:
    """The segment files of the journal at `path`, oldest first (rotated `PATH.<n>`, then `PATH`)."""
    base = Path(path)
    rotated = sorted(
        (int(p.name.rsplit(".", 1)[1]), p)
        for p in base.parent.glob(base.name + ".*")
        if p.name.rsplit(".", 1)[1].isdigit()
    )
    files = [p for _, p in rotated]
    if base.exists():
        files.append(base)
    return files


class JournalReader:
    """Reads one segment: its header, then its event payloads; `damage` tells where reading stopped."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)
        data = self.path.read_bytes()
        if not data.startswith(MAGIC):
            raise JournalError(f"{self.path} is not a hybridcache event journal (wrong magic bytes)")
        self._frames = FrameReader(data, len(MAGIC))
        self._payloads = iter(self._frames)
        first = next(self._payloads, None)
        if first is None:
            raise JournalError(f"{self.path}: unreadable journal header ({self._frames.damage})")
        try:
            self.header = _decode_header(first)
        except msgspec.DecodeError as error:
            raise JournalError(f"{self.path}: malformed journal header: {error}") from error
        if self.header.format_version not in READABLE_FORMATS:
            raise JournalError(
                f"{self.path}: journal format {self.header.format_version}, this build reads "
                f"{', '.join(map(str, READABLE_FORMATS))}"
            )

    def payloads(self) -> Iterator[memoryview]:
        """The encoded events in order; stops at a torn or corrupt frame (see `damage`)."""
        yield from self._payloads

    @property
    def damage(self) -> FrameDamage | None:
        return self._frames.damage

    @property
    def offset(self) -> int:
        return self._frames.offset


def _next_segment_number(base: Path) -> int:
    """Rotated segments already present keep their numbers; a new journal continues after them."""
    numbers = [int(p.name.rsplit(".", 1)[1]) for p in journal_segments(base) if p != base]
    return max(numbers, default=0) + 1
