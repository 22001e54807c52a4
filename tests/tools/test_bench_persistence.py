"""`hybridcache bench persistence` with tiny sizes: every line is printed, the file round trip restores
everything it saved, the ratios are the quotients of the printed rates, and the journal overhead is a
median over alternating pairs of requests journaled on and off. Speed is not asserted: that is what
the printed ratios are for."""

from __future__ import annotations

import asyncio
import contextlib
import io
from pathlib import Path

import pytest

from hybridcache.cache.events import decode_event
from hybridcache.cli import main
from hybridcache.persistence.journal import JournalReader, journal_segments
from hybridcache.tools.bench_journal import measure_journal

FILE_LINES = (
    "file_bytes", "saved_snapshots", "loaded_snapshots", "save_gib_per_s", "load_gib_per_s",
    "disk_write_gib_per_s", "disk_read_gib_per_s", "disk_stream_read_gib_per_s",
    "memory_first_touch_gib_per_s", "save_vs_disk", "load_vs_disk", "load_vs_disk_stream",
)  # fmt: skip


def parse_lines(text: str) -> dict[str, str]:
    pairs = [line.split("=", 1) for line in text.splitlines() if "=" in line]
    return {name: value for name, value in pairs}


def assert_ratio(lines: dict[str, str], ratio: str, numerator: str, denominator: str) -> None:
    expected = float(lines[numerator]) / float(lines[denominator])
    assert float(lines[ratio]) == pytest.approx(expected, rel=2e-3), (ratio, lines)


@pytest.fixture(scope="module")
def file_run(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    folder = tmp_path_factory.mktemp("bench")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = main(
            ["bench", "persistence", "--host-cache-mib", "48", "--dir", str(folder), "--skip-journal"]
        )
    assert code == 0
    return parse_lines(out.getvalue())


def test_every_file_line_is_printed_and_the_load_restores_what_the_save_wrote(file_run):
    assert set(FILE_LINES) <= set(file_run), file_run
    assert int(file_run["saved_snapshots"]) > 0
    assert file_run["loaded_snapshots"] == file_run["saved_snapshots"]
    assert int(file_run["file_bytes"]) > 0
    assert "journal_overhead" not in file_run  # --skip-journal


def test_the_ratios_are_quotients_of_the_printed_rates(file_run):
    assert_ratio(file_run, "save_vs_disk", "save_gib_per_s", "disk_write_gib_per_s")
    assert_ratio(file_run, "load_vs_disk", "load_gib_per_s", "disk_read_gib_per_s")
    assert_ratio(file_run, "load_vs_disk_stream", "load_gib_per_s", "disk_stream_read_gib_per_s")


def test_journal_overhead_is_the_median_of_alternating_pairs_journaled_on_and_off(tmp_path: Path):
    overhead = asyncio.run(measure_journal(tmp_path, tokens=12, pairs=3))
    assert overhead.pairs == 3
    assert 0 < overhead.lowest <= overhead.median <= overhead.highest
    assert overhead.cpu_median > 0
    assert overhead.events_per_token > 0 and overhead.cpu_us_per_event > 0
    assert overhead.cpu_share > 0
    seqs = [
        decode_event(bytes(payload)).seq
        for segment in journal_segments(tmp_path / "events.log")
        for payload in JournalReader(segment).payloads()
    ]
    assert seqs == sorted(seqs) and len(seqs) > 0
    # the "off" requests' events never reached the log: the sequence has gaps where they ran
    assert seqs[-1] - seqs[0] + 1 > len(seqs)
