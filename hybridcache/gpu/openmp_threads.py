"""Keep helper threads out of torch's OpenMP pool.

torch on a Linux CPU runs its parallel regions on libgomp. libgomp gives each thread that starts a parallel
region a team of workers of its own, and counts them all: once a process holds more of them than it has
CPUs, every team stops spinning between regions and sleeps at once (libgomp's throttled spin count), so
each of the hundreds of parallel regions of a decode step pays a sleep and a wake-up. Measured on `small`
with 2 threads: about 300 voluntary context switches per decode step with a second team alive, none with
one.

So the model runs on one thread (the engine's compute thread, which also loads it), and helper threads that
touch tensors (the CPU streams' copies) call `serial_torch_in_this_thread()` once: their operations then run
on the thread itself and never start a team.
"""

from __future__ import annotations

import ctypes
from collections.abc import Callable
from pathlib import Path

import torch


def _find_setter() -> Callable[[int], None] | None:
    """libgomp's `omp_set_num_threads` as loaded by torch, or None (another OpenMP runtime, no OpenMP,
    not Linux)."""
    maps = Path("/proc/self/maps")
    if not maps.exists():
        return None
    for line in maps.read_text().splitlines():
        path = line.split()[-1] if len(line.split()) >= 6 else ""
        if Path(path).name.startswith("libgomp"):
            try:
                setter = ctypes.CDLL(path).omp_set_num_threads
            except (OSError, AttributeError):
                return None
            setter.argtypes = [ctypes.c_int]
            setter.restype = None
            return setter
    return None


_SET_NUM_THREADS = _find_setter()


def serial_torch_in_this_thread() -> bool:
    """Make torch's operations on the calling thread run on it alone (OpenMP's thread count of this thread
    only; other threads keep theirs). Returns whether it took effect."""
    # torch sets each thread's OpenMP count on its first parallel query; let that happen first, or it
    # would undo the setting below.
    torch.get_num_threads()
    if _SET_NUM_THREADS is None:
        return False
    _SET_NUM_THREADS(1)
    return torch.get_num_threads() == 1
