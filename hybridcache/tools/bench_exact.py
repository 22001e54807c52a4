"""`hybridcache bench exact`: does a resumed request compute exactly what a cold one computes?

For prompts that resume from each source (a device snapshot, host slabs, the cache file after a restart,
a coalesced sibling's tap) at points that are and are not block-aligned, the resumed request's answer is
compared with the same prompt run cold on an engine without prefix reuse, at the same prefill chunk. A
second cold engine with a quarter of the chunk measures how much chunking alone moves the numbers. Every
request decodes `--decode-tokens` greedy tokens (the first comes from the prefill) and asks for the top-20
log-probabilities of each (the most `Engine.submit` returns); a step is compared while the two runs have
produced the same tokens so far, so the continuation is teacher-forced by the cold run's own tokens.

Printed (name=value lines): per case its source, reuse and `max_logprob_diff` and greedy tokens matched;
then `cache_max_logprob_diff` (largest |Δ| over every compared step and top-20 entry, resumed vs cold),
`chunking_max_logprob_diff` (the same between the two cold engines), `greedy_tokens_matched`, and
`top_token_sets_differ` (steps whose top-20 token sets differ: they count as infinite difference).
"""

from __future__ import annotations

import argparse
import asyncio
import math
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

from hybridcache.tools.bench_engine import bench_prompt, preset_checkpoint, run_loop, wait_for_host_writes

if TYPE_CHECKING:
    from hybridcache.core.api import PreparedPrompt
    from hybridcache.core.engine import Engine
    from hybridcache.core.frontend import Frontend

TOP = 20


class Answer(NamedTuple):
    """One request's greedy tokens, the top-20 log-probabilities of each step, and where it resumed."""

    tokens: list[int]
    steps: list[dict[int, float]]
    source: str
    reuse_tokens: int


class Comparison(NamedTuple):
    max_diff: float  # math.inf when some step's top-20 token sets differ
    matched: int  # leading greedy tokens that agree
    total: int
    differing_sets: int


class Case(NamedTuple):
    """A prompt to resume: `setup` prompts run first on the cached engine (to leave snapshots), then
    `target`; `source` is where the target should resume from."""

    name: str
    source: str
    setup: list[list[int]]
    target: list[int]


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
        help="compute dtype (default: %(default)s)",
    )
    parser.add_argument(
        "--prompt-tokens",
        type=int,
        default=1000,
        help="length of the first prompt of each case; the others extend or fork it (default: %(default)s)",
    )
    parser.add_argument(
        "--decode-tokens",
        type=int,
        default=64,
        help="greedy tokens compared per request (default: %(default)s)",
    )
    parser.add_argument(
        "--prefill-chunk", type=int, default=512, help="prefill chunk in tokens (default: %(default)s)"
    )
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")


def run(args: argparse.Namespace) -> int:
    """Run the comparison and print its lines; returns 0 (the numbers say whether reuse was exact), or 2 for
    a bad flag. An engine error propagates."""
    if args.prompt_tokens < 200 or args.decode_tokens < 1 or args.prefill_chunk % 256:
        print(
            "bench exact: need --prompt-tokens >= 200, --decode-tokens >= 1, "
            "--prefill-chunk a multiple of 256",
            file=sys.stderr,
        )
        return 2
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    directory = args.checkpoint or preset_checkpoint(args.preset)
    for name, value in (
        ("checkpoint", directory),
        ("dtype", args.dtype),
        ("threads", torch.get_num_threads()),
        ("prompt_tokens", args.prompt_tokens),
        ("decode_tokens", args.decode_tokens),
        ("prefill_chunk", args.prefill_chunk),
        ("logprob_vector", f"top{TOP} of every step"),
    ):
        print(f"{name}={value}")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-exact-") as scratch:
        lines = run_loop(_measure(directory, args, Path(scratch)))
    for name, value in lines:
        print(f"{name}={value}")
    print(f"elapsed_s={time.perf_counter() - started:.1f}")
    return 0


# -- comparing answers (pure; tests use them) -----------------------------------------------------
def compare(resumed: Answer, cold: Answer) -> Comparison:
    """Step by step while the greedy tokens so far agree: the largest |Δ logprob| over each step's top-20
    entries (inf when the top-20 token sets differ). Pure."""
    worst, differing, matched = 0.0, 0, 0
    for step, (a, b) in enumerate(zip(resumed.steps, cold.steps)):
        if set(a) != set(b):
            differing += 1
            worst = math.inf
        else:
            worst = max(worst, max((abs(a[t] - b[t]) for t in a), default=0.0))
        if resumed.tokens[step] != cold.tokens[step]:
            break
        matched += 1
    return Comparison(worst, matched, len(cold.tokens), differing)


def build_cases(n: int, fresh: Sequence[list[int]]) -> list[Case]:
    """The resumes measured, from prompts of about `n` tokens; `fresh` gives unrelated token lists (at
    least 8, each of 2n tokens). Pure.

    A prompt's tail snapshot sits at (or, before issue 20, exactly at) n − 1: the `unaligned` prompts put
    n − 1 inside a block, the `aligned` ones on a boundary. A repeat and an extension resume at the tail;
    a fork inside a block resumes at the snapshot the cache keeps at a fork point (a structural tap taken
    by the second sequence to leave there) or at the tap a coalesced sibling takes for it."""
    a, b, c, d, e, f, g, h = (list(tokens) for tokens in fresh[:8])
    unaligned, aligned = n - n % 64 + 37, n - n % 64 + 65
    fork = n + 21
    return [
        Case("device.repeat.unaligned", "device", [a[:unaligned]], a[:unaligned]),
        Case("device.repeat.aligned", "device", [b[:aligned]], b[:aligned]),
        Case("device.extend.unaligned", "device", [c[:unaligned]], c[: unaligned + 300]),
        Case("device.fork.unaligned", "device", [d[: 2 * n], d[:fork] + e[:100]], d[:fork] + e[100:300]),
        Case("host.extend.unaligned", "host", [f[:unaligned]], f[: unaligned + 300]),
        Case("file.extend.unaligned", "host", [g[:unaligned]], g[: unaligned + 300]),
        Case("coalesced.fork.unaligned", "device", [h[: 2 * n]], h[:fork] + e[300:500]),
    ]


# -- the measurement ------------------------------------------------------------------------------
async def _measure(directory: Path, args: argparse.Namespace, scratch: Path) -> list[tuple[str, str]]:
    from hybridcache.core.frontend import Frontend

    n = args.prompt_tokens
    frontend = Frontend.from_dir(directory, 3 * n + args.decode_tokens + 64)
    fresh = [bench_prompt(frontend, 2 * n, seed=seed) for seed in range(1, 9)]
    cases = build_cases(n, fresh)
    lines: list[tuple[str, str]] = []
    cold: dict[str, Answer] = {}
    chunking = 0.0
    for chunk in (args.prefill_chunk, args.prefill_chunk // 4):
        engine = await _start(directory, args, chunk, prefix_reuse=False)
        try:
            for case in cases:
                answer = await _ask(engine, frontend.prepare_tokens(case.target), args.decode_tokens)
                if case.name not in cold:
                    cold[case.name] = answer
                else:
                    chunking = max(chunking, compare(answer, cold[case.name]).max_diff)
        finally:
            await engine.stop()
    resumed = await _resume_all(directory, args, frontend, cases, scratch)
    worst, matched, total, differing = 0.0, 0, 0, 0
    for case in cases:
        answer = resumed[case.name]
        result = compare(answer, cold[case.name])
        worst, differing = max(worst, result.max_diff), differing + result.differing_sets
        matched, total = matched + result.matched, total + result.total
        where = answer.source if answer.source == case.source else f"{answer.source} (expected {case.source})"
        lines += [
            (f"case.{case.name}.source", where),
            (f"case.{case.name}.reuse_tokens", f"{answer.reuse_tokens} of {len(case.target)}"),
            (f"case.{case.name}.max_logprob_diff", _number(result.max_diff)),
            (f"case.{case.name}.greedy_tokens_matched", f"{result.matched}/{result.total}"),
        ]
    lines += [
        ("cache_max_logprob_diff", _number(worst)),
        ("chunking_max_logprob_diff", _number(chunking)),
        ("greedy_tokens_matched", f"{matched}/{total}"),
        ("top_token_sets_differ", str(differing)),
    ]
    return lines


async def _resume_all(
    directory: Path, args: argparse.Namespace, frontend: Frontend, cases: list[Case], scratch: Path
) -> dict[str, Answer]:
    """Run every case on a cached engine set up so the target resumes from the case's source."""
    answers: dict[str, Answer] = {}
    decode = args.decode_tokens
    for case in cases:
        kind = case.name.split(".")[0]
        cache_file = str(scratch / f"{case.name}.hcache")
        # the host case's pool holds one request, so each filler evicts the one before
        pages = -(-(len(case.target) + decode) // 64) + 2 if kind == "host" else None
        file = cache_file if kind == "file" else None
        engine = await _start(directory, args, args.prefill_chunk, cache_file=file, pages=pages)
        try:
            if kind == "coalesced":  # the target waits for the sibling's tap at the shared prefix
                sibling = _ask(engine, frontend.prepare_tokens(case.setup[0]), 1)
                target = _ask(engine, frontend.prepare_tokens(case.target), decode)
                _, answers[case.name] = await asyncio.gather(sibling, target)
                continue
            for prompt in case.setup:
                await _ask(engine, frontend.prepare_tokens(prompt), 1)
                await wait_for_host_writes(engine)
            if kind == "host":  # unrelated prompts push the setup's blocks and snapshot to host slabs
                for seed in range(20, 22):
                    filler = bench_prompt(frontend, len(case.target), seed=seed)
                    await _ask(engine, frontend.prepare_tokens(filler), 1)
                    await wait_for_host_writes(engine)
            if kind == "file":  # stop (saving the cache file), then a new engine loads it
                await engine.stop()
                engine = await _start(directory, args, args.prefill_chunk, cache_file=cache_file)
            answers[case.name] = await _ask(engine, frontend.prepare_tokens(case.target), decode)
        finally:
            await engine.stop()
    return answers


async def _start(
    directory: Path,
    args: argparse.Namespace,
    chunk: int,
    prefix_reuse: bool = True,
    cache_file: str | None = None,
    pages: int | None = None,
) -> Engine:
    from hybridcache.config import CacheOptions, EngineOptions, resolve_options
    from hybridcache.core.engine import Engine

    one_request_pool = pages is not None
    if pages is None:
        pages = -(-(5 * args.prompt_tokens + 2 * args.decode_tokens) // 64) + 4
    options = EngineOptions(
        model=str(directory),
        dtype=args.dtype,
        device="cpu",
        max_concurrency=2,
        prefill_chunk=chunk,
        kv_capacity=pages,
        cache=CacheOptions(
            host_cache_mib=512,
            device_snapshot_slots=1 if one_request_pool else None,
            device_snapshot_copies=True,  # every source is checked, the device's too (a CPU drops copies)
            prefix_cache_file=cache_file,
        )
        if prefix_reuse
        else CacheOptions(prefix_reuse=False),
    )
    engine = Engine(directory, resolve_options(options))
    await engine.start()
    return engine


async def _ask(engine: Engine, prompt: PreparedPrompt, max_tokens: int) -> Answer:
    """Greedy `max_tokens` (ignore_eos) with the top-20 log-probabilities of every step."""
    from hybridcache.core.sampling_params import SamplingParams

    params = SamplingParams(
        max_tokens=max_tokens, temperature=0.0, logprobs=True, top_logprobs=TOP, ignore_eos=True
    )
    tokens: list[int] = []
    steps: list[dict[int, float]] = []
    accounting = None
    async for output in engine.submit(prompt, params):
        tokens.extend(output.token_ids)
        steps.extend(dict(entry.top) for entry in output.logprobs or ())
        accounting = output.accounting or accounting
    if accounting is None or not tokens:
        raise RuntimeError("the engine answered without a token")
    return Answer(tokens, steps, accounting.source, accounting.reuse_tokens)


def _number(value: float) -> str:
    return "inf" if math.isinf(value) else f"{value:.3g}"
