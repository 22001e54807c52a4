"""The loop-stall probe sees a blocking call on the event loop, and an idle loop reads as unstalled."""

from __future__ import annotations

import asyncio
import time

from hybridcache.core.loop_stall import LoopStallMonitor


async def test_a_blocking_call_on_the_loop_is_measured_as_a_stall():
    monitor = LoopStallMonitor(interval_s=0.01)
    monitor.start()
    await asyncio.sleep(0.05)
    started = time.thread_time()
    while time.thread_time() - started < 0.3:  # what a worker doing heavy bookkeeping on the loop would do
        pass
    await asyncio.sleep(0.05)
    await monitor.stop()
    await monitor.stop()  # idempotent
    stats = monitor.stats()
    assert stats["worker_stall_max_seconds"] >= 0.25
    assert stats["worker_stalls_over_100ms"] >= 1
    assert stats["worker_stall_max_cpu_seconds"] >= 0.25  # it ran: blocking code, not a wait
    assert stats["worker_stall_max_process_cpu_seconds"] >= stats["worker_stall_max_cpu_seconds"]


async def test_a_loop_that_waits_stalls_without_cpu():
    monitor = LoopStallMonitor(interval_s=0.01)
    monitor.start()
    await asyncio.sleep(0.05)
    time.sleep(0.3)  # asleep on the loop thread: as descheduled, or waiting for the GIL
    await asyncio.sleep(0.05)
    await monitor.stop()
    assert monitor.longest_s >= 0.25 and monitor.longest_cpu_s < 0.1
    assert monitor.longest_process_cpu_s < 0.1  # nothing else ran either: as if not scheduled


def test_short_lateness_is_recorded_but_not_counted_as_long():
    monitor = LoopStallMonitor()
    for late in (0.001, 0.02, 0.05):
        monitor.record(late, cpu_s=late / 2, process_cpu_s=late)
    assert monitor.stats() == {"worker_stall_max_seconds": 0.05, "worker_stall_max_cpu_seconds": 0.025,
                               "worker_stall_max_process_cpu_seconds": 0.05, "worker_stalls_over_100ms": 0}
