"""`hybridcache bench index`: prefix index hot paths, printed as name=value lines.

match_240k_ms       match of a 240k-token prompt (3,750 blocks) on a fully cached path with 100 snapshots,
                    the prompt given as packed token bytes (PromptInput.token_bytes, as the frontend packs)
match_240k_first_ms the first of those matches after the commit: it packs each node's tokens once (one sample)
match_240k_token_tuples_ms  the same match given only the token list (tuple slices)
dict_match_240k_ms  the same walk on a plain dict keyed by (parent, tokens) in the same run
match_vs_dict_ratio match_240k_ms / dict_match_240k_ms
insert_240k_ms      commit of the same 3,750 blocks into an empty index (hashes precomputed)
events_per_s        encode + apply + append to an in-memory journal, over a realistic event mix: multi-turn
                    conversations (stage, restore, activate, taps, commits, publication, write-through,
                    release); the index is built and the journal frozen out of the GC untimed
events_per_s_device_full  the same requests on a device a fifth the size, so admissions evict
events_per_s_device_full_write_back  the same, with write-back (the engine's default): eviction writes
                    the reachable blocks to the host first instead of every release writing its blocks
evict_plan_us       one host eviction planning step with 1,000 snapshots on the host
Targets on the reference machine: match_240k_ms <= 2, events_per_s >= 300000.
--profile N         also fold the event mix once under cProfile (after the timed runs) and print the N
                    costliest functions by own time to stderr
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import pstats
import random
import statistics
import sys
import time
from collections.abc import Callable

from hybridcache.cache import events as ev
from hybridcache.cache.cost_model import CacheCostModel
from hybridcache.cache.facade import Cache
from hybridcache.cache.geometry import CacheGeometry
from hybridcache.cache.hashing import block_hashes
from hybridcache.cache.host_eviction import plan_host_room
from hybridcache.cache.ids import BLOCK_TOKENS
from hybridcache.cache.index import PrefixIndex
from hybridcache.cache.match import PromptInput, match
from hybridcache.cache.records import pack_tokens
from hybridcache.cache.write_back import HostWrite

PAGE = 4096


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--blocks", type=int, default=3750, help="blocks on the matched path (240k tokens)")
    parser.add_argument("--snapshots", type=int, default=100, help="snapshots on the matched path")
    parser.add_argument("--repeat", type=int, default=15, help="timed repetitions (median reported)")
    parser.add_argument("--evict-snapshots", type=int, default=1000, help="host snapshots for evict_plan_us")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--profile",
        type=int,
        default=0,
        metavar="N",
        help="after measuring, fold the event mix once under cProfile and print its N costliest functions "
        "(by own time) to stderr; the measurements are taken without the profiler",
    )


def _median_seconds(action: Callable[[], object], repeat: int) -> float:
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        samples.append(time.perf_counter() - start)
    return statistics.median(samples)


def _geometry(num_pages: int, snapshot_slots: int, host_slabs: int) -> CacheGeometry:
    return CacheGeometry(
        num_pages=num_pages,
        page_bytes=PAGE,
        image_bytes=PAGE,
        slab_bytes=PAGE,
        host_cache_bytes=host_slabs * PAGE,
        max_concurrency=2,
        device_snapshot_slots=snapshot_slots,
    )


def _commit_path(cache: Cache, tokens: list[int], hashes: list[int], tap_positions: list[int]) -> None:
    quoted = cache.quote(PromptInput(tuple(tokens), hashes, output_tokens=0))
    cache.stage(quoted, 0)
    cache.activate(0)
    for position in tap_positions:
        cache.take_tap(0, position)
    cache.commit_blocks(0, tokens, hashes)
    cache.publish_ready_taps(0, tokens)


def _long_path(args: argparse.Namespace) -> tuple[list[int], list[int], list[int]]:
    rng = random.Random(args.seed)
    tokens = [rng.randrange(1, 150_000) for _ in range(args.blocks * BLOCK_TOKENS)]
    step = max(args.blocks // args.snapshots, 1)
    taps = [BLOCK_TOKENS * step * (i + 1) for i in range(args.snapshots) if step * (i + 1) <= args.blocks]
    return tokens, block_hashes(tokens), taps


def _bench_match(args: argparse.Namespace, journal: list) -> dict[str, float]:
    tokens, hashes, taps = _long_path(args)
    cache = Cache(_geometry(args.blocks + 8, len(taps) + 2, 0), CacheCostModel.default(), journal)
    _commit_path(cache, tokens, hashes, taps)
    probe_list = [*tokens, 1]
    probe = PromptInput(probe_list, hashes, token_bytes=pack_tokens(probe_list))  # the frontend packs once
    start = time.perf_counter()
    found = match(cache.index, probe)  # the first walk packs every node's tokens (BlockNode.packed_tokens)
    first = time.perf_counter() - start
    assert len(found.path) == args.blocks and len(found.candidates) == len(taps)
    ours = _median_seconds(lambda: match(cache.index, probe), args.repeat)
    baseline = _dict_baseline(tokens)
    probe_tokens = tuple(probe_list)
    reference = _median_seconds(lambda: _dict_match(baseline, probe_tokens), args.repeat)
    tuple_probe = PromptInput(probe_tokens, hashes)
    tuple_walk = _median_seconds(lambda: match(cache.index, tuple_probe), args.repeat)

    def insert() -> None:
        fresh = Cache(_geometry(args.blocks + 8, 2, 0), CacheCostModel.default())
        _commit_path(fresh, tokens, hashes, [])

    inserted = _median_seconds(insert, max(args.repeat // 3, 3))
    return {
        "match_240k_ms": ours * 1e3,
        "match_240k_first_ms": first * 1e3,
        "dict_match_240k_ms": reference * 1e3,
        "match_vs_dict_ratio": ours / reference,
        "match_240k_token_tuples_ms": tuple_walk * 1e3,
        "insert_240k_ms": inserted * 1e3,
    }


def _dict_baseline(tokens: list[int]) -> dict[tuple[int, tuple[int, ...]], int]:
    table: dict[tuple[int, tuple[int, ...]], int] = {}
    parent = 0
    for start in range(0, len(tokens), BLOCK_TOKENS):
        node = len(table) + 1
        table[(parent, tuple(tokens[start : start + BLOCK_TOKENS]))] = node
        parent = node
    return table


def _dict_match(table: dict[tuple[int, tuple[int, ...]], int], tokens: tuple[int, ...]) -> int:
    parent, depth = 0, 0
    for start in range(0, (len(tokens) - 1) // BLOCK_TOKENS * BLOCK_TOKENS, BLOCK_TOKENS):
        node = table.get((parent, tokens[start : start + BLOCK_TOKENS]))
        if node is None:
            break
        parent, depth = node, depth + 1
    return depth


def _request_mix(cache: Cache, rng: random.Random, count: int) -> None:
    """Multi-turn conversations sharing preambles: inserts, hits, taps, endpoints, write-through."""
    preambles = [[rng.randrange(1, 150_000) for _ in range(1024)] for _ in range(4)]
    conversations = [list(rng.choice(preambles)) for _ in range(8)]
    for turn in range(count):
        history = conversations[turn % len(conversations)]
        history += [rng.randrange(1, 150_000) for _ in range(rng.randrange(64, 600))]
        quoted = cache.quote(PromptInput(tuple(history), block_hashes(history), output_tokens=128))
        staged = cache.stage(quoted, 0)
        cache.activate(0)
        if staged.restore is not None:
            cache.restore_done(staged.restore.batch)
        if len(history) - 1 > quoted.reuse_tokens + 64:
            cache.take_tap(0, len(history) - 1)
        cache.commit_blocks(0, history)
        history += [rng.randrange(1, 150_000) for _ in range(rng.randrange(10, 120))]
        result = cache.finish(0, history)
        for write in (result.taps.write, result.write):
            if write is not None:
                cache.host_write_done(write.batch)


def _event_mix(
    geometry: CacheGeometry, seed: int, host_write: HostWrite = HostWrite.THROUGH
) -> list[ev.CacheEvent]:
    """The journal of ``_request_mix``. Write-through by default: the mix the target was set on (every
    release writes its new blocks); ``HostWrite.BACK`` writes blocks only when eviction would lose them."""
    journal: list[ev.CacheEvent] = []
    cache = Cache(geometry, CacheCostModel.default(), journal, host_write)
    _request_mix(cache, random.Random(seed), 200)
    return journal


def _fold_seconds(geometry: CacheGeometry, journal: list[ev.CacheEvent], repeat: int) -> float:
    """Median seconds to encode, apply and journal every event into a fresh index (built untimed).

    The prebuilt journal is benchmark scaffolding (the engine never holds its log as objects), so it is
    frozen out of the cyclic GC while timing; the index's own allocations still pay for collection."""
    samples = []
    gc.collect()
    gc.freeze()
    try:
        for _ in range(repeat):
            gc.collect()  # the previous repetition's index, untimed
            index = PrefixIndex(geometry)
            apply, encode = index.apply, ev.encode_event
            out: list[bytes] = []
            append = out.append
            start = time.perf_counter()
            for event in journal:
                append(encode(event))
                apply(event)
            samples.append(time.perf_counter() - start)
    finally:
        gc.unfreeze()
    return statistics.median(samples)


def _bench_events(args: argparse.Namespace) -> dict[str, float]:
    geometry = _geometry(2048, 6, 4096)
    journal = _event_mix(geometry, args.seed + 1)
    kinds = {type(e).__name__ for e in journal}
    path_nodes = sum(e.base // BLOCK_TOKENS for e in journal if isinstance(e, ev.LaneStaged))
    stages = sum(1 for e in journal if isinstance(e, ev.LaneStaged))
    # The same requests on a device a fifth the size: admissions evict (host-backed drops, §9.1).
    full_geometry = _geometry(400, 6, 4096)
    full_journal = _event_mix(full_geometry, args.seed + 1)
    # The same requests with write-back (the engine's default host write mode): on the small device
    # eviction writes reachable blocks to the host first.
    back_journal = _event_mix(full_geometry, args.seed + 1, HostWrite.BACK)
    repeat = max(args.repeat // 3, 3)
    return {
        "events_per_s": len(journal) / _fold_seconds(geometry, journal, repeat),
        "event_kinds": float(len(kinds)),
        "events_mix_count": float(len(journal)),
        "events_mix_mean_path_blocks": path_nodes / max(stages, 1),
        "events_per_s_device_full": len(full_journal) / _fold_seconds(full_geometry, full_journal, repeat),
        "events_device_full_evictions": float(
            sum(1 for e in full_journal if isinstance(e, ev.DeviceCopiesDropped | ev.SubtreeDeleted))
        ),
        "events_per_s_device_full_write_back": len(back_journal)
        / _fold_seconds(full_geometry, back_journal, repeat),
    }


def _print_fold_profile(args: argparse.Namespace, top: int) -> None:
    """One fold of the event mix (encode + apply + append, as ``_fold_seconds``) under cProfile; the
    ``top`` functions by own time go to stderr. The profiler's per-call cost inflates small functions."""
    geometry = _geometry(2048, 6, 4096)
    journal = _event_mix(geometry, args.seed + 1)
    index = PrefixIndex(geometry)
    apply, encode = index.apply, ev.encode_event
    out: list[bytes] = []
    profile = cProfile.Profile()
    profile.enable()
    for event in journal:
        out.append(encode(event))
        apply(event)
    profile.disable()
    pstats.Stats(profile, stream=sys.stderr).sort_stats("tottime").print_stats(top)


def _bench_evict(args: argparse.Namespace) -> dict[str, float]:
    rng = random.Random(args.seed + 2)
    count = args.evict_snapshots
    geometry = _geometry(4 * count + 64, 8, 4 * count)
    cache = Cache(geometry, CacheCostModel.default())
    for _ in range(count):
        tokens = [rng.randrange(1, 150_000) for _ in range(2 * BLOCK_TOKENS + 10)]
        quoted = cache.quote(PromptInput(tuple(tokens), block_hashes(tokens), output_tokens=0))
        cache.stage(quoted, 0)
        cache.activate(0)
        cache.commit_blocks(0, tokens)
        result = cache.finish(0, tokens)
        if result.write is not None:
            cache.host_write_done(result.write.batch)
    index = cache.index
    host_snapshots = sum(1 for s in index.snapshots.values() if s.host_slabs)
    assert index.host is not None
    want = index.host.num_free + geometry.image_slabs + 1
    step = plan_host_room(index, want)
    assert step
    seconds = _median_seconds(lambda: plan_host_room(index, want), args.repeat)
    return {"evict_plan_us": seconds * 1e6, "evict_host_snapshots": float(host_snapshots)}


def run(args: argparse.Namespace) -> int:
    """Print every measurement as name=value. Returns 0."""
    results = _bench_match(args, [])
    results.update(_bench_events(args))
    results.update(_bench_evict(args))
    for name, value in results.items():
        print(f"{name}={value:.6g}")
    if getattr(args, "profile", 0) > 0:
        _print_fold_profile(args, args.profile)
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, allow_abbrev=False)
    add_arguments(parser)
    return run(parser.parse_args())


if __name__ == "__main__":
    raise SystemExit(main())
