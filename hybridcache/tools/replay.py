"""Replay an event journal (--event-log) into a fresh index and check it: frame CRCs, sequence numbers,
every event's validity, check_integrity after every event and every Checkpoint digest. Works on the
journal of a crashed process (a torn tail is reported; everything before it replays). --until SEQ stops
there and prints the state, --stats prints counts over time, --find-violation reports the first event
after which an invariant fails (with the event and the invariant), --json prints the result for scripts.
Exit status: 0 when the journal is a valid history (a torn tail allowed), 1 otherwise, 2 when it cannot
be replayed at all. Given a cache directory (--cache-dir), it folds the directory's contents journal and
verifies every entry a restart could restore instead (tools/inspect_dir.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import msgspec

from hybridcache.persistence.journal import JournalError
from hybridcache.persistence.replay_fold import ReplayError, ReplayResult, replay_journal
from hybridcache.tools.inspect_dir import replay_directory


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "log", type=Path,
        help="the journal path (rotated PATH.<n> segments are read too), or a cache directory (--cache-dir)",
    )
    parser.add_argument("--until", type=int, metavar="SEQ", help="stop after event SEQ and print the state")
    parser.add_argument("--stats", action="store_true", help="print counts over time")
    parser.add_argument("--stats-every", type=int, default=1000, metavar="N", help="events per stats row")
    parser.add_argument(
        "--find-violation", action="store_true", help="report the first event after which an invariant fails"
    )
    parser.add_argument(
        "--check-every",
        type=int,
        default=1,
        metavar="N",
        help="run check_integrity every N events (default 1)",
    )
    parser.add_argument("--json", action="store_true", help="print the result as JSON")


def run(args: argparse.Namespace) -> int:
    if args.log.is_dir():  # a cache directory: fold its contents journal and verify what it names
        return replay_directory(args.log, args.json)
    try:
        result = replay_journal(
            args.log,
            until=args.until,
            check_every=args.check_every,
            stats_every=args.stats_every if args.stats else 0,
        )
    except (ReplayError, JournalError, OSError) as error:
        print(f"hybridcache replay: {error}", file=sys.stderr)
        return 2
    if args.json:
        print(msgspec.json.encode(result).decode())
    else:
        print("\n".join(format_result(result, args.stats, args.find_violation)))
    return 0 if result.ok else 1


def format_result(result: ReplayResult, stats: bool, find_violation: bool) -> list[str]:
    """The text report. Pure."""
    lines = [
        f"segments      {len(result.segments)} ({', '.join(Path(s).name for s in result.segments)})",
        f"runs          {result.runs}" + ("" if result.runs == 1 else " (the last one was folded)"),
        f"events        {result.events} applied, {result.checkpoints} checkpoints proved",
    ]
    for damage in result.damage:
        what = "torn tail (crashed writer)" if damage.torn_tail else "CORRUPT"
        lines.append(
            f"damage        {what}: {Path(damage.segment).name} at byte {damage.offset}: {damage.reason}"
        )
    if find_violation or result.violation is not None:
        lines += _violation_lines(result)
    if result.stopped_at_until:
        lines.append(f"stopped       at seq {result.state.seq} (--until)")
    lines.append("state")
    lines += [f"  {name:<18} {value}" for name, value in msgspec.structs.asdict(result.state).items()]
    if stats:
        lines.append("events by type")
        lines += [f"  {name:<22} {count}" for name, count in result.event_counts.items()]
        lines.append("over time       seq   nodes   snaps  supers   lanes   pages   slabs")
        lines += [
            f"          {r.seq:>9} {r.nodes:>7} {r.snapshots:>7} {r.superseded:>7} {r.lanes:>7} "
            f"{r.device_pages_used:>7} {r.host_slabs_used:>7}"
            for r in result.stats
        ]
    return lines


def _violation_lines(result: ReplayResult) -> list[str]:
    violation = result.violation
    if violation is None:
        return ["violation     none: every invariant holds after every event"]
    return [
        f"violation     after event seq {violation.seq} ({violation.kind})",
        f"  event       {violation.event}",
        f"  invariant   {violation.invariant}",
    ]
