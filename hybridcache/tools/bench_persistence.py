"""Benchmark the prefix-cache file and the event journal against the disk they run on.

Fills a host tier (default 2 GiB) through the cache facade with conversations whose blocks and
snapshot images are written through, then saves it with `save_prefix_cache` and loads it into a fresh
index with `load_prefix_cache`, and in the same run writes (with fsync) and reads a plain file of the
same size on the same disk. Reads start cold for both (the page cache is dropped for the files with
posix_fadvise). Prints name=value lines: save_gib_per_s, load_gib_per_s, disk_write_gib_per_s,
disk_read_gib_per_s, save_vs_disk, load_vs_disk (targets >= 0.7), and journal_overhead: decode tok/s
of the engine with --event-log over without (target >= 0.98), measured alternately on the micro model.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import tempfile
import time
from pathlib import Path

DEFAULT_HOST_MIB = 2048
SLAB_BYTES = 256 << 10
IMAGE_BYTES = 4 << 20
TRIALS = 2


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--host-cache-mib", type=int, default=DEFAULT_HOST_MIB, help="host tier to save/load")
    parser.add_argument("--dir", default=None, help="directory for the files (default: a temporary one)")
    parser.add_argument("--journal-tokens", type=int, default=400, help="decode tokens per journal trial")
    parser.add_argument("--skip-journal", action="store_true", help="only measure the cache file")


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(dir=args.dir) as scratch:
        folder = Path(scratch)
        results = measure_file(folder, args.host_cache_mib << 20)
        if not args.skip_journal:
            results["journal_overhead"] = asyncio.run(measure_journal(folder, args.journal_tokens))
    for name, value in results.items():
        print(f"{name}={value:.4g}" if isinstance(value, float) else f"{name}={value}")
    return 0


def fill_host_tier(host_bytes: int):
    """A cache whose host tier holds conversations' blocks, images and tails. Returns (cache, memory)."""
    from hybridcache.cache.facade import Cache
    from hybridcache.cache.geometry import CacheGeometry
    from hybridcache.cache.hashing import block_hashes
    from hybridcache.cache.match import PromptInput, Readiness
    from hybridcache.gpu.host_tier import HostSlabMemory

    geometry = CacheGeometry(
        num_pages=256,
        page_bytes=SLAB_BYTES,
        image_bytes=IMAGE_BYTES,
        slab_bytes=SLAB_BYTES,
        host_cache_bytes=host_bytes,
        max_concurrency=1,
        device_snapshot_slots=2,
    )
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
        for plan in (result.taps.write, result.write):
            if plan is not None:
                cache.host_write_done(plan.batch)
    memory = HostSlabMemory(cache.index.host)
    for chunk in range(cache.index.host.num_chunks):
        memory.chunk(chunk).fill_(chunk % 251 + 1)
    return cache, memory


def measure_file(folder: Path, host_bytes: int) -> dict[str, float | int]:
    from hybridcache.cache.facade import Cache
    from hybridcache.gpu.host_tier import HostSlabMemory
    from hybridcache.persistence.fingerprint import make_fingerprint
    from hybridcache.persistence.load import load_prefix_cache
    from hybridcache.persistence.save import save_prefix_cache

    cache, memory = fill_host_tier(host_bytes)
    checkpoint = folder / "checkpoint"
    checkpoint.mkdir()
    (checkpoint / "config.json").write_text("{}")
    fingerprint = make_fingerprint(checkpoint, {}, "float32", "bench", "none", "bench")
    path = folder / "prefix.cache"
    raw = folder / "raw.bin"
    times: dict[str, list[float]] = {"save": [], "load": [], "write": [], "read": []}
    for _trial in range(TRIALS):  # interleaved, best of each: the disk is shared and noisy
        started = time.perf_counter()
        report = save_prefix_cache(path, cache.index, memory, fingerprint)
        times["save"].append(time.perf_counter() - started)
        size = path.stat().st_size
        _drop_page_cache(path)
        fresh = Cache(cache.index.geometry)
        fresh_memory = HostSlabMemory(fresh.index.host)
        started = time.perf_counter()
        loaded = load_prefix_cache(path, fresh, fresh_memory, fingerprint)
        times["load"].append(time.perf_counter() - started)
        write_s, read_s = _raw_disk(raw, memory, size)
        times["write"].append(write_s)
        times["read"].append(read_s)
        raw.unlink()
    save_s, load_s = min(times["save"]), min(times["load"])
    write_s, read_s = min(times["write"]), min(times["read"])
    gib = size / (1 << 30)
    return {
        "file_bytes": size,
        "saved_snapshots": report.snapshots,
        "loaded_snapshots": loaded.restored_snapshots,
        "save_gib_per_s": gib / save_s,
        "load_gib_per_s": gib / load_s,
        "disk_write_gib_per_s": gib / write_s,
        "disk_read_gib_per_s": gib / read_s,
        "save_vs_disk": write_s / save_s,
        "load_vs_disk": read_s / load_s,
    }


def _raw_disk(path: Path, memory, size: int) -> tuple[float, float]:
    """Seconds to write (with fsync) and read back `size` bytes of the same slab memory."""
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
    write_s = time.perf_counter() - started
    _drop_page_cache(path)
    buffer = bytearray(8 << 20)
    view = memoryview(buffer)
    started = time.perf_counter()
    with open(path, "rb", buffering=0) as source:
        while source.readinto(view):
            pass
    read_s = time.perf_counter() - started
    return write_s, read_s


def _drop_page_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


async def measure_journal(folder: Path, tokens: int) -> float:
    """Decode tok/s with an event log over without, alternating trials on the micro checkpoint."""
    from hybridcache.config import CacheOptions, EngineOptions, resolve_options
    from hybridcache.core.engine import Engine
    from hybridcache.core.frontend import Frontend
    from hybridcache.core.sampling_params import SamplingParams
    from hybridcache.tools.make_tiny_model import ensure_checkpoint

    model = ensure_checkpoint(folder / "micro", "micro")
    rates: dict[bool, list[float]] = {True: [], False: []}
    for trial in range(6):
        with_log = trial % 2 == 0
        log_path = str(folder / f"events-{trial}.log") if with_log else None
        options = resolve_options(
            EngineOptions(
                model=str(model), kv_capacity=256, cache=CacheOptions(host_cache_mib=64, event_log=log_path)
            )
        )
        engine = Engine(model, options)
        await engine.start()
        frontend = Frontend.from_dir(model, engine.max_model_len)
        prompt = frontend.prepare_text("journal overhead " * 20)
        params = SamplingParams(max_tokens=tokens, temperature=0.0, ignore_eos=True)
        started = time.perf_counter()
        async for _ in engine.submit(prompt, params):
            pass
        rates[with_log].append(tokens / (time.perf_counter() - started))
        await engine.stop()
    return _median(rates[True]) / _median(rates[False])


def _median(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]
