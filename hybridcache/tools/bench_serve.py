"""`hybridcache bench serve`: the HTTP server under concurrent clients over loopback, cache on vs off.

Two servers run in this process, one with the prefix cache and one with `--no-prefix-reuse`, each an
engine behind the aiohttp app on 127.0.0.1 (a free port). A child process drives each in turn with
`--clients` concurrent clients: every client holds one conversation (a shared system prompt, then turns
that append the streamed reply and a new user message), sending streaming chat completions until
`--requests` have been answered in all. For each server it prints, one name=value per line, request
throughput, output tok/s, TTFT p50/p99, inter-token latency p50/p99 and the share of prompt tokens
served from the cache. Clients ask for logprobs, so the server streams one chunk per token even while
its output parser holds text back: TTFT is the first token's chunk, ITL the gaps between chunks. Then
come the on/off ratios, and `http_overhead`: the end-to-end time of a max_tokens=1 request over HTTP
divided by the same request through `Engine.submit` (frontend preparation included), medians of
interleaved repeats in this run.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import random
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from hybridcache.tools.bench_engine import preset_checkpoint, run_loop
from hybridcache.tools.serve_launch import MODEL, LiveServer, start_server

if TYPE_CHECKING:
    from aiohttp import ClientSession

    from hybridcache.core.engine import Engine
    from hybridcache.core.frontend import Frontend

# fmt: off
WORDS = (
    "cache", "prefix", "block", "snapshot", "state", "layer", "token", "page", "host", "device", "restore",
    "commit", "lane", "chunk", "decode", "prefill", "query", "answer", "tool", "call", "reason", "plan",
    "agent", "turn", "history", "window", "memory",
)
# fmt: on
NO_THINKING = {"enable_thinking": False}


class LoadPlan(NamedTuple):
    """What the child process sends (picklable)."""

    url: str
    clients: int
    requests: int
    max_tokens: int
    system_words: int
    user_words: int
    seed: int


class Sample(NamedTuple):
    """One streamed request, seen by the client (seconds from the request's send)."""

    sent_at: float
    ttft_s: float
    gaps_s: tuple[float, ...]
    total_s: float
    chunks: int
    completion_tokens: int
    prompt_tokens: int
    cached_tokens: int


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the benchmark's flags to `parser`. Mutates `parser`."""
    parser.add_argument("--preset", default="tiny", help="make-tiny-model preset (default: %(default)s)")
    parser.add_argument("--checkpoint", type=Path, help="a Hugging Face Qwen3.5 checkpoint directory")
    parser.add_argument("--dtype", choices=["float32", "bfloat16"], default="float32")
    parser.add_argument("--clients", type=int, default=4, help="concurrent clients (default: %(default)s)")
    parser.add_argument(
        "--requests", type=int, default=32, help="requests per server, in all (default: %(default)s)"
    )
    parser.add_argument("--max-tokens", type=int, default=32, help="tokens per answer (default: %(default)s)")
    parser.add_argument(
        "--system-words", type=int, default=400, help="shared system prompt length (default: %(default)s)"
    )
    parser.add_argument(
        "--user-words", type=int, default=24, help="words per user turn (default: %(default)s)"
    )
    parser.add_argument(
        "--overhead-repeats", type=int, default=20, help="http_overhead pairs (median; default: %(default)s)"
    )
    parser.add_argument("--kv-pages", type=int, default=2048, help="device KV pages per server")
    parser.add_argument("--threads", type=int, help="torch threads (default: torch's)")


def run(args: argparse.Namespace) -> int:
    """Run the benchmark and print its lines; returns the exit status (2 for a bad flag)."""
    if min(args.clients, args.requests, args.max_tokens, args.overhead_repeats) < 1 or args.clients > 8:
        message = "--clients must be 1..8; --requests, --max-tokens, --overhead-repeats at least 1"
        print(f"bench serve: {message}", file=sys.stderr)
        return 2
    if args.threads:
        import torch

        torch.set_num_threads(args.threads)
    directory = args.checkpoint or preset_checkpoint(args.preset)
    print(f"checkpoint={directory}")
    print(f"clients={args.clients}")
    print(f"requests={args.requests}")
    print(f"max_tokens={args.max_tokens}")
    started = time.perf_counter()
    results = run_loop(_measure(directory, args))
    for name, value in results.items():
        print(f"{name}={value:.4g}" if isinstance(value, float) else f"{name}={value}")
    print(f"elapsed_s={time.perf_counter() - started:.1f}")
    return 0


async def _measure(directory: Path, args: argparse.Namespace) -> dict[str, float | int]:
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    results: dict[str, float | int] = {}
    servers = [await start_server(directory, args, prefix_reuse=reuse) for reuse in (True, False)]
    loop = asyncio.get_running_loop()
    try:
        with ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn")) as clients:
            for label, server in zip(("cache_on", "cache_off"), servers):
                await _warm_up(server.url)
                plan = LoadPlan(
                    server.url,
                    args.clients,
                    args.requests,
                    args.max_tokens,
                    args.system_words,
                    args.user_words,
                    seed=1,
                )
                started = time.perf_counter()
                samples = await loop.run_in_executor(clients, drive_load_in_process, plan)
                results.update(summarize(label, samples, time.perf_counter() - started))
        results.update(_ratios(results))
        results.update(await measure_http_overhead(servers[1], directory, args.overhead_repeats))
    finally:
        for server in servers:
            await server.runner.cleanup()
            await server.engine.stop()
    return results


async def _warm_up(url: str) -> None:
    """One request with its own system prompt, so first-call costs stay out of the load."""
    import aiohttp

    async with aiohttp.ClientSession() as session:
        messages = [{"role": "system", "content": "warm up"}, {"role": "user", "content": "hello"}]
        await stream_chat(session, url, messages, 4)


# -- the load (runs in a child process) -----------------------------------------------------------
def drive_load_in_process(plan: LoadPlan) -> list[Sample]:
    """Entry point of the child process: run the plan's clients to the end. Returns every sample."""
    return asyncio.run(drive_load(plan))


async def drive_load(plan: LoadPlan) -> list[Sample]:
    """`plan.clients` conversations sending streaming chat requests until `plan.requests` are done."""
    import aiohttp

    remaining = [plan.requests]
    samples: list[Sample] = []
    system = " ".join(_words(random.Random(plan.seed), plan.system_words))
    connector = aiohttp.TCPConnector(limit=plan.clients)
    async with aiohttp.ClientSession(connector=connector) as session:
        await asyncio.gather(
            *(
                _conversation(
                    session, plan, system, random.Random(plan.seed * 1000 + client), remaining, samples
                )
                for client in range(plan.clients)
            )
        )
    return samples


async def _conversation(
    session: ClientSession,
    plan: LoadPlan,
    system: str,
    chooser: random.Random,
    remaining: list[int],
    samples: list[Sample],
) -> None:
    messages: list[dict[str, str]] = [{"role": "system", "content": system}]
    while remaining[0] > 0:
        remaining[0] -= 1
        messages.append({"role": "user", "content": " ".join(_words(chooser, plan.user_words))})
        sample, reply = await stream_chat(session, plan.url, messages, plan.max_tokens)
        samples.append(sample)
        messages.append({"role": "assistant", "content": reply})


def _words(chooser: random.Random, count: int) -> list[str]:
    return [chooser.choice(WORDS) for _ in range(count)]


async def stream_chat(
    session: ClientSession, url: str, messages: list[dict[str, str]], max_tokens: int
) -> tuple[Sample, str]:
    """One streaming chat completion, timed chunk by chunk. Returns the sample and the reply text;
    raises RuntimeError on an error status or an error frame."""
    import msgspec

    body = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "ignore_eos": True,
        "logprobs": True,  # one chunk per token, even while the output parser holds text back
        "stream": True,
        "stream_options": {"include_usage": True},
        "chat_template_kwargs": NO_THINKING,
    }
    arrivals: list[float] = []
    text: list[str] = []
    usage: dict[str, Any] = {}
    sent_at = time.perf_counter()
    async with session.post(url + "/v1/chat/completions", json=body) as response:
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}: {await response.text()}")
        async for line in response.content:
            if not line.startswith(b"data: ") or line.startswith(b"data: [DONE]"):
                continue
            frame = msgspec.json.decode(line[6:])
            if "error" in frame:
                raise RuntimeError(f"error frame: {frame['error']}")
            usage = frame.get("usage") or usage
            for choice in frame.get("choices", ()):
                delta = choice.get("delta") or {}
                text.append(delta.get("content") or delta.get("reasoning_content") or "")
                if choice.get("logprobs"):  # a token's chunk (a flush of held-back text carries none)
                    arrivals.append(time.perf_counter())
    finished_at = time.perf_counter()
    if not arrivals:
        arrivals.append(finished_at)  # a server that sent no logprobs: count the whole answer as one chunk
    details = usage.get("prompt_tokens_details") or {}
    sample = Sample(
        sent_at=sent_at,
        ttft_s=arrivals[0] - sent_at,
        gaps_s=tuple(b - a for a, b in itertools.pairwise(arrivals)),
        total_s=finished_at - sent_at,
        chunks=len(arrivals),
        completion_tokens=int(usage.get("completion_tokens", 0)),
        prompt_tokens=int(usage.get("prompt_tokens", 0)),
        cached_tokens=int(details.get("cached_tokens") or 0),
    )
    return sample, "".join(text)


# -- summaries --------------------------------------------------------------------------------------
def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100) by linear interpolation between closest ranks. Pure; raises
    ValueError on no values."""
    if not values:
        raise ValueError("percentile of no values")
    ordered = sorted(values)
    position = (len(ordered) - 1) * q / 100
    low = int(position)
    high = min(low + 1, len(ordered) - 1)
    value = ordered[low] + (ordered[high] - ordered[low]) * (position - low)
    return min(max(value, ordered[low]), ordered[high])  # no rounding past the neighbours


def summarize(label: str, samples: Sequence[Sample], wall_s: float) -> dict[str, float | int]:
    """name=value results of one load run, names prefixed with `label`. Pure."""
    ttfts = [s.ttft_s * 1e3 for s in samples]
    gaps = [gap * 1e3 for s in samples for gap in s.gaps_s] or [0.0]
    tokens = sum(s.completion_tokens for s in samples)
    prompt = sum(s.prompt_tokens for s in samples)
    return {
        f"{label}.requests_per_s": len(samples) / wall_s,
        f"{label}.output_tok_s": tokens / wall_s,
        f"{label}.ttft_p50_ms": percentile(ttfts, 50),
        f"{label}.ttft_p99_ms": percentile(ttfts, 99),
        f"{label}.itl_p50_ms": percentile(gaps, 50),
        f"{label}.itl_p99_ms": percentile(gaps, 99),
        f"{label}.cached_token_share": sum(s.cached_tokens for s in samples) / max(prompt, 1),
        f"{label}.chunks_per_token": sum(s.chunks for s in samples) / max(tokens, 1),
        f"{label}.requests_done": len(samples),
    }


def _ratios(results: dict[str, float | int]) -> dict[str, float]:
    def ratio(name: str) -> float:
        return float(results[f"cache_on.{name}"]) / max(float(results[f"cache_off.{name}"]), 1e-12)

    return {
        "throughput_on_vs_off": ratio("requests_per_s"),
        "ttft_p50_on_vs_off": ratio("ttft_p50_ms"),
        "itl_p50_on_vs_off": ratio("itl_p50_ms"),
    }


# -- http_overhead ----------------------------------------------------------------------------------
async def measure_http_overhead(server: LiveServer, directory: Path, repeats: int) -> dict[str, float]:
    """Median end-to-end ms of a max_tokens=1 chat request over HTTP and through `Engine.submit`
    (frontend preparation included), alternating, and their ratio `http_overhead`."""
    import aiohttp

    from hybridcache.core.frontend import Frontend

    frontend = Frontend.from_dir(directory, server.engine.max_model_len, server.engine.tokenizer)
    messages = [
        {"role": "system", "content": " ".join(_words(random.Random(7), 200))},
        {"role": "user", "content": "Say one word."},
    ]
    over_http: list[float] = []
    direct: list[float] = []
    async with aiohttp.ClientSession() as session:
        for _ in range(repeats + 1):  # the first pair warms both paths and is dropped
            over_http.append(await _timed_http(session, server.url, messages))
            direct.append(await _timed_submit(server.engine, frontend, messages))
    http_ms = statistics.median(over_http[1:]) * 1e3
    submit_ms = statistics.median(direct[1:]) * 1e3
    return {"http_request_ms": http_ms, "submit_request_ms": submit_ms, "http_overhead": http_ms / submit_ms}


async def _timed_http(session: ClientSession, url: str, messages: list[dict[str, str]]) -> float:
    body = {
        "model": MODEL,
        "messages": messages,
        "max_tokens": 1,
        "temperature": 0,
        "chat_template_kwargs": NO_THINKING,
    }
    started = time.perf_counter()
    async with session.post(url + "/v1/chat/completions", json=body) as response:
        await response.read()
        if response.status != 200:
            raise RuntimeError(f"HTTP {response.status}")
    return time.perf_counter() - started


async def _timed_submit(engine: Engine, frontend: Frontend, messages: list[dict[str, str]]) -> float:
    from hybridcache.core.sampling_params import SamplingParams

    started = time.perf_counter()
    prompt = frontend.prepare_chat(messages, template_kwargs=NO_THINKING)
    async for _ in engine.submit(prompt, SamplingParams(max_tokens=1, temperature=0.0)):
        pass
    return time.perf_counter() - started
