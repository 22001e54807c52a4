"""What `--cache-dir` costs: request time with the durable directory over without, and the fsync batches.

    python -m hybridcache.tools.bench_cache_dir [--preset micro|tiny] [--conversations 8 --turns 4]

Two engines of the same checkpoint run side by side, both with a Host tier and `--host-write through`
(what `--cache-dir` implies), one with `--cache-dir`. Each turn of each multi-turn conversation (token
prompts that grow by `--turn-tokens` and 16 decoded tokens) is sent to both, back to back, in
alternating order, so drift and other load spread over both; the median per-request time ratio is
what to read (the lowest and highest pair are shown: on a shared machine single requests swing). The
directory's own figures: batches made durable, records written, the mean fdatasync pair per batch
(slab file + contents, on the writer thread, never the worker's), the time hashing slab bytes, and
how far behind the last request `cache_dir_durable_seq` trailed when the run ended.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path


async def _run(preset: str, conversations: int, turns: int, turn_tokens: int, folder: Path) -> dict:
    from hybridcache.config import CacheOptions, EngineOptions, resolve_options
    from hybridcache.core.engine import Engine
    from hybridcache.core.frontend import Frontend
    from hybridcache.core.sampling_params import SamplingParams
    from hybridcache.tools.make_tiny_model import ensure_checkpoint

    model = ensure_checkpoint(folder / preset, preset)

    def engine(cache_dir: Path | None) -> Engine:
        cache = CacheOptions(host_cache_mib=256, host_write="through",
                             cache_dir=None if cache_dir is None else str(cache_dir))
        options = EngineOptions(
            model=str(model), device="cpu", kv_capacity=512, max_concurrency=2, cache=cache
        )
        return Engine(model, resolve_options(options))

    plain, durable = engine(None), engine(folder / "cache")
    await plain.start()
    await durable.start()
    frontend = Frontend.from_dir(model, plain.max_model_len, plain.tokenizer)
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)

    async def timed(target: Engine, tokens: list[int]) -> float:
        started = time.perf_counter()
        async for _ in target.submit(frontend.prepare_tokens(tokens), params):
            pass
        return time.perf_counter() - started

    ratios, seconds = [], {"plain": 0.0, "durable": 0.0}
    try:
        for target in (plain, durable):  # the process's and each engine's first forward are not timed
            await timed(target, [40 + i % 50 for i in range(turn_tokens)])
        for c in range(conversations):
            history: list[int] = []
            for t in range(turns):
                history = history + [32 + (c * 7919 + t * 104729 + i * 31) % 90 for i in range(turn_tokens)]
                order = (plain, durable) if (c + t) % 2 == 0 else (durable, plain)
                times = {id(e): await timed(e, history) for e in order}
                ratios.append(times[id(durable)] / times[id(plain)])
                seconds["plain"] += times[id(plain)]
                seconds["durable"] += times[id(durable)]
        behind_at_end = durable.cache.index.seq - durable.stats()["cache_dir_durable_seq"]
        assert durable.cache_dir is not None
        durable.cache_dir.writer.flush(10.0)
        writer = durable.cache_dir.writer
        figures = {
            "requests_per_side": len(ratios),
            "request_time_ratio_median": round(statistics.median(ratios), 4),
            "request_time_ratio_lowest": round(min(ratios), 4),
            "request_time_ratio_highest": round(max(ratios), 4),
            "total_seconds_plain": round(seconds["plain"], 3),
            "total_seconds_durable": round(seconds["durable"], 3),
            "batches": writer.batches,
            "records": writer.records_written,
            "compactions": writer.compactions,
            "fsync_pair_ms_mean": round(writer.sync_seconds / max(writer.batches, 1) * 1e3, 3),
            "hash_ms_total": round(writer.hash_seconds * 1e3, 3),
            "events_behind_when_the_last_request_ended": behind_at_end,
        }
    finally:
        await plain.stop()
        await durable.stop()
    return figures


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--preset", default="micro", choices=("micro", "tiny", "small"))
    parser.add_argument("--conversations", type=int, default=8)
    parser.add_argument("--turns", type=int, default=4)
    parser.add_argument("--turn-tokens", type=int, default=300)
    parser.add_argument("--workdir", type=Path, default=None, help="default: a temporary directory")


def run(args: argparse.Namespace) -> int:
    with tempfile.TemporaryDirectory(prefix="bench-cache-dir-") as temporary:
        folder = args.workdir or Path(temporary)
        folder.mkdir(parents=True, exist_ok=True)
        figures = asyncio.run(_run(args.preset, args.conversations, args.turns, args.turn_tokens, folder))
    for name, value in figures.items():
        print(f"{name:<45} {value}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """`python -m hybridcache.tools.bench_cache_dir` (also `hybridcache bench cache-dir`)."""
    parser = argparse.ArgumentParser(prog="bench_cache_dir", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))

if __name__ == "__main__":
    sys.exit(main())
