"""The bridge from the cache facade's event stream to the on-disk journal (`--event-log`)."""

from __future__ import annotations

import msgspec

from hybridcache import __version__
from hybridcache.cache.events import CacheEvent, encode_event
from hybridcache.cache.geometry import CacheGeometry
from hybridcache.persistence.journal import JournalWriter

CHECKPOINT_EVERY_EVENTS = 4096


class JournalSink:
    """Looks like the facade's `journal` list: `append(event)` queues the (frozen) event for the writer.

    The worker's share is one list append under a lock; encoding, framing (CRC32) and the disk write
    happen in batches on the writer's thread.
    """

    def __init__(self, writer: JournalWriter) -> None:
        self.writer = writer
        self.events = 0

    def append(self, event: CacheEvent) -> None:
        self.writer.append_record(event.seq, event)
        self.events += 1


def open_journal(
    path: str,
    model_dir: str,
    geometry: CacheGeometry,
    options: dict[str, object],
) -> JournalSink:
    """Make the journal at `path` with a header that lets `hybridcache replay` rebuild the index:
    `options["geometry"]` is the CacheGeometry as a dict. The journal holds its events (touching no file)
    until `writer.release()`, which the engine calls when it starts serving."""
    header_options = {**options, "geometry": msgspec.to_builtins(geometry)}
    fingerprint = {"model_dir": model_dir, "version": __version__}
    writer = JournalWriter(
        path, fingerprint=fingerprint, options=header_options, encode=encode_event, hold=True
    )
    return JournalSink(writer)
