"""Fold an event journal into a fresh index, checking everything (``hybridcache replay``). No torch.

The geometry comes from the first segment header's ``options["geometry"]`` (a ``CacheGeometry`` as a
dict, written by ``event_sink.open_journal``). Every segment is read oldest first; each frame's CRC is
checked by the reader, each event must carry the next sequence number, ``apply`` must accept it (a
``Checkpoint`` proves the digest), and ``check`` (``check_integrity``) must hold after it. The fold stops
at the first violation, at ``until``, or at a damaged frame; a damaged frame at the end of the newest
segment is the torn tail of a crashed process: everything before it is replayed and it is reported.
A segment whose first event is seq 1 after events were folded starts a new engine run: the fold begins
again from a fresh index and says so.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import msgspec

from hybridcache.cache import events as ev
from hybridcache.cache.errors import EventRejected, IntegrityError
from hybridcache.cache.geometry import CacheGeometry
from hybridcache.cache.index import PrefixIndex
from hybridcache.cache.integrity import check_integrity
from hybridcache.persistence.journal import JournalError, JournalReader, journal_segments

GEOMETRY_OPTION = "geometry"


class ReplayError(ValueError):
    """The journal cannot be replayed at all (no segments, no geometry, missing oldest segments)."""


class Damage(msgspec.Struct, frozen=True):
    segment: str
    offset: int
    reason: str
    torn_tail: bool  # at the end of the newest segment: a crash, not corruption


class Violation(msgspec.Struct, frozen=True):
    """The first event after which the journal stops being a valid history."""

    seq: int
    kind: str  # sequence | rejected | checkpoint | invariant | decode
    event: str  # the event, as text
    invariant: str  # what failed


class StatsRow(msgspec.Struct, frozen=True):
    seq: int
    nodes: int
    snapshots: int
    superseded: int
    lanes: int
    device_pages_used: int
    host_slabs_used: int


class IndexState(msgspec.Struct, frozen=True):
    seq: int
    digest: int
    nodes: int
    host_only_nodes: int
    snapshots: int
    superseded: int
    lanes: int
    device_pages_used: int
    host_slabs_used: int
    restores_open: int
    host_writes_open: int


class ReplayResult(msgspec.Struct, frozen=True):
    segments: list[str]
    events: int  # events applied in the run that was folded last
    runs: int
    checkpoints: int
    event_counts: dict[str, int]
    damage: list[Damage]
    violation: Violation | None
    stopped_at_until: bool
    state: IndexState
    stats: list[StatsRow]

    @property
    def ok(self) -> bool:
        """No violation and no damage but a torn tail."""
        return self.violation is None and all(d.torn_tail for d in self.damage)


def index_state(index: PrefixIndex) -> IndexState:
    """A summary of the index. Pure."""
    nodes = [n for n in index.nodes.values() if n.parent is not None]
    host = index.host
    return IndexState(
        seq=index.seq,
        digest=index.digest(),
        nodes=len(nodes),
        host_only_nodes=sum(1 for n in nodes if n.device_page is None),
        snapshots=len(index.snapshots),
        superseded=sum(1 for s in index.snapshots.values() if s.superseded),
        lanes=len(index.lanes),
        device_pages_used=index.pages.num_pages - index.pages.num_free,
        host_slabs_used=0 if host is None else host.num_used,
        restores_open=len(index.restores),
        host_writes_open=len(index.host_writes),
    )


def geometry_from_header(reader: JournalReader) -> CacheGeometry:
    """The index geometry recorded in a segment header. Raises ReplayError when absent or malformed."""
    raw = reader.header.options.get(GEOMETRY_OPTION)
    if raw is None:
        raise ReplayError(f"{reader.path}: the journal header has no options['{GEOMETRY_OPTION}']")
    try:
        return msgspec.convert(raw, CacheGeometry)
    except msgspec.ValidationError as error:
        raise ReplayError(f"{reader.path}: malformed geometry in the header: {error}") from error


class _Fold:
    def __init__(self, check: Callable[[PrefixIndex], None], check_every: int, stats_every: int) -> None:
        self.check = check
        self.check_every = max(1, check_every)
        self.stats_every = stats_every
        self.index: PrefixIndex | None = None
        self.counts: Counter[str] = Counter()
        self.stats: list[StatsRow] = []
        self.events = self.runs = self.checkpoints = 0

    def start_run(self, geometry: CacheGeometry) -> None:
        self.index = PrefixIndex(geometry)
        self.counts.clear()
        self.stats.clear()
        self.events = self.checkpoints = 0
        self.runs += 1

    def apply(self, payload: memoryview) -> Violation | None:
        index = self.index
        assert index is not None
        try:
            event = ev.decode_event(payload)
        except (msgspec.DecodeError, msgspec.ValidationError) as error:
            return Violation(index.seq + 1, "decode", bytes(payload[:64]).hex(), str(error))
        text = repr(event)
        if event.seq != index.seq + 1:
            return Violation(event.seq, "sequence", text, f"expected seq {index.seq + 1}")
        try:
            index.apply(event)
        except EventRejected as error:
            kind = "checkpoint" if isinstance(event, ev.Checkpoint) else "rejected"
            return Violation(event.seq, kind, text, str(error))
        self.events += 1
        self.counts[type(event).__name__] += 1
        self.checkpoints += isinstance(event, ev.Checkpoint)
        if self.events % self.check_every == 0:
            try:
                self.check(index)
            except IntegrityError as error:
                return Violation(event.seq, "invariant", text, str(error))
        if self.stats_every and self.events % self.stats_every == 0:
            self.stats.append(_stats_row(index))
        return None


def _stats_row(index: PrefixIndex) -> StatsRow:
    state = index_state(index)
    return StatsRow(
        state.seq,
        state.nodes,
        state.snapshots,
        state.superseded,
        state.lanes,
        state.device_pages_used,
        state.host_slabs_used,
    )


def replay_journal(
    path: str | os.PathLike[str],
    until: int | None = None,
    check: Callable[[PrefixIndex], None] = check_integrity,
    check_every: int = 1,
    stats_every: int = 0,
) -> ReplayResult:
    """Fold every segment of the journal at ``path`` (see the module docstring). Reads files only.

    Raises ReplayError when nothing can be replayed, JournalError for a file that is not a journal."""
    segments = journal_segments(path)
    if not segments:
        raise ReplayError(f"no journal at {path}")
    fold = _Fold(check, check_every, stats_every)
    damage: list[Damage] = []
    violation: Violation | None = None
    reached = False
    for position, segment in enumerate(segments):
        reader = JournalReader(segment)
        _begin_segment(fold, reader, segment)
        for payload in reader.payloads():
            violation = fold.apply(payload)
            if violation is not None:
                break
            if until is not None and fold.index is not None and fold.index.seq >= until:
                reached = True
                break
        if reader.damage is not None and violation is None and not reached:
            newest = position == len(segments) - 1
            damage.append(Damage(str(segment), reader.damage.offset, reader.damage.reason, newest))
        if violation is not None or reached:
            break
    assert fold.index is not None
    if stats_every and (not fold.stats or fold.stats[-1].seq != fold.index.seq):
        fold.stats.append(_stats_row(fold.index))
    return ReplayResult(
        segments=[str(s) for s in segments],
        events=fold.events,
        runs=fold.runs,
        checkpoints=fold.checkpoints,
        event_counts=dict(sorted(fold.counts.items())),
        damage=damage,
        violation=violation,
        stopped_at_until=reached,
        state=index_state(fold.index),
        stats=list(fold.stats),
    )


def _begin_segment(fold: _Fold, reader: JournalReader, segment: Path) -> None:
    first = reader.header.first_seq
    if fold.index is None or (first == 1 and fold.index.seq > 0):
        if first != 1:
            raise ReplayError(f"{segment}: the journal starts at seq {first}; older segments are missing")
        fold.start_run(geometry_from_header(reader))


__all__ = ["JournalError", "ReplayError", "ReplayResult", "replay_journal"]
