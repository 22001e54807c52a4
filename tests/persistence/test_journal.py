"""The event journal: batched appends, torn tails, corruption, rotation, never truncating history."""

from pathlib import Path

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
