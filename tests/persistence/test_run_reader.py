"""Slab runs are read straight into their host slabs, coalesced into few reads, and verified per run."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hybridcache.cache.ids import SlabId
from hybridcache.cache.slab_pool import HostSlabPool
from hybridcache.gpu.host_tier import HostSlabMemory
from hybridcache.persistence.cache_file import CacheFileError
from hybridcache.persistence.run_reader import RunReader, RunRequest, assign_slabs

SLAB = 4096
CHUNK_SLABS = 8
DATA_START = 2 * SLAB  # the data region starts after a (here blank) prelude


def host_memory(num_slabs: int = 64) -> HostSlabMemory:
    return HostSlabMemory(HostSlabPool(SLAB, num_slabs * SLAB, CHUNK_SLABS * SLAB))


def write_data_file(path: Path, run_slabs: list[int], seed: int = 0) -> list[bytes]:
    """A file whose data region holds one run of random bytes per entry of ``run_slabs``."""
    rng = random.Random(seed)
    runs = [rng.randbytes(count * SLAB) for count in run_slabs]
    path.write_bytes(bytes(DATA_START) + b"".join(runs))
    return runs


def requests_for(runs: list[bytes], slabs: list[SlabId]) -> list[RunRequest]:
    layout, offset = [], 0
    for run in runs:
        layout.append((offset, len(run) // SLAB, xxhash.xxh3_64_intdigest(run)))
        offset += len(run)
    return assign_slabs(layout, slabs)


def read_runs(path: Path, memory: HostSlabMemory, requests, **options) -> tuple[list[bool], RunReader]:
    with open(path, "rb", buffering=0) as stream:
        reader = RunReader(stream.fileno(), DATA_START, memory, **options)
        return reader.read(requests), reader


def slab_bytes(memory: HostSlabMemory, slabs) -> bytes:
    return b"".join(memory.slab_view(slab).numpy().tobytes() for slab in slabs)


def assert_runs_landed(memory: HostSlabMemory, requests, runs: list[bytes]) -> None:
    for request, run in zip(requests, runs, strict=True):
        assert slab_bytes(memory, request.slabs) == run


def test_assign_slabs_hands_out_the_free_slabs_in_order():
    free = [SlabId(s) for s in (5, 6, 9, 2, 3)]
    requests = assign_slabs([(0, 2, 11), (8192, 1, 12), (12288, 2, 13)], free)
    assert [r.slabs for r in requests] == [(5, 6), (9,), (2, 3)]
    assert [(r.offset, r.checksum) for r in requests] == [(0, 11), (8192, 12), (12288, 13)]


def test_assign_slabs_refuses_runs_that_do_not_fit():
    with pytest.raises(ValueError, match="3 slabs needed, 2 free"):
        assign_slabs([(0, 3, 0)], [SlabId(0), SlabId(1)])


def test_back_to_back_runs_into_consecutive_slabs_are_one_read_per_segment(tmp_path: Path):
    runs = write_data_file(tmp_path / "data.bin", [1, 1, 3, 1, 3, 1])  # 10 slabs, chunks of 8
    memory = host_memory()
    requests = requests_for(runs, [SlabId(s) for s in range(10)])
    verified, reader = read_runs(tmp_path / "data.bin", memory, requests, segment_bytes=4 * SLAB)

    assert verified == [True] * len(runs)
    assert_runs_landed(memory, requests, runs)
    # slabs 0-7 (chunk 0) in reads of at most 4 slabs that never split a run needlessly, then 8-9
    assert reader.reads == 4 and reader.bytes_read == 10 * SLAB


def test_a_run_split_across_chunks_verifies_as_one_run(tmp_path: Path):
    runs = write_data_file(tmp_path / "data.bin", [6, 5])  # the second run crosses chunk 0 -> 1
    memory = host_memory()
    requests = requests_for(runs, [SlabId(s) for s in range(11)])
    verified, _ = read_runs(tmp_path / "data.bin", memory, requests)
    assert verified == [True, True]
    assert_runs_landed(memory, requests, runs)


def test_a_flipped_byte_fails_exactly_its_run_and_the_others_still_land(tmp_path: Path):
    path = tmp_path / "data.bin"
    runs = write_data_file(path, [1, 3, 1, 3])
    memory = host_memory()
    requests = requests_for(runs, [SlabId(s) for s in range(8)])
    data = bytearray(path.read_bytes())
    data[DATA_START + SLAB + 2 * SLAB + 17] ^= 0xFF  # the third slab of the second run
    path.write_bytes(bytes(data))

    verified, _ = read_runs(path, memory, requests, segment_bytes=2 * SLAB)
    assert verified == [True, False, True, True]
    assert_runs_landed(memory, [requests[i] for i in (0, 2, 3)], [runs[i] for i in (0, 2, 3)])


@pytest.mark.parametrize("read_ahead", [True, False])
def test_a_file_that_ends_inside_a_run_raises(tmp_path: Path, read_ahead: bool):
    """With the reader thread too: its error reaches the caller, not lost in the thread."""
    path = tmp_path / "data.bin"
    runs = write_data_file(path, [2, 2, 2])
    path.write_bytes(path.read_bytes()[: -3 * SLAB - 100])
    requests = requests_for(runs, [SlabId(s) for s in range(6)])
    with pytest.raises(CacheFileError, match="ended inside a slab run"):
        read_runs(path, host_memory(), requests, read_ahead=read_ahead, segment_bytes=SLAB)


def test_progress_reports_the_bytes_read_after_every_read(tmp_path: Path):
    runs = write_data_file(tmp_path / "data.bin", [3, 3, 3])
    seen: list[int] = []
    requests = requests_for(runs, [SlabId(s) for s in range(9)])
    _, reader = read_runs(tmp_path / "data.bin", host_memory(), requests, progress=seen.append)
    assert seen == sorted(seen) and len(seen) == reader.reads and seen[-1] == 9 * SLAB


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    run_slabs=st.lists(st.integers(1, 5), min_size=1, max_size=10),
    segment_slabs=st.integers(1, 12),
    skipped=st.sets(st.integers(0, 9)),
    shuffle_seed=st.integers(0, 1000),
    damaged=st.sets(st.integers(0, 9)),
    read_ahead=st.booleans(),
)
def test_any_runs_into_any_free_slabs_land_byte_exact_and_verify_per_run(
    tmp_path: Path, run_slabs, segment_slabs, skipped, shuffle_seed, damaged, read_ahead
):
    """Partial plans (some runs skipped), free slabs in any order and any segment size: every chosen
    run lands byte for byte in its slabs, and exactly the damaged ones fail their checksum."""
    path = tmp_path / f"data-{shuffle_seed}-{segment_slabs}.bin"
    runs = write_data_file(path, run_slabs, seed=shuffle_seed)
    offsets = [sum(len(r) for r in runs[:i]) for i in range(len(runs))]
    chosen = [i for i in range(len(runs)) if i not in skipped] or [0]
    data = bytearray(path.read_bytes())
    for i in damaged & set(chosen):
        data[DATA_START + offsets[i] + len(runs[i]) - 1] ^= 0x01
    path.write_bytes(bytes(data))
    free = [SlabId(s) for s in range(64)]
    random.Random(shuffle_seed).shuffle(free)
    layout = [(offsets[i], run_slabs[i], xxhash.xxh3_64_intdigest(runs[i])) for i in chosen]
    requests = assign_slabs(layout, free)
    memory = host_memory()

    verified, reader = read_runs(
        path, memory, requests, segment_bytes=segment_slabs * SLAB, read_ahead=read_ahead
    )

    assert verified == [i not in damaged for i in chosen]
    intact = [(request, runs[i]) for request, i in zip(requests, chosen, strict=True) if i not in damaged]
    assert_runs_landed(memory, [r for r, _ in intact], [run for _, run in intact])
    assert reader.bytes_read == sum(len(runs[i]) for i in chosen)
