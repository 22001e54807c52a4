"""This machine's memory read bandwidth, measured from torch with a given thread count.

A buffer of `BUFFER_BYTES` (larger than any cache level of these machines, on 2 MiB pages where the system
allows, as the packed weights are: `huge_pages`) is summed over and over. Two readings:

- `best(repeats)`: the fastest single pass, the machine's peak at its quietest instant;
- `sustained(seconds)`: all bytes read over a window of `seconds` divided by its length, what a workload of
  that length gets from the memory system at that time.

A decode run of 64 tokens lasts seconds, and on a shared machine the bandwidth other tenants leave varies
by several times from one minute to the next. A 50 ms peak pass catches a quiet instant that no run of
seconds can; comparing a decode run with the sustained bandwidth of a window of the same length taken right
after it compares like with like.
"""

from __future__ import annotations

import time

import torch

from hybridcache.gpu.huge_pages import collapse

BUFFER_BYTES = 1 << 30
"""Large enough to defeat every cache level of these machines (the largest L3 seen here is 300 MiB)."""


class BandwidthProbe:
    """Holds the probe buffer (allocated once) and reads it with `threads` torch threads; the previous
    thread count is restored after each reading."""

    def __init__(self, threads: int) -> None:
        self._threads = threads
        self._buffer = torch.ones(BUFFER_BYTES // 4, dtype=torch.float32)
        collapse(self._buffer.data_ptr(), BUFFER_BYTES)

    def best(self, repeats: int = 7) -> float:
        """Bytes/s of the fastest of `repeats` passes."""
        return BUFFER_BYTES / min(self._timed_passes(repeats=repeats))

    def sustained(self, seconds: float) -> float:
        """Bytes/s over consecutive passes for at least `seconds` (and at least one pass)."""
        passes = self._timed_passes(seconds=seconds)
        return BUFFER_BYTES * len(passes) / sum(passes)

    def _timed_passes(self, repeats: int = 0, seconds: float = 0.0) -> list[float]:
        previous = torch.get_num_threads()
        torch.set_num_threads(self._threads)
        try:
            durations: list[float] = []
            while len(durations) < max(repeats, 1) or sum(durations) < seconds:
                started = time.perf_counter()
                self._buffer.sum()
                durations.append(time.perf_counter() - started)
            return durations
        finally:
            torch.set_num_threads(previous)
