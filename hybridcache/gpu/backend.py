"""Device streams and events, as the asyncio worker drives them (ARCHITECTURE "Backend").

A `Stream` runs its work in order; `record_event()` marks everything enqueued so far; `wait_event(e)`
makes later work on the stream wait for `e`; `copy_2d(...)` enqueues a strided copy (the shape of
`cudaMemcpy2DAsync`). The worker awaits `DeviceEvent.wait()` without blocking its loop and without
polling; the compute thread blocks on `wait_blocking()` (the per-layer restore wait).

`CpuBackend` makes these real on a CPU: each stream is a thread with a FIFO of jobs, so restore/compute
overlap and event ordering are the same code paths as on a GPU. A job that raises fails its stream: the
error reaches every event recorded after it (`DeviceError`), which the engine treats as fatal.
"""

from __future__ import annotations

import asyncio
import queue
import threading
from collections.abc import Callable
from typing import Protocol

import torch

from hybridcache.gpu.openmp_threads import serial_torch_in_this_thread


class DeviceError(RuntimeError):
    """A transfer or kernel failed on a stream; engine-wide (spec §6.5 Failure)."""


class DeviceEvent(Protocol):
    def is_done(self) -> bool: ...

    def wait_blocking(self) -> None:
        """Block the calling thread until the event completes; raises DeviceError if its work failed."""

    async def wait(self) -> None:
        """Await completion from the event loop; raises DeviceError if its work failed."""


class Stream(Protocol):
    name: str

    def enqueue(self, job: Callable[[], None]) -> None: ...

    def copy_2d(
        self,
        dst: torch.Tensor,
        dst_offset: int,
        dst_pitch: int,
        src: torch.Tensor,
        src_offset: int,
        src_pitch: int,
        width: int,
        rows: int,
    ) -> None: ...

    def record_event(self) -> DeviceEvent: ...

    def wait_event(self, event: DeviceEvent) -> None: ...


def copy_2d_now(
    dst: torch.Tensor,
    dst_offset: int,
    dst_pitch: int,
    src: torch.Tensor,
    src_offset: int,
    src_pitch: int,
    width: int,
    rows: int,
) -> None:
    """Copy `rows` rows of `width` bytes between flat uint8 tensors, each side with its own pitch."""
    if rows == 0 or width == 0:
        return
    target = dst.as_strided((rows, width), (dst_pitch, 1), dst.storage_offset() + dst_offset)
    source = src.as_strided((rows, width), (src_pitch, 1), src.storage_offset() + src_offset)
    target.copy_(source)


class CpuEvent:
    """A thread-safe completion; loops awaiting it are woken with `call_soon_threadsafe`."""

    def __init__(self) -> None:
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._error: BaseException | None = None
        self._waiters: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    def complete(self, error: BaseException | None = None) -> None:
        with self._lock:
            self._error = error
            self._done.set()
            waiters, self._waiters = self._waiters, []
        for loop, future in waiters:
            loop.call_soon_threadsafe(_settle, future)

    def is_done(self) -> bool:
        return self._done.is_set()

    def wait_blocking(self) -> None:
        self._done.wait()
        self._raise_if_failed()

    async def wait(self) -> None:
        loop = asyncio.get_running_loop()
        with self._lock:
            if not self._done.is_set():
                future: asyncio.Future[None] = loop.create_future()
                self._waiters.append((loop, future))
            else:
                future = None
        if future is not None:
            await future
        self._raise_if_failed()

    def _raise_if_failed(self) -> None:
        if self._error is not None:
            raise DeviceError(f"device work failed: {self._error}") from self._error


def _settle(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class CpuStream:
    """An in-order queue of jobs run by one thread. After a failure every later job is skipped."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._jobs: queue.SimpleQueue[tuple[Callable[[], None], bool] | None] = queue.SimpleQueue()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name=f"hybridcache-{name}", daemon=True)
        self._thread.start()

    def enqueue(self, job: Callable[[], None]) -> None:
        self._jobs.put((job, False))

    def copy_2d(
        self,
        dst: torch.Tensor,
        dst_offset: int,
        dst_pitch: int,
        src: torch.Tensor,
        src_offset: int,
        src_pitch: int,
        width: int,
        rows: int,
    ) -> None:
        self.enqueue(lambda: copy_2d_now(dst, dst_offset, dst_pitch, src, src_offset, src_pitch, width, rows))

    def record_event(self) -> CpuEvent:
        event = CpuEvent()
        # Runs even after a failure, so that waiters learn about it.
        self._jobs.put((lambda: event.complete(self._failure), True))
        return event

    def wait_event(self, event: DeviceEvent) -> None:
        self.enqueue(event.wait_blocking)

    def close(self) -> None:
        """Finish queued work, then stop the thread. Idempotent."""
        if self._thread.is_alive():
            self._jobs.put(None)
            self._thread.join()

    def _run(self) -> None:
        serial_torch_in_this_thread()  # a copy thread must not start an OpenMP team of its own (see there)
        while (item := self._jobs.get()) is not None:
            job, runs_after_failure = item
            if self._failure is not None and not runs_after_failure:
                continue
            try:
                job()
            except BaseException as error:
                self._failure = self._failure or error


class CpuBackend:
    """Streams for compute, restores and write-through on the CPU."""

    name = "cpu"

    def __init__(self) -> None:
        self.restore_stream = CpuStream("restore")
        self.transfer_stream = CpuStream("transfer")

    def close(self) -> None:
        self.restore_stream.close()
        self.transfer_stream.close()
