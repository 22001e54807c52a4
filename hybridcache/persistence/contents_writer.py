"""ContentsWriter: makes host-tier entries durable in batches, on its own thread (never the worker's).

The worker queues items (`append`): records to write as they are, and `PendingStore`s, entries whose
slab bytes have just landed in the mapped slab file. For each batch the thread

1. computes each pending store's xxh3_64 over its slabs, then drops the store if one of its slabs was
   handed to another entry meanwhile (the generation the worker bumped when it reused the slab differs:
   the bytes hashed may be the new owner's, and a removal record is already queued behind it);
2. fdatasyncs the slab file (the bytes named by the batch reach the disk);
3. appends the batch's frames to the contents file with one write and fdatasyncs it.

After step 3 the batch is durable: `durable_seq` is then the cache-event sequence number up to which
every landed host write is on disk. One fsync pair per batch; a batch gathers for `flush_interval_s`.

Compaction: when the tail passes `max(compact_min_tail, compact_tail_ratio x live entries)` records
(4096 and 2 by default), the thread rewrites the file as a base table of its fold plus nothing
(`write_contents_file`: temporary file, fsync, rename). So the file never holds more than
`entries + max(4096, 2 x entries)` records plus one batch, about 3 x entries + 4096 records, and a restart
folds at most that many; the rewrite itself costs one pass over the live entries (amortised: at most
one record rewritten per two appended).

A write error is logged once, counted, and stops the writer (later items are dropped: the file stays a
prefix of the truth, and the restart verifies what it names).
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import NamedTuple

import msgspec
import xxhash

from hybridcache.logs import get_logger
from hybridcache.persistence.contents_file import (
    encode_records,
    open_for_append,
    write_contents_file,
)
from hybridcache.persistence.contents_fold import ContentsFold
from hybridcache.persistence.contents_records import (
    BlockStored,
    ContentsHeader,
    ContentsRecord,
    ImageStored,
    TailStored,
)

log = get_logger(__name__)

DEFAULT_COMPACT_MIN_TAIL = 4096


class PendingStore(NamedTuple):
    """An entry whose bytes landed: ``record`` (checksum 0 until hashed), its slabs, and each slab's
    generation when the entry took it."""

    record: BlockStored | ImageStored | TailStored
    slabs: tuple[int, ...]
    generations: tuple[int, ...]


SlabReader = Callable[[int], object]  # slab id -> a buffer over its bytes (the mapped file)


class ContentsWriter:
    """See the module docstring. Thread-safe `append`/`flush`/`close`; counters are read without a lock."""

    def __init__(
        self,
        path: str | os.PathLike[str],
        header: ContentsHeader,
        fold: ContentsFold,
        read_slab: SlabReader,
        slab_generation: Callable[[int], int],
        sync_slabs: Callable[[], None],
        flush_interval_s: float = 0.05,
        compact_min_tail: int = DEFAULT_COMPACT_MIN_TAIL,
        clean_seq: Callable[[], int] = lambda: 0,
        compaction_pause_s: float = 0.0,
        compact_tail_ratio: float = 2.0,
    ) -> None:
        self.path = Path(path)
        self.header = header
        self.fold = fold
        self._read_slab = read_slab
        self._slab_generation = slab_generation
        self._sync_slabs = sync_slabs
        self._flush_interval_s = flush_interval_s
        self._compact_min_tail = compact_min_tail
        self._compact_tail_ratio = compact_tail_ratio
        self._clean_seq = clean_seq
        self._compaction_pause_s = compaction_pause_s  # > 0 only in crash trials: a wider window to kill in
        self._fd = open_for_append(self.path)
        self._pending: list[ContentsRecord | PendingStore] = []
        self._lock = threading.Condition(threading.Lock())
        self._appended = 0
        self._done = 0
        self._closing = False
        self._flush_wanted = False
        self.error: BaseException | None = None
        self.durable_seq = 0
        self.batches = 0
        self.records_written = 0
        self.stores_skipped = 0  # slab reused before it was hashed (a removal follows)
        self.tail_records = 0
        self.compactions = 0
        self.sync_seconds = 0.0  # fdatasync time, slabs and contents, summed
        self.sync_seconds_max = 0.0  # the longest batch's fdatasync pair
        self.bytes_appended = 0  # contents bytes appended by batches (compactions not counted)
        self.contents_bytes = os.fstat(self._fd).st_size  # the file's size now
        self.hash_seconds = 0.0
        self.compaction_seconds = 0.0
        self._thread = threading.Thread(target=self._run, name="hybridcache-contents", daemon=True)
        self._thread.start()

    def append(self, items: Iterable[ContentsRecord | PendingStore]) -> None:
        """Queue items (cheap: a list extend under a lock)."""
        with self._lock:
            before = len(self._pending)
            self._pending.extend(items)
            added = len(self._pending) - before
            self._appended += added
            if before == 0 and added:
                self._lock.notify_all()

    @property
    def queued(self) -> int:
        return self._appended - self._done

    def flush(self, timeout_s: float | None = None) -> bool:
        """Wait until everything appended so far is durable (or failed). True when it is."""
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        with self._lock:
            target = self._appended
            self._flush_wanted = True
            self._lock.notify_all()
            while self._done < target and self.error is None and self._thread.is_alive():
                if deadline is not None and time.monotonic() >= deadline:
                    return False
                self._lock.wait(0.05)
        return self.error is None

    def close(self) -> None:
        """Write what is queued, stop the thread, close the file. Idempotent; never raises (an error is
        in ``error`` and was logged)."""
        with self._lock:
            self._closing = True
            self._lock.notify_all()
        self._thread.join()
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1

    def _run(self) -> None:
        while True:
            with self._lock:
                while not self._pending and not self._closing and not self._flush_wanted:
                    self._lock.wait()
                if not self._closing and not self._flush_wanted:
                    self._lock.wait(self._flush_interval_s)
                clean = self._clean_seq()  # read before the swap: its events' items are in this batch
                batch, self._pending = self._pending, []
                self._flush_wanted = False
                closing = self._closing
            if batch and self.error is None:
                try:
                    self._write_batch(batch, clean)
                except Exception as error:
                    # Logged before it is published: whoever sees ``error`` set can find the log line.
                    log.error("cache directory %s: write failed: %s; later host writes are not made "
                              "durable (the cache keeps serving)", self.path.parent, error)
                    self.error = error
            elif not batch and self.error is None:
                self.durable_seq = max(self.durable_seq, clean)
            with self._lock:
                self._done += len(batch)
                self._lock.notify_all()
                if closing and not self._pending:
                    return

    def _write_batch(self, batch: list[ContentsRecord | PendingStore], clean: int) -> None:
        started = time.perf_counter()
        records: list[ContentsRecord] = []
        stores = 0
        for item in batch:
            if isinstance(item, PendingStore):
                record = self._hashed(item)
                if record is None:
                    self.stores_skipped += 1
                    continue
                records.append(record)
                stores += 1
            else:
                records.append(item)
        hashed = time.perf_counter()
        self.hash_seconds += hashed - started
        if stores:
            self._sync_slabs()
        if records:
            data = encode_records(records)
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view) :]
            self.bytes_appended += len(data)
            self.contents_bytes += len(data)
            os.fdatasync(self._fd)
            for record in records:
                self.fold.apply(record)
        synced = time.perf_counter() - hashed
        self.sync_seconds += synced
        self.sync_seconds_max = max(self.sync_seconds_max, synced)
        self.records_written += len(records)
        self.tail_records += len(records)
        self.batches += 1
        self.durable_seq = max(self.durable_seq, clean)
        if self.tail_records > max(self._compact_min_tail, self._compact_tail_ratio * self.fold.entries):
            self.compact()

    def _hashed(self, item: PendingStore) -> ContentsRecord | None:
        digest = xxhash.xxh3_64()
        for slab in item.slabs:
            digest.update(self._read_slab(slab))  # type: ignore[arg-type]
        for slab, generation in zip(item.slabs, item.generations, strict=True):
            if self._slab_generation(slab) != generation:
                return None
        return msgspec.structs.replace(item.record, checksum=digest.intdigest())

    def compact(self) -> None:
        """Rewrite the file as a base table of the fold (on this thread, or before it starts)."""
        started = time.perf_counter()
        pause = self._compaction_pause_s
        write_contents_file(
            self.path, self.header, self.fold.base_records(), (lambda: time.sleep(pause)) if pause else None
        )
        old, self._fd = self._fd, open_for_append(self.path)
        os.close(old)
        self.contents_bytes = os.fstat(self._fd).st_size
        self.tail_records = 0
        self.compactions += 1
        self.compaction_seconds += time.perf_counter() - started
