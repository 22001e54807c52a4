"""`hybridcache bench engine`: cold vs resumed TTFT for one long prompt, and what the prefix cache costs.

Two engines run side by side in one process, one with the prefix cache and one with `--no-prefix-reuse`,
and every ratio compares numbers measured in this run (the machine is shared and noisy). For a prompt of
`--prompt-tokens` tokens it prints one name=value per line:

- TTFT cold (first visit), resumed from a device snapshot, and resumed from host slabs (the device copy
  forced out by a second prompt of the same length through a device pool that holds one request);
- `host_resume_vs_cold` (target <= 0.05) and `host_resume_vs_limit` (target <= 1.3), where the limit is
  the prefill of the uncached suffix (the device resume's TTFT, which computes the same suffix with
  nothing to restore) plus the restored bytes at this machine's copy bandwidth (a plain large memcpy of
  host tensors, measured in the same run);
- prefill and decode tok/s with the cache on and off: `prefill_cache_overhead` (target >= 0.97) and
  `decode_cache_overhead` (target >= 0.98). Each cold prompt runs on both engines back to back (the order
  alternates, ABBA), and the printed overhead is the median of these pairs' ratios, so one disturbed run
  moves it less than a best-of comparison would. The same pairs' ratios of process CPU seconds
  (`*_cache_overhead_cpu`) say what the cache costs in work, which other programs on a shared machine
  cannot inflate the way they stretch wall time; the load average is printed beside them.

The checkpoint is `--checkpoint DIR`, or the `--preset` built once into the user's cache folder.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import statistics
import sys
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from hybridcache.cache.write_back import HostWrite

if TYPE_CHECKING:
    from hybridcache.core.api import PreparedPrompt, RequestAccounting
    from hybridcache.core.engine import Engine
    from hybridcache.core.frontend import Frontend

TARGETS = {  # name: (comparison, bound)
    "host_resume_vs_cold": ("<=", 0.05),
    "host_resume_vs_limit": ("<=", 1.3),
    "prefill_cache_overhead": (">=", 0.97),
    "decode_cache_overhead": (">=", 0.98),
}
SETTLE_TIMEOUT_S = 60.0


class Timed(NamedTuple):
    """One request as the caller saw it: time to first token, decode rate, the final accounting, and the
    process CPU seconds spent before the first token and per later token (every thread of the process:
    compute, copies, the worker; the other engine is idle meanwhile)."""

    ttft_s: float
    decode_tok_s: float | None  # None when fewer than two tokens came back
    accounting: RequestAccounting
    prefill_cpu_s: float = 0.0
    decode_cpu_s_per_token: float | None = None


class Pair(NamedTuple):
    """One cold prompt on the cached engine and on the uncached one, run back to back."""

    on: Timed
    off: Timed


class EnginePair(NamedTuple):
    cached: Engine
    uncached: Engine


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the benchmark's flags to `parser`. Mutates `parser`."""
    parser.add_argument(
        "--preset", default="small", help="make-tiny-model preset, unless --checkpoint (default: %(default)s)"
    )
    parser.add_argument("--checkpoint", type=Path, help="a Hugging Face Qwen3.5 checkpoint directory")
    parser.add_argument(
        "--dtype",
        choices=["float32", "bfloat16"],
        default="bfloat16",
        help="compute dtype (default: %(default)s, measured faster than float32 on this project's CPU box)",
    )
    parser.add_argument(
        "--prompt-tokens", type=int, default=8192, help="prompt length (default: %(default)s)"
    )
    parser.add_argument(
        "--decode-tokens",
        type=int,
        default=96,
        help="tokens per timed decode (default: %(default)s; fewer cannot show a 2 %% effect)",
    )
    parser.add_argument(
        "--prefill-chunk", type=int, default=2048, help="prefill chunk in tokens (default: %(default)s)"
    )
    parser.add_argument(
        "--host-cache-mib",
        type=int,
        default=2048,
        help="host tier of the cached engine (default: %(default)s)",
    )
    parser.add_argument(
        "--host-write",
        choices=[mode.value for mode in HostWrite],
        default="back",
        help="host write mode of the cached engine (default: %(default)s)",
    )
    parser.add_argument(
        "--cold-runs",
        type=int,
        default=3,
        help="cold prompts, each run on both engines (the overhead is the median of these pairs); each is "
        "later resumed from host (default: %(default)s)",
    )
    parser.add_argument(
        "--repeats", type=int, default=3, help="device resumes and memcpys, best kept (default: %(default)s)"
    )
    parser.add_argument(
        "--kv-events",
        default=None,
        metavar="tcp://HOST:PORT",
        help="the cached engine also publishes KV events here (serve --kv-events), so the overheads "
        "include the publisher's work",
    )
    parser.add_argument("--copy-mib", type=int, default=256, help="memcpy size for the bandwidth probe")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")


def run(args: argparse.Namespace) -> int:
    """Run the benchmark and print its lines; returns 0, or 2 for a bad flag. An engine error propagates."""
    if args.prompt_tokens < 2 * 64 or args.decode_tokens < 2 or args.repeats < 1 or args.cold_runs < 2:
        print(
            "bench engine: need --prompt-tokens >= 128, --decode-tokens >= 2, --repeats >= 1, "
            "--cold-runs >= 2",
            file=sys.stderr,
        )
        return 2
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    directory = args.checkpoint or preset_checkpoint(args.preset)
    print(f"checkpoint={directory}")
    print(f"dtype={args.dtype}")
    print(f"threads={torch.get_num_threads()}")
    print(f"prompt_tokens={args.prompt_tokens}")
    print(f"decode_tokens={args.decode_tokens}")
    print(f"host_write={args.host_write}")
    print(f"kv_events={args.kv_events or 'off'}")
    print(f"cpus={os.cpu_count()}")
    load_start = os.getloadavg()[0]
    print(f"load_average_start={load_start:.2f}")
    started = time.perf_counter()
    results = run_loop(_measure(directory, args))
    load_end = os.getloadavg()[0]
    print(f"load_average_end={load_end:.2f}")
    warn_if_busy(load_start, load_end, os.cpu_count() or 1)
    for name, value in results.items():
        print(f"{name}={_format(value)}")
    for name, (comparison, bound) in TARGETS.items():
        if name in results:
            print(f"target.{name}={_verdict(float(results[name]), comparison, bound)}")
    print(f"elapsed_s={time.perf_counter() - started:.1f}")
    return 0


def run_loop(main):
    """Run coroutine `main` to completion on uvloop (the loop the server uses), else asyncio's."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency
        return asyncio.run(main)
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(main)


def preset_checkpoint(preset: str) -> Path:
    """`preset` built once (atomically) into the user cache folder (`make_tiny_model.preset_dir`)."""
    from hybridcache.tools.make_tiny_model import ensure_preset, preset_dir

    if not preset_dir(preset).is_dir():
        print(f"building the {preset} checkpoint in {preset_dir(preset)}", file=sys.stderr)
    return ensure_preset(preset)


def _format(value: float | int | str) -> str:
    if isinstance(value, float):
        return f"{value:.4g}" if abs(value) < 1000 else f"{value:.1f}"
    return str(value)


def warn_if_busy(load_start: float, load_end: float, cpus: int) -> None:
    """Say on stderr when other programs shared the CPUs: wall-clock ratios then mostly measure them."""
    if load_start >= 1.0 or load_end > cpus + 1:
        print(
            f"bench engine: note: the machine was busy (load average {load_start:.1f} before, "
            f"{load_end:.1f} after, {cpus} CPUs); wall-clock ratios are unreliable, the *_cpu ones less so",
            file=sys.stderr,
        )


def _verdict(value: float, comparison: str, bound: float) -> str:
    met = value <= bound if comparison == "<=" else value >= bound
    return f"{'met' if met else 'MISSED'} ({value:.4g} {comparison} {bound})"


# -- the measurement ------------------------------------------------------------------------------
async def _measure(directory: Path, args: argparse.Namespace) -> dict[str, float | int | str]:
    from hybridcache.core.frontend import Frontend

    frontend = Frontend.from_dir(directory, args.prompt_tokens + args.decode_tokens + 1)
    prompts = [
        frontend.prepare_tokens(bench_prompt(frontend, args.prompt_tokens, seed=seed))
        for seed in range(1, args.cold_runs + 1)
    ]
    engines = await _start_engines(directory, args)
    try:
        await _warm_up(engines, frontend, args)
        cpu_before = time.process_time()
        result = await _scenario(engines, prompts, args)
        if args.kv_events:
            # The publisher's own thread CPU against the whole process's over the timed scenario.
            publisher_cpu = float(engines.cached.stats()["kv_events_cpu_seconds"])  # type: ignore[arg-type]
            print(f"kv_events_cpu_s={publisher_cpu:.4f}")
            print(f"kv_events_cpu_share={publisher_cpu / max(time.process_time() - cpu_before, 1e-9):.5f}")
        return result
    finally:
        await engines.cached.stop()
        await engines.uncached.stop()


async def _start_engines(directory: Path, args: argparse.Namespace) -> EnginePair:
    from hybridcache.config import CacheOptions, EngineOptions, resolve_options
    from hybridcache.core.engine import Engine

    # A pool for one request: the second prompt's admission evicts the first prompt's device copy.
    # Snapshot slots for every cold prompt's tail tap and endpoint: with the tail on the block boundary
    # below n - 1, a cold run's endpoint lies more than a block past it and is kept too, and a single
    # slot would hold that endpoint, leaving the tail (what a repeat resumes from) on the host only.
    pages = -(-(args.prompt_tokens + args.decode_tokens) // 64) + 2
    engines = []
    for cache in (
        CacheOptions(
            host_cache_mib=args.host_cache_mib,
            device_snapshot_slots=2 * args.cold_runs + 2,
            device_snapshot_copies=True,  # the device source is measured apart (a CPU drops copies)
            host_write=args.host_write,
            kv_events=args.kv_events,
        ),
        CacheOptions(prefix_reuse=False),
    ):
        options = EngineOptions(
            model=str(directory),
            dtype=args.dtype,
            device="cpu",
            max_concurrency=1,
            prefill_chunk=args.prefill_chunk,
            kv_capacity=pages,
            cache=cache,
        )
        engine = Engine(directory, resolve_options(options))
        await engine.start()
        engines.append(engine)
    return EnginePair(*engines)


async def _warm_up(engines: EnginePair, frontend: Frontend, args: argparse.Namespace) -> None:
    """One disabled request of the full prompt length per engine, so first-run costs stay out of the timed
    pairs: the first prefill of a long context in the process was measured 50 % slower in wall time at
    the same CPU time (first touch of its memory), and it fell on the cached engine, which runs first."""
    prompt = frontend.prepare_tokens(bench_prompt(frontend, args.prompt_tokens, seed=0), prefix_reuse=False)
    for engine in engines:
        await timed_request(engine, prompt, 4)


async def _scenario(
    engines: EnginePair, prompts: list[PreparedPrompt], args: argparse.Namespace
) -> dict[str, float | int | str]:
    """The measured sequence. Cold runs alternate between the engines (ABBA), so drift in this machine's
    speed hits both sides alike; each cold prompt on the cached engine evicts the previous one's device
    copy (the pool holds one request), so resuming the earlier prompts afterwards restores from host."""
    cached, uncached = engines
    pairs: list[Pair] = []
    for turn, prompt in enumerate(prompts):
        if turn % 2 == 0:
            on = await _settled(cached, prompt, args.decode_tokens)
            off = await _settled(uncached, prompt, args.decode_tokens)
        else:
            off = await _settled(uncached, prompt, args.decode_tokens)
            on = await _settled(cached, prompt, args.decode_tokens)
        pairs.append(Pair(on, off))
    device = [await _settled(cached, prompts[-1], 1) for _ in range(args.repeats)]
    host = [await _settled(cached, prompt, 1) for prompt in prompts]  # each restore evicts the previous
    bandwidth = copy_bandwidth(args.copy_mib << 20, args.repeats)
    _check_sources([pair.on for pair in pairs], device, host)
    return _summary(args.prompt_tokens, pairs, device, host, bandwidth, cached.stats())


def _summary(
    n: int,
    pairs: list[Pair],
    device: list[Timed],
    host: list[Timed],
    bandwidth: float,
    stats: dict[str, object],
) -> dict[str, float | int | str]:
    """The printed results: the resumes' best (lowest-TTFT) runs and their ratios, and the cache overhead
    as the median over the cold pairs, in wall time and in CPU time. Pure."""
    cold_on = [pair.on for pair in pairs]
    cold_off = [pair.off for pair in pairs]
    cold = min(cold_on, key=lambda t: t.ttft_s)
    best_device = min(device, key=lambda t: t.ttft_s)
    best_host = min(host, key=lambda t: t.ttft_s)
    prefill_on = n / statistics.median(t.ttft_s for t in cold_on)
    prefill_off = n / statistics.median(t.ttft_s for t in cold_off)
    limit = host_resume_limit(best_host, best_device, bandwidth, n / cold.ttft_s)
    overhead = pair_overheads(pairs)
    return {
        "copy_bandwidth_gb_s": bandwidth / 1e9,
        "cold_ttft_ms": cold.ttft_s * 1e3,
        "cold_ttft_no_reuse_ms": min(t.ttft_s for t in cold_off) * 1e3,
        "device_resume_ttft_ms": best_device.ttft_s * 1e3,
        "device_resume_reuse_tokens": best_device.accounting.reuse_tokens,
        "host_resume_ttft_ms": best_host.ttft_s * 1e3,
        "host_resume_ttft_worst_ms": max(t.ttft_s for t in host) * 1e3,
        "host_resume_reuse_tokens": best_host.accounting.reuse_tokens,
        "host_resume_restored_bytes": best_host.accounting.restored_host_bytes,
        "host_resume_limit_ms": limit * 1e3,
        "host_resume_vs_cold": best_host.ttft_s / cold.ttft_s,
        "host_resume_vs_limit": best_host.ttft_s / limit,
        "prefill_tok_s_cache_on": prefill_on,
        "prefill_tok_s_cache_off": prefill_off,
        "decode_tok_s_cache_on": statistics.median(t.decode_tok_s or 0.0 for t in cold_on),
        "decode_tok_s_cache_off": statistics.median(t.decode_tok_s or 0.0 for t in cold_off),
        **{name: statistics.median(values) for name, values in overhead.items()},
        **{f"runs.{name}": _series(values) for name, values in overhead.items()},
        "runs.cold_ttft_ms": _series(t.ttft_s * 1e3 for t in cold_on),
        "runs.cold_ttft_no_reuse_ms": _series(t.ttft_s * 1e3 for t in cold_off),
        "runs.decode_tok_s_cache_on": _series(t.decode_tok_s or 0.0 for t in cold_on),
        "runs.decode_tok_s_cache_off": _series(t.decode_tok_s or 0.0 for t in cold_off),
        "runs.prefill_cpu_s_cache_on": _series(t.prefill_cpu_s for t in cold_on),
        "runs.prefill_cpu_s_cache_off": _series(t.prefill_cpu_s for t in cold_off),
        "runs.host_resume_ttft_ms": _series(t.ttft_s * 1e3 for t in host),
        "device_evictions": _evictions(stats, "device"),
        "taps_taken": int(stats.get("snapshot_taps_taken", 0)),  # type: ignore[call-overload]
        "taps_skipped": int(stats.get("snapshot_taps_skipped", 0)),  # type: ignore[call-overload]
    }


def pair_overheads(pairs: list[Pair]) -> dict[str, list[float]]:
    """Per cold pair, cache-on speed over cache-off speed (1.0: the cache costs nothing; below: it costs):
    prefill and decode, in wall time and in process CPU time. Pure."""
    return {
        "prefill_cache_overhead": [p.off.ttft_s / p.on.ttft_s for p in pairs],
        "decode_cache_overhead": [
            _quotient(p.on.decode_tok_s or 0.0, p.off.decode_tok_s or 0.0) for p in pairs
        ],
        "prefill_cache_overhead_cpu": [_quotient(p.off.prefill_cpu_s, p.on.prefill_cpu_s) for p in pairs],
        "decode_cache_overhead_cpu": [
            _quotient(p.off.decode_cpu_s_per_token or 0.0, p.on.decode_cpu_s_per_token or 0.0) for p in pairs
        ],
    }


def _quotient(numerator: float, denominator: float) -> float:
    return numerator / denominator if denominator > 0 else 0.0


def host_resume_limit(host: Timed, device: Timed, bandwidth: float, prefill_tok_s: float) -> float:
    """Seconds a host resume should take at best: the uncached suffix's prefill, taken as the device
    resume's TTFT (same suffix, nothing restored) corrected by any difference in reuse at the cold
    prefill rate, plus the restored bytes at `bandwidth` (bytes/s). Pure."""
    extra_suffix = max(0, device.accounting.reuse_tokens - host.accounting.reuse_tokens)
    return device.ttft_s + extra_suffix / prefill_tok_s + host.accounting.restored_host_bytes / bandwidth


def _series(values: Iterable[float]) -> str:
    """Every run's value, in run order (the spread shows how noisy this machine was). Pure."""
    return ",".join(f"{value:.4g}" for value in values)


def _evictions(stats: dict[str, object], tier: str) -> int:
    evictions = stats.get("prefix_cache_eviction_events")
    return int(evictions.get(tier, 0)) if isinstance(evictions, dict) else 0


def _check_sources(cold: list[Timed], device: list[Timed], host: list[Timed]) -> None:
    """Say plainly (on stderr) when a run did not resume from where the scenario meant it to."""
    for label, runs, source in (("cold", cold, "root"), ("device", device, "device"), ("host", host, "host")):
        for timed in runs:
            if timed.accounting.source != source:
                print(
                    f"bench engine: warning: a {label} run resumed from {timed.accounting.source} "
                    f"({timed.accounting.reuse_tokens} tokens reused)",
                    file=sys.stderr,
                )


# -- building blocks (tests use them) -------------------------------------------------------------
def bench_prompt(frontend: Frontend, length: int, seed: int) -> list[int]:
    """`length` deterministic ordinary token ids (no special tokens); different seeds start differently."""
    vocab = frontend.tokenizer.vocab_size
    low, high = (1000, min(vocab, 100_000)) if vocab > 2000 else (32, 122)
    chooser = random.Random(seed)
    return [chooser.randrange(low, high) for _ in range(length)]


async def timed_request(engine: Engine, prompt: PreparedPrompt, max_tokens: int) -> Timed:
    """Submit greedily with `max_tokens` forced (ignore_eos) and time it. Raises RequestError."""
    from hybridcache.core.sampling_params import SamplingParams

    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    submitted, submitted_cpu = time.perf_counter(), time.process_time()
    token_times: list[float] = []
    token_cpu: list[float] = []
    accounting = None
    async for output in engine.submit(prompt, params):
        now, now_cpu = time.perf_counter(), time.process_time()
        token_times.extend(now for _ in output.token_ids)
        token_cpu.extend(now_cpu for _ in output.token_ids)
        accounting = output.accounting or accounting
    if not token_times or accounting is None:
        raise RuntimeError("the engine answered without a token")
    decode = decode_cpu = None
    if len(token_times) > 1 and token_times[-1] > token_times[0]:
        decode = (len(token_times) - 1) / (token_times[-1] - token_times[0])
        decode_cpu = (token_cpu[-1] - token_cpu[0]) / (len(token_times) - 1)
    return Timed(token_times[0] - submitted, decode, accounting, token_cpu[0] - submitted_cpu, decode_cpu)


async def _settled(engine: Engine, prompt: PreparedPrompt, max_tokens: int) -> Timed:
    timed = await timed_request(engine, prompt, max_tokens)
    await wait_for_host_writes(engine)
    return timed


async def wait_for_host_writes(engine: Engine, timeout_s: float = SETTLE_TIMEOUT_S) -> bool:
    """Poll `stats()` until no request runs and no host write is in flight (the snapshot copies of the
    last finish landed). Returns False (and says so) on timeout; reads only."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        stats = engine.stats()
        if stats.get("host_writes_in_flight", 0) == 0 and stats.get("requests_running", 0) == 0:
            return True
        await asyncio.sleep(0.01)
    print("bench engine: warning: host writes did not settle", file=sys.stderr)
    return False


def copy_bandwidth(nbytes: int, repeats: int) -> float:
    """Bytes/s of a plain memcpy between two host tensors of `nbytes` (best of `repeats`)."""
    import torch

    source = torch.ones(nbytes, dtype=torch.uint8)
    target = torch.zeros(nbytes, dtype=torch.uint8)
    target.copy_(source)  # fault the pages in
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        target.copy_(source)
        best = min(best, time.perf_counter() - started)
    return nbytes / best
