"""One OpenMP team per process on a CPU: helper threads run their tensor work serially, and the engine loads
its model on the compute thread that runs it (gpu/openmp_threads.py says why)."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import torch

import hybridcache.core.engine as engine_module
from hybridcache.gpu.backend import CpuStream
from hybridcache.gpu.openmp_threads import serial_torch_in_this_thread
from tests.core.engine_kit import start_engine

pytestmark = pytest.mark.skipif(not torch.backends.openmp.is_available(), reason="torch built without OpenMP")


def test_a_helper_thread_goes_serial_and_leaves_the_others_their_count():
    before = torch.get_num_threads()
    seen: dict[str, object] = {}

    def helper() -> None:
        seen["took"] = serial_torch_in_this_thread()
        seen["threads"] = torch.get_num_threads()
        seen["sum"] = torch.arange(1 << 20, dtype=torch.float64).sum().item()  # runs, on this thread alone

    thread = threading.Thread(target=helper)
    thread.start()
    thread.join()
    assert seen == {"took": True, "threads": 1, "sum": float((1 << 20) * ((1 << 20) - 1) // 2)}
    assert torch.get_num_threads() == before


def test_a_cpu_streams_copies_run_on_its_thread_alone():
    stream = CpuStream("omp-test")
    counts: list[int] = []
    stream.enqueue(lambda: counts.append(torch.get_num_threads()))
    stream.record_event().wait_blocking()
    stream.close()
    assert counts == [1]


async def test_on_a_cpu_the_engine_loads_its_model_on_its_compute_thread(micro_checkpoint: Path, monkeypatch):
    loaded_on: list[str] = []
    real = engine_module.ModelRuntime

    def recording(*args, **kwargs):
        loaded_on.append(threading.current_thread().name)
        return real(*args, **kwargs)

    monkeypatch.setattr(engine_module, "ModelRuntime", recording)
    engine = await start_engine(micro_checkpoint)
    try:
        assert len(loaded_on) == 1 and loaded_on[0].startswith("hybridcache-compute")
    finally:
        await engine.stop()
