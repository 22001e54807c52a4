"""How long the event loop was blocked: the worker's bookkeeping, every HTTP handler and the streams all run
on it, so a blocked loop is a stalled worker (and a stalled stream for every client).

A probe task sleeps `interval_s` again and again and records by how much each wake-up came late; a
wake-up can only be late by the time something else held the loop (or the process was not scheduled).
The probe costs one timer per interval (tens of microseconds), so it always runs.

Beside each stall it reads the loop thread's CPU time over the same span: a stall the thread spent
running (code blocking the loop) has CPU seconds close to its length; one it spent waiting has few, and
the whole process's CPU time over the span says for what: the GIL (the compute thread ran meanwhile)
or a CPU (on a loaded machine, the process as a whole was not scheduled).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

PROBE_INTERVAL_S = 0.02
LONG_STALL_S = 0.1  # a stall a streaming client notices (a visible pause between tokens)


class LoopStallMonitor:
    """The longest stall since start and the count of long ones. Mutated only by its own task."""

    def __init__(self, interval_s: float = PROBE_INTERVAL_S) -> None:
        self.interval_s = interval_s
        self.longest_s = 0.0
        self.longest_cpu_s = 0.0  # the loop thread's CPU time during the longest stall
        self.longest_process_cpu_s = 0.0  # every thread's, over the same span
        self.long_stalls = 0
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        """Start the probe on the running loop. Idempotent."""
        if self._task is None:
            self._task = asyncio.create_task(self._probe(), name="hybridcache-loop-stall-probe")

    async def stop(self) -> None:
        """Cancel the probe and wait for it. Idempotent."""
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def stats(self) -> dict[str, object]:
        return {
            "worker_stall_max_seconds": round(self.longest_s, 6),
            "worker_stall_max_cpu_seconds": round(self.longest_cpu_s, 6),
            "worker_stall_max_process_cpu_seconds": round(self.longest_process_cpu_s, 6),
            "worker_stalls_over_100ms": self.long_stalls,
        }

    async def _probe(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            asleep_at, cpu_at, process_at = loop.time(), time.thread_time(), time.process_time()
            await asyncio.sleep(self.interval_s)
            self.record(loop.time() - asleep_at - self.interval_s, time.thread_time() - cpu_at,
                        time.process_time() - process_at)

    def record(self, late_s: float, cpu_s: float = 0.0, process_cpu_s: float = 0.0) -> None:
        """Count one wake-up that came `late_s` seconds late, the loop thread having run `cpu_s` seconds
        and the process `process_cpu_s` since the probe slept. Mutates self."""
        if late_s > self.longest_s:
            self.longest_s, self.longest_cpu_s, self.longest_process_cpu_s = late_s, cpu_s, process_cpu_s
        if late_s > LONG_STALL_S:
            self.long_stalls += 1
