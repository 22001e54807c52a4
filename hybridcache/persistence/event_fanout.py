"""EventFanout: hands each cache event to several sinks (the event journal, the cache directory, ...).

The facade holds one `journal` object with an `append(event)` method; with more than one subscriber the
engine gives it this instead. Sinks are called in order, on the worker, after the event was applied.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from hybridcache.cache.events import CacheEvent


class EventSink(Protocol):
    def append(self, event: CacheEvent) -> None: ...


class EventFanout:
    def __init__(self, sinks: Sequence[EventSink]) -> None:
        self.sinks = tuple(sinks)

    def append(self, event: CacheEvent) -> None:
        for sink in self.sinks:
            sink.append(event)
