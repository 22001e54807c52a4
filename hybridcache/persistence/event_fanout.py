"""One event stream, several sinks (the event journal, the cache directory, the KV-event publisher): the
facade appends each applied event to every subscriber, in order, on the worker."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from hybridcache.cache.events import CacheEvent


class EventSink(Protocol):
    def append(self, event: CacheEvent) -> None: ...


class EventFanOut:
    """Looks like the facade's `journal`; `append` hands the event to each sink in order."""

    def __init__(self, sinks: Sequence[EventSink]) -> None:
        self.sinks = tuple(sinks)

    def append(self, event: CacheEvent) -> None:
        for sink in self.sinks:
            sink.append(event)


def fan_out(*sinks: EventSink | None) -> EventSink | None:
    """The sink the facade gets: None without one, the sink itself alone (no extra call per event),
    else an `EventFanOut`. Pure."""
    present = [sink for sink in sinks if sink is not None]
    if not present:
        return None
    return present[0] if len(present) == 1 else EventFanOut(present)
