"""`hybridcache replay`: text, --json, --until, --stats, --find-violation and exit codes on journals
written through the real event sink."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

_TESTS = Path(__file__).resolve().parent.parent
if str(_TESTS / "cache") not in sys.path:  # shared factories (importlib import mode)
    sys.path.insert(0, str(_TESTS / "cache"))

from cache_factories import geometry, run_request, tokens  # noqa: E402

from hybridcache.cache import events as ev  # noqa: E402
from hybridcache.cache.facade import Cache  # noqa: E402
from hybridcache.persistence.event_sink import open_journal  # noqa: E402
from hybridcache.persistence.journal import JournalReader, JournalWriter  # noqa: E402
from hybridcache.tools import replay  # noqa: E402

GEOMETRY = geometry(num_pages=96, host_slabs=256)


@pytest.fixture(scope="module")
def journal(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Cache]:
    path = tmp_path_factory.mktemp("replay") / "events.log"
    sink = open_journal(str(path), "/models/x", GEOMETRY, {})
    cache = Cache(GEOMETRY, journal=sink)
    for turn in range(3):
        run_request(
            cache, tokens(150, 1) + tokens(100 + 30 * turn, turn), generated=tokens(40, turn), taps=[128]
        )
        cache.checkpoint()
    sink.writer.close()
    return path, cache


def replay_cli(capsys, *argv: object) -> tuple[int, str, str]:
    parser = argparse.ArgumentParser()
    replay.add_arguments(parser)
    code = replay.run(parser.parse_args([str(a) for a in argv]))
    out, err = capsys.readouterr()
    return code, out, err


def test_a_clean_journal_replays_with_exit_0_and_the_live_digest(journal, capsys):
    path, cache = journal
    code, out, _ = replay_cli(capsys, path)
    assert code == 0
    assert f"events        {cache.index.seq} applied, 3 checkpoints proved" in out
    assert f"digest             {cache.index.digest()}" in out


def test_json_output_is_the_full_result(journal, capsys):
    path, cache = journal
    code, out, _ = replay_cli(capsys, path, "--json")
    result = json.loads(out)
    assert code == 0 and result["violation"] is None and result["damage"] == []
    assert result["state"]["digest"] == cache.index.digest()
    assert sum(result["event_counts"].values()) == cache.index.seq


def test_until_stops_and_prints_the_state_there(journal, capsys):
    path, _ = journal
    code, out, _ = replay_cli(capsys, path, "--until", 17)
    assert code == 0 and "stopped       at seq 17 (--until)" in out and "  seq                17" in out


def test_stats_prints_event_counts_and_rows_over_time(journal, capsys):
    path, cache = journal
    _, out, _ = replay_cli(capsys, path, "--stats", "--stats-every", 20)
    rows = out.split("slabs\n", 1)[1].strip().splitlines()
    assert [int(r.split()[0]) for r in rows] == [*range(20, cache.index.seq, 20), cache.index.seq]
    assert "  SnapshotPublished" in out and "events by type" in out


def test_a_torn_tail_is_reported_with_exit_0(journal, tmp_path: Path, capsys):
    path, _ = journal
    torn = tmp_path / "events.log"
    torn.write_bytes(path.read_bytes()[:-3])
    code, out, _ = replay_cli(capsys, torn)
    assert code == 0 and "torn tail (crashed writer): events.log at byte" in out


def test_find_violation_shows_the_planted_event_and_exits_1(journal, tmp_path: Path, capsys):
    path, _ = journal
    reader = JournalReader(path)
    events = [ev.decode_event(p) for p in reader.payloads()]
    planted = 12
    writer = JournalWriter(tmp_path / "bad.log", options=reader.header.options)
    for event in events[: planted - 1]:
        writer.append(event.seq, ev.encode_event(event))
    writer.append(planted, ev.encode_event(ev.SubtreeDeleted(planted, 424242)))
    writer.close()

    code, out, _ = replay_cli(capsys, tmp_path / "bad.log", "--find-violation")

    assert code == 1
    assert f"violation     after event seq {planted} (rejected)" in out
    assert "SubtreeDeleted(seq=12, node=424242)" in out and "node 424242 does not exist" in out


def test_find_violation_on_a_clean_journal_says_none(journal, capsys):
    path, _ = journal
    code, out, _ = replay_cli(capsys, path, "--find-violation")
    assert code == 0 and "violation     none" in out


def test_a_missing_journal_exits_2(tmp_path: Path, capsys):
    code, _, err = replay_cli(capsys, tmp_path / "nothing.log")
    assert code == 2 and "no journal" in err
