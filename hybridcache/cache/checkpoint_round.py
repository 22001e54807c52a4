"""Rolling checkpoints: the index digest taken one slice per worker unit instead of all at once.

A full digest of a large index takes hundreds of milliseconds (about 0.5 s at 18,600 nodes, 4,600
snapshots and 40,000 pages), far too long to hold the worker. A round splits it into ``parts`` slices
(``cache/digest.py``), sized so that one slice costs about as much as ``RECORDS_PER_PART`` records,
and the worker digests the next slice after each unit. Every slice is a Checkpoint event of its own
(seq, digest, part, parts), which replay checks against its own fold at that seq, so a round proves
every record once. Pure bookkeeping: no clock, no I/O.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from hybridcache.cache.index import PrefixIndex

RECORDS_PER_PART = 500  # one part: about 2 ms on the 2-core development machine (tools/bench_checkpoint.py)
LIST_ITEMS_PER_RECORD = 16  # page owners, free pages and free slabs are single ints: cheap per item
MAX_PARTS = 4096


def checkpoint_parts(index: PrefixIndex) -> int:
    """How many slices a round of ``index`` takes: one per RECORDS_PER_PART weighted records. Pure."""
    host_slabs = 0 if index.host is None else index.host.num_slabs
    list_items = 2 * index.pages.num_pages + host_slabs
    records = len(index.nodes) + 2 * len(index.snapshots) + list_items // LIST_ITEMS_PER_RECORD
    return max(1, min(MAX_PARTS, -(-records // RECORDS_PER_PART)))


class CheckpointRound:
    """The slices still to digest in the current round. Mutates only itself."""

    def __init__(self) -> None:
        self.parts = 0
        self.next_part = 0

    @property
    def active(self) -> bool:
        return self.next_part < self.parts

    def begin(self, parts: int) -> None:
        """Start a round of ``parts`` slices. Raises ValueError for parts < 1 or a round in progress."""
        if parts < 1:
            raise ValueError(f"a round needs at least one part, got {parts}")
        if self.active:
            raise ValueError("a checkpoint round is already in progress")
        self.parts = parts
        self.next_part = 0

    def take(self) -> tuple[int, int]:
        """The next (part, parts) to digest. Raises ValueError when no round is active."""
        if not self.active:
            raise ValueError("no checkpoint round in progress")
        part = self.next_part
        self.next_part += 1
        return part, self.parts
