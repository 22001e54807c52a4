"""The event journal: batched appends, torn tails, corruption, rotation, never truncating history."""

import threading
from pathlib import Path

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hybridcache.persistence.framing import FRAME_HEADER
from hybridcache.persistence.journal import (
    MAGIC,
    JournalError,
    JournalReader,
    JournalWriter,
    journal_segments,
)


def payload(seq: int) -> bytes:
    return f"event-{seq}-".encode() * (1 + seq % 5)


def write_journal(path: Path, count: int, **options) -> list[bytes]:
    writer = JournalWriter(path, fingerprint={"model": "m"}, options={"chunk": 64}, **options)
    written = [payload(seq) for seq in range(1, count + 1)]
    for seq, data in enumerate(written, start=1):
        writer.append(seq, data)
    writer.close()
    return written


def read_all(path: Path) -> tuple[list[bytes], list]:
    events, damages = [], []
    for segment in journal_segments(path):
        reader = JournalReader(segment)
        events.extend(bytes(p) for p in reader.payloads())
        damages.append(reader.damage)
    return events, damages


def test_appended_events_read_back_in_order_with_the_header(tmp_path: Path):
    path = tmp_path / "events.log"
    written = write_journal(path, 500)
    reader = JournalReader(path)
    assert reader.header.first_seq == 1
    assert reader.header.fingerprint == {"model": "m"}
    assert [bytes(p) for p in reader.payloads()] == written
    assert reader.damage is None
    assert path.stat().st_mode & 0o777 == 0o600


def test_flush_makes_appended_events_readable_while_the_writer_lives(tmp_path: Path):
    path = tmp_path / "events.log"
    writer = JournalWriter(path)
    for seq in range(1, 11):
        writer.append(seq, payload(seq))
    writer.flush()
    assert [bytes(p) for p in JournalReader(path).payloads()] == [payload(s) for s in range(1, 11)]
    writer.close()


@settings(max_examples=25, deadline=None)
@given(cut=st.floats(min_value=0.0, max_value=1.0))
def test_a_torn_tail_is_reported_and_the_prefix_still_reads(tmp_path_factory, cut: float):
    path = tmp_path_factory.mktemp("torn") / "events.log"
    written = write_journal(path, 40)
    data = path.read_bytes()
    header_end = JournalReader(path).offset
    keep = header_end + int(cut * (len(data) - header_end))
    path.write_bytes(data[:keep])
    reader = JournalReader(path)
    events = [bytes(p) for p in reader.payloads()]
    assert events == written[: len(events)]
    if keep < len(data):
        frames_bytes = sum(FRAME_HEADER.size + len(w) for w in written[: len(events)])
        torn = keep != header_end + frames_bytes
        assert (reader.damage is not None) == torn
        if torn:
            assert "torn" in reader.damage.reason


def test_a_flipped_byte_stops_reading_at_that_frame(tmp_path: Path):
    path = tmp_path / "events.log"
    written = write_journal(path, 20)
    data = bytearray(path.read_bytes())
    data[-3] ^= 0xFF  # inside the last frame's payload
    path.write_bytes(bytes(data))
    reader = JournalReader(path)
    assert [bytes(p) for p in reader.payloads()] == written[:-1]
    assert reader.damage is not None and reader.damage.reason == "frame checksum mismatch"


def test_rotation_keeps_every_event_across_segments(tmp_path: Path):
    path = tmp_path / "events.log"
    written = write_journal(path, 300, max_segment_bytes=2000, flush_interval_s=0.001)
    segments = journal_segments(path)
    assert len(segments) > 1 and segments[-1] == path
    events, damages = read_all(path)
    assert events == written
    assert damages == [None] * len(segments)
    first_seqs = [JournalReader(s).header.first_seq for s in segments]
    assert first_seqs == sorted(first_seqs) and first_seqs[0] == 1


def test_a_new_writer_never_truncates_the_previous_journal(tmp_path: Path):
    path = tmp_path / "events.log"
    first = write_journal(path, 5)
    second = write_journal(path, 3)
    events, _ = read_all(path)
    assert events == first + second


def test_a_file_that_is_not_a_journal_is_refused(tmp_path: Path):
    path = tmp_path / "events.log"
    path.write_bytes(b"not a journal at all")
    with pytest.raises(JournalError, match="wrong magic"):
        JournalReader(path)
    path.write_bytes(MAGIC + b"\x01")
    with pytest.raises(JournalError, match="header"):
        JournalReader(path)


class Record(msgspec.Struct, frozen=True, array_like=True):
    seq: int
    text: str


def encode_record(record: Record) -> bytes:
    return msgspec.msgpack.encode(record)


def run_with_deadline(call, seconds: float = 20.0) -> None:
    """Run ``call`` on a thread; fail when it has not returned within ``seconds`` (a hang, not a timing)."""
    worker = threading.Thread(target=call, daemon=True)
    worker.start()
    worker.join(seconds)
    assert not worker.is_alive(), f"{call} did not return within {seconds} s"


def test_records_are_encoded_on_the_writer_thread_and_read_back_in_order(tmp_path: Path):
    path = tmp_path / "events.log"
    writer = JournalWriter(path, encode=encode_record)
    records = [Record(seq, f"r{seq}") for seq in range(1, 41)]
    for record in records[:20]:
        writer.append_record(record.seq, record)
    for record in records[20:]:
        writer.append(record.seq, encode_record(record))  # pre-encoded bytes mix with records
    writer.close()
    decoded = [msgspec.msgpack.decode(bytes(p), type=Record) for p in JournalReader(path).payloads()]
    assert decoded == records


def test_a_writer_without_an_encoder_refuses_records(tmp_path: Path):
    writer = JournalWriter(tmp_path / "events.log")
    with pytest.raises(ValueError, match="encode"):
        writer.append_record(1, Record(1, "x"))
    writer.close()


def test_events_appended_together_land_in_one_batch_and_flush_cuts_the_wait_short(tmp_path: Path):
    """A long batching window: a burst of appends is one write, and flush() does not wait the window."""
    path = tmp_path / "events.log"
    writer = JournalWriter(path, encode=encode_record, flush_interval_s=600.0)
    for seq in range(1, 51):
        writer.append_record(seq, Record(seq, "burst"))
    run_with_deadline(writer.flush)
    assert len(list(JournalReader(path).payloads())) == 50
    assert writer.batches_written == 1
    writer.append_record(51, Record(51, "late"))
    run_with_deadline(writer.close)
    assert len(list(JournalReader(path).payloads())) == 51 and writer.batches_written == 2


def test_an_idle_writer_writes_nothing_until_an_event_arrives(tmp_path: Path):
    path = tmp_path / "events.log"
    writer = JournalWriter(path, encode=encode_record, flush_interval_s=0.001)
    writer.flush()
    assert writer.batches_written == 0 and not path.exists()
    writer.append_record(1, Record(1, "first"))
    writer.flush()
    assert writer.batches_written == 1 and len(list(JournalReader(path).payloads())) == 1
    writer.close()


def test_a_record_that_cannot_be_encoded_fails_the_next_flush_not_the_worker(tmp_path: Path):
    def refuse(record: Record) -> bytes:
        raise TypeError(f"cannot encode {record}")

    writer = JournalWriter(tmp_path / "events.log", encode=refuse)
    writer.append_record(1, Record(1, "bad"))  # the caller's thread never encodes
    with pytest.raises(OSError, match="cannot encode"):
        writer.flush()
    with pytest.raises(OSError, match="cannot encode"):
        writer.close()
