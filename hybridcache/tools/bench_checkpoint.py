"""Checkpoint digests at a large index: how long the worker stalls for one (`python -m
hybridcache.tools.bench_checkpoint`), printed as name=value lines.

Builds an index of `--conversations` distinct conversations of `--blocks` blocks each, with a tap every
`--tap-every` blocks and an endpoint per conversation, on a device and host tier large enough to keep
everything (so the index only grows), then times:

nodes, snapshots, pages, host_slabs   the size of the index
whole_digest_ms      one digest of the whole state (the unsliced Checkpoint digests it once; the engine
                     before rolling checkpoints digested it twice on the worker: to make the event and
                     again to apply it)
parts                slices of one rolling round (cache/checkpoint_round.py)
slice_max_ms         the longest single Checkpoint slice (make, digest once, apply): the worker's stall,
                     wall clock (includes the thread being descheduled on a busy machine)
slice_max_cpu_ms     the same in the thread's CPU time (what the slice itself costs)
slice_median_ms      the median slice (wall clock)
round_total_ms       every slice of the round together (spread over that many worker units)
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from hybridcache.cache.checkpoint_round import CheckpointRound, checkpoint_parts
from hybridcache.cache.cost_model import CacheCostModel
from hybridcache.cache.facade import Cache
from hybridcache.cache.geometry import CacheGeometry
from hybridcache.cache.hashing import block_hashes
from hybridcache.cache.ids import BLOCK_TOKENS
from hybridcache.cache.match import PromptInput

PAGE = 4096


def build_large_index(
    conversations: int, blocks: int, tap_every: int, seed: int = 0, journal: list | None = None
) -> Cache:
    """A cache holding `conversations` distinct paths of `blocks` blocks, each with a tap every
    `tap_every` blocks and an endpoint, everything landed on the host; its events go to `journal` when
    given. Mutates nothing else."""
    pages = conversations * (blocks + 2) + 64
    snapshots_per = blocks // tap_every + 1
    host_slabs = conversations * (blocks + 2 * snapshots_per + 2) + 64
    geometry = CacheGeometry(num_pages=pages, page_bytes=PAGE, image_bytes=PAGE, slab_bytes=PAGE,
                             host_cache_bytes=host_slabs * PAGE, max_concurrency=1,
                             device_snapshot_slots=4)
    cache = Cache(geometry, CacheCostModel.default(), journal)
    rng = random.Random(seed)
    for _ in range(conversations):
        tokens = [rng.randrange(1, 150_000) for _ in range(blocks * BLOCK_TOKENS + 1)]
        quoted = cache.quote(PromptInput(tuple(tokens), block_hashes(tokens), output_tokens=BLOCK_TOKENS))
        cache.stage(quoted, 0)
        cache.activate(0)
        for block in range(tap_every, blocks, tap_every):
            position = block * BLOCK_TOKENS
            cache.take_tap(0, position)
            cache.commit_blocks(0, tokens[:position])
            published = cache.publish_ready_taps(0, tokens[:position])
            if published.write is not None:
                cache.host_write_done(published.write.batch)
        finished = cache.finish(0, tokens + [1] * (BLOCK_TOKENS - 1))
        for write in (finished.taps.write, finished.write):
            if write is not None:
                cache.host_write_done(write.batch)
    return cache


def measure(cache: Cache) -> dict[str, float]:
    """Time one whole digest and one rolling round of Checkpoint slices. Mutates the cache (seq)."""
    index = cache.index
    started = time.perf_counter()
    index.digest()
    whole = time.perf_counter() - started
    rounds = CheckpointRound()
    rounds.begin(checkpoint_parts(index))
    slices, cpu = [], []
    while rounds.active:
        part, parts = rounds.take()
        started, started_cpu = time.perf_counter(), time.thread_time()
        cache.checkpoint(part, parts)
        slices.append(time.perf_counter() - started)
        cpu.append(time.thread_time() - started_cpu)
    return {
        "nodes": len(index.nodes) - 1,
        "snapshots": len(index.snapshots),
        "pages": index.pages.num_pages,
        "host_slabs": 0 if index.host is None else index.host.num_slabs,
        "whole_digest_ms": whole * 1e3,
        "parts": len(slices),
        "slice_max_ms": max(slices) * 1e3,
        "slice_max_cpu_ms": max(cpu) * 1e3,
        "slice_median_ms": statistics.median(slices) * 1e3,
        "round_total_ms": sum(slices) * 1e3,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--conversations", type=int, default=200)
    parser.add_argument("--blocks", type=int, default=100, help="blocks per conversation")
    parser.add_argument("--tap-every", type=int, default=8, help="blocks between taps")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    started = time.perf_counter()
    cache = build_large_index(args.conversations, args.blocks, args.tap_every, args.seed)
    print(f"build_s={time.perf_counter() - started:.1f}")
    for name, value in measure(cache).items():
        print(f"{name}={value:.2f}" if isinstance(value, float) else f"{name}={value}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
