"""Benchmark the prefix-cache file and the event journal against the disk they run on.

Fills a host tier (default 2 GiB) through the cache facade with conversations whose blocks and
snapshot images are written through, saves it with `save_prefix_cache` and loads it into a fresh index
with `load_prefix_cache`, and in the same run writes (with fsync) and reads a plain file of the same
size on the same disk, interleaved in alternating order, best of each. Every read starts cold (the page
cache of both files is dropped with fsync + posix_fadvise(DONTNEED) right before it). A load lands
every byte in host memory that is touched for the first time, so the plain read it is compared with
(`disk_read_gib_per_s`) reads into a freshly allocated buffer of the file's size; the same read through
one reused 8 MiB buffer (the disk alone) and the cost of first-touching that much memory are printed
beside it for context.

Prints name=value lines: save_gib_per_s, load_gib_per_s, disk_write_gib_per_s, disk_read_gib_per_s,
disk_stream_read_gib_per_s, memory_first_touch_gib_per_s, save_vs_disk, load_vs_disk (targets >= 0.7),
load_vs_disk_stream (context), and journal_overhead: decode tok/s of the engine with --event-log over
without (target >= 0.98), the median over alternating pairs of requests journaled on and off on one
engine of the micro model, with the lowest and highest pair, the CPU-time ratio and what the journal's
own work explains (`bench_journal`).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import tempfile
import time
from pathlib import Path

from hybridcache.tools.bench_journal import JOURNAL_PAIRS, measure_journal

DEFAULT_HOST_MIB = 2048
SLAB_BYTES = 256 << 10
IMAGE_BYTES = 4 << 20
# This machine's virtual disk and its page-fault path each land in a fast or a slow mode at random, for every
# writer and reader alike (2 GiB reads in 1.2-1.5 s or 2.5-3.1 s): best of several trials per side.
WRITE_TRIALS = 5
READ_TRIALS = 7
CONTEXT_TRIALS = 3  # the informational stream read and first touch: the first trials only
STREAM_BYTES = 8 << 20


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host-cache-mib", type=int, default=DEFAULT_HOST_MIB, help="host tier to save/load")
    parser.add_argument("--dir", default=None, help="directory for the files (default: a temporary one)")
    parser.add_argument("--journal-tokens", type=int, default=120, help="decode tokens per journal request")
    parser.add_argument(
        "--journal-pairs", type=int, default=JOURNAL_PAIRS, help="alternating on/off pairs (median taken)"
    )
    parser.add_argument("--skip-journal", action="store_true", help="only measure the cache file")


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        folder = Path(scratch)
        results: dict[str, float | int | str] = dict(measure_file(folder, args.host_cache_mib << 20))
        if not args.skip_journal:
            overhead = asyncio.run(measure_journal(folder, args.journal_tokens, args.journal_pairs))
            results["journal_overhead"] = overhead.median
            results["journal_overhead_lowest"] = overhead.lowest
            results["journal_overhead_highest"] = overhead.highest
            results["journal_overhead_cpu"] = overhead.cpu_median
            results["journal_events_per_token"] = overhead.events_per_token
            results["journal_cpu_us_per_event"] = overhead.cpu_us_per_event
            results["journal_cpu_share"] = overhead.cpu_share
            method = f"median of {overhead.pairs} alternating on/off request pairs on one engine"
            results["journal_overhead_method"] = method
    for name, value in results.items():
        print(f"{name}={value:.4g}" if isinstance(value, float) else f"{name}={value}")
    return 0


def bench_geometry(host_bytes: int):
    """The cache geometry of the file benchmark: 256 KiB slabs, 4 MiB images."""
    from hybridcache.cache.geometry import CacheGeometry

    return CacheGeometry(
        num_pages=256,
        page_bytes=SLAB_BYTES,
        image_bytes=IMAGE_BYTES,
        slab_bytes=SLAB_BYTES,
        host_cache_bytes=host_bytes,
        max_concurrency=1,
        device_snapshot_slots=2,
    )


def fill_host_tier(host_bytes: int):
    """A cache whose host tier holds conversations' blocks, images and tails. Returns (cache, memory)."""
    from hybridcache.cache.facade import Cache
    from hybridcache.cache.hashing import block_hashes
    from hybridcache.cache.match import PromptInput, Readiness
    from hybridcache.gpu.host_tier import HostSlabMemory

    geometry = bench_geometry(host_bytes)
    cache = Cache(geometry)
    rng = random.Random(0)
    index = cache.index
    assert index.host is not None
    per_request = 40 + geometry.image_slabs + 2
    while index.host.num_free > per_request:
        tokens = [rng.randrange(1, 50000) for _ in range(64 * 40 + 17)]
        hashes = block_hashes(tokens)
        quote = cache.quote(PromptInput(tokens, hashes, output_tokens=64))
        if quote.readiness != Readiness.READY:
            break
        cache.stage(quote, 0)
        cache.activate(0)
        cache.commit_blocks(0, tokens, hashes)
        result = cache.finish(0, tokens, hashes)
        for plan in (result.taps.write, result.write, cache.flush_to_host()):  # blocks as a stop flushes
            if plan is not None:
                cache.host_write_done(plan.batch)
    memory = HostSlabMemory(cache.index.host)
    for chunk in range(cache.index.host.num_chunks):
        memory.chunk(chunk).fill_(chunk % 251 + 1)
    return cache, memory


def measure_file(folder: Path, host_bytes: int) -> dict[str, float | int]:
    """Save and load against plain writes and reads of the same size on the same disk, interleaved in
    alternating order (the disk and the CPUs are shared and noisy: best of each). Every read starts
    cold (page cache dropped)."""
    from hybridcache.persistence.fingerprint import make_fingerprint

    cache, memory = fill_host_tier(host_bytes)
    checkpoint = folder / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    fingerprint = make_fingerprint(checkpoint, {}, "float32", "bench", "none", "bench")
    path = folder / "prefix.cache"
    raw = folder / "raw.bin"
    times: dict[str, list[float]] = {
        name: [] for name in ("save", "write", "load", "read", "stream", "touch")
    }
    saved = _write_trials(path, raw, cache, memory, fingerprint, times)
    size = path.stat().st_size
    loaded = _read_trials(path, raw, cache, fingerprint, times)
    best = {name: min(values) for name, values in times.items()}
    gib = size / (1 << 30)
    return {
        "file_bytes": size,
        "saved_snapshots": saved,
        "loaded_snapshots": loaded,
        "save_gib_per_s": gib / best["save"],
        "load_gib_per_s": gib / best["load"],
        "disk_write_gib_per_s": gib / best["write"],
        "disk_read_gib_per_s": gib / best["read"],
        "disk_stream_read_gib_per_s": gib / best["stream"],
        "memory_first_touch_gib_per_s": gib / best["touch"],
        "save_vs_disk": best["write"] / best["save"],
        "load_vs_disk": best["read"] / best["load"],
        "load_vs_disk_stream": best["stream"] / best["load"],
    }


def _write_trials(path: Path, raw: Path, cache, memory, fingerprint, times: dict[str, list[float]]) -> int:
    """Saves and plain writes, save first on even trials. Appends seconds to ``times``; returns the
    number of snapshots saved."""
    from hybridcache.persistence.save import save_prefix_cache

    saved = 0
    for trial in range(WRITE_TRIALS):
        for step in ("save", "write") if trial % 2 == 0 else ("write", "save"):
            if step == "write":
                times["write"].append(_raw_write(raw, memory, path.stat().st_size))
                continue
            started = time.perf_counter()
            saved = save_prefix_cache(path, cache.index, memory, fingerprint).snapshots
            times["save"].append(time.perf_counter() - started)
    return saved


def _read_trials(path: Path, raw: Path, cache, fingerprint, times: dict[str, list[float]]) -> int:
    """Loads into a fresh cache and plain reads, load first on even trials. Appends seconds to
    ``times``; returns the number of snapshots the last load restored."""
    loaded = 0
    size = path.stat().st_size
    for trial in range(READ_TRIALS):
        for step in ("load", "read") if trial % 2 == 0 else ("read", "load"):
            if step == "load":
                seconds, loaded = _timed_load(path, cache.index.geometry, fingerprint)
                times["load"].append(seconds)
            else:
                times["read"].append(_raw_read_into_fresh_memory(raw, size))
        if trial < CONTEXT_TRIALS:
            times["stream"].append(_raw_read_streaming(raw))
            times["touch"].append(_first_touch(size))
    return loaded


def _timed_load(path: Path, geometry, fingerprint) -> tuple[float, int]:
    """Seconds to load the file cold into a fresh cache, and the snapshots it restored. The fresh
    cache and its memory are released before returning."""
    from hybridcache.cache.facade import Cache
    from hybridcache.gpu.host_tier import HostSlabMemory
    from hybridcache.persistence.load import load_prefix_cache

    _drop_page_cache(path)
    fresh = Cache(geometry)
    fresh_memory = HostSlabMemory(fresh.index.host)
    started = time.perf_counter()
    report = load_prefix_cache(path, fresh, fresh_memory, fingerprint)
    return time.perf_counter() - started, report.restored_snapshots


def _raw_write(path: Path, memory, size: int) -> float:
    """Seconds to write (with fsync) `size` bytes of the same slab memory to a plain file."""
    chunks = [memory.chunk(i).numpy() for i in range(memory.pool.num_chunks)]
    started = time.perf_counter()
    with open(path, "wb") as out:
        left = size
        for chunk in chunks:
            part = chunk[: min(left, len(chunk))]
            out.write(part.data)
            left -= len(part)
            if left <= 0:
                break
        out.flush()
        os.fsync(out.fileno())
    return time.perf_counter() - started


def _raw_read_into_fresh_memory(path: Path, size: int) -> float:
    """Seconds to read the file cold into a freshly allocated buffer of its size, as a load must land
    every byte in host memory it touches for the first time (8 MiB reads)."""
    import torch

    _drop_page_cache(path)
    started = time.perf_counter()
    view = memoryview(torch.empty(size, dtype=torch.uint8).numpy()).cast("B")
    with open(path, "rb", buffering=0) as source:
        done = 0
        while count := source.readinto(view[done : done + STREAM_BYTES]):
            done += count
    return time.perf_counter() - started


def _raw_read_streaming(path: Path) -> float:
    """Seconds to read the file cold through one reused 8 MiB buffer: the disk alone, no memory to
    populate (informational: `load_vs_disk_stream`)."""
    _drop_page_cache(path)
    view = memoryview(bytearray(STREAM_BYTES))
    started = time.perf_counter()
    with open(path, "rb", buffering=0) as source:
        while source.readinto(view):
            pass
    return time.perf_counter() - started


def _first_touch(size: int) -> float:
    """Seconds to allocate and first write `size` bytes of memory (what populating a host tier costs
    on this machine, informational)."""
    import torch

    started = time.perf_counter()
    torch.empty(size, dtype=torch.uint8).fill_(1)
    return time.perf_counter() - started


def _drop_page_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)
