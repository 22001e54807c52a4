"""The CPU backend: in-order streams, events awaited without polling, cross-stream waits, failures."""

import asyncio
import threading

import pytest
import torch

from hybridcache.gpu.backend import CpuBackend, CpuStream, DeviceError, copy_2d_now


@pytest.fixture
def stream():
    created = CpuStream("test")
    yield created
    created.close()


def test_copy_2d_moves_strided_rows():
    src = torch.arange(32, dtype=torch.uint8)
    dst = torch.zeros(40, dtype=torch.uint8)
    copy_2d_now(dst, 2, 10, src, 0, 8, 4, 3)  # rows of 4 bytes: src pitch 8, dst pitch 10
    assert dst[2:6].tolist() == [0, 1, 2, 3]
    assert dst[12:16].tolist() == [8, 9, 10, 11]
    assert dst[22:26].tolist() == [16, 17, 18, 19]
    assert int(dst.sum()) == sum(range(4)) + sum(range(8, 12)) + sum(range(16, 20))


def test_work_runs_in_order_and_the_event_marks_it(stream: CpuStream):
    seen: list[int] = []
    gate = threading.Event()
    stream.enqueue(gate.wait)
    for i in range(5):
        stream.enqueue(lambda i=i: seen.append(i))
    event = stream.record_event()
    assert not event.is_done()
    gate.set()
    event.wait_blocking()
    assert seen == [0, 1, 2, 3, 4]


async def test_the_loop_awaits_an_event_while_staying_responsive(stream: CpuStream):
    gate = threading.Event()
    stream.enqueue(gate.wait)
    event = stream.record_event()
    waiter = asyncio.ensure_future(event.wait())
    await asyncio.sleep(0.01)
    assert not waiter.done()  # the loop still runs other work
    gate.set()
    await asyncio.wait_for(waiter, timeout=5)
    assert event.is_done()


def test_a_stream_waits_for_another_streams_event():
    backend = CpuBackend()
    try:
        order: list[str] = []
        gate = threading.Event()
        backend.restore_stream.enqueue(gate.wait)
        backend.restore_stream.enqueue(lambda: order.append("restore"))
        restored = backend.restore_stream.record_event()
        backend.transfer_stream.wait_event(restored)
        backend.transfer_stream.enqueue(lambda: order.append("transfer"))
        done = backend.transfer_stream.record_event()
        gate.set()
        done.wait_blocking()
        assert order == ["restore", "transfer"]
    finally:
        backend.close()


async def test_a_failed_job_fails_every_later_event(stream: CpuStream):
    ran_after: list[bool] = []

    def broken() -> None:
        raise OSError("injected transfer fault")

    stream.enqueue(broken)
    stream.enqueue(lambda: ran_after.append(True))
    event = stream.record_event()
    with pytest.raises(DeviceError, match="injected transfer fault"):
        await event.wait()
    with pytest.raises(DeviceError):
        stream.record_event().wait_blocking()
    assert ran_after == []
