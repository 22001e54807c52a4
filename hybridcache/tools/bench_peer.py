"""`hybridcache bench peer [--llama-server PATH] [--preset small]`: hybridcache beside llama.cpp, one run.

Both servers run one after the other on this machine with the same thread count and their default flags
(ours: `hybridcache serve --model DIR`; llama-server: one slot of `--llama-context` tokens, the shape the
comparison in the issue tracker used). Each gets the same prompts as token ids (random tokens, a fresh
prompt for every run so no cache can serve it: the figures are cold prefill and decode), streamed, greedy,
`ignore_eos`. Printed, one name=value per line:

- per side: prefill tok/s (prompt tokens over time to first token) and decode tok/s (tokens after the
  first over the time from the first to the last) at each context, best of `--repeats`; RSS idle (after
  start-up) and after the runs, and the peak;
- ours beside llama.cpp: `prefill_vs_llama_cpp_<ctx>`, `decode_vs_llama_cpp_<ctx>`, `rss_vs_llama_cpp`
  (ours / theirs: above 1 is faster, or more memory);
- the physical limit (`decode_bound.py`, `bandwidth_probe.py`): the bytes a decode step reads at each context
  over this machine's read bandwidth. Right after every decode run, on both sides, the bench process reads
  memory with the same thread count for as long as that run decoded (the server idle meanwhile), so each
  run has the bandwidth of its own minute: on a shared machine what other tenants leave varies by several
  times between minutes. `decode_vs_bandwidth_limit_<ctx>` is the best over the runs of (decode tok/s) /
  (that window's bandwidth / step bytes); each run's pair is printed (`<side>_decode_runs_<ctx>`).
  `read_bandwidth_gib_s` is the fastest single pass of the run (the quietest instant) and
  `decode_vs_peak_bandwidth_<ctx>` the best decode against it: a floor, since no run of seconds sees only
  quiet instants;
- batched decode on ours: 4 requests decoding at once vs one (`batched4_vs_single`): the tokens all four
  streams delivered while all four were decoding, over that window, against one lane's rate at the same
  prompt length.

Without `--llama-server` only our side and the limit are printed. With `--rounds N` the two servers take
turns N times (ours, llama.cpp, ours, ...), each start a fresh process with fresh prompts; each side keeps
its best speeds over the rounds and its largest RSS. On a shared machine whose speed drifts from minute to
minute, alternating keeps one slow spell from landing on one side only.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from hybridcache.gpu.model.config import ModelConfig
    from hybridcache.tools.bandwidth_probe import BandwidthProbe

CONTEXTS = (2048, 8192)
DECODE_TOKENS = 64
BATCH_LANES = 4
BATCH_PROMPT_TOKENS = 512
BATCH_DECODE_TOKENS = 128
WARM_UP_PROMPT_TOKENS = 128
RSS_SETTLE_S = 2.0  # both servers idle this long before their RSS is read (ours trims its heap when idle)
# (ours is idle once the endpoint refills of the batched answers have run: read while they run, its RSS
# holds their passes' activations, 480 MiB more on `small`)
MODEL = "peer-bench"
FIRST_PLAIN_TOKEN, LAST_PLAIN_TOKEN = 1000, 200_000  # ordinary vocabulary ids (no special tokens)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--llama-server", type=Path, help="path to a built llama.cpp llama-server binary")
    parser.add_argument("--preset", default="small", help="make-tiny-model preset (default: %(default)s)")
    parser.add_argument("--checkpoint", type=Path, help="a Hugging Face Qwen3.5 checkpoint, not a preset")
    parser.add_argument("--threads", type=int, default=2, help="threads per server (default: %(default)s)")
    parser.add_argument("--dtype", choices=["bfloat16", "float32"], default="bfloat16",
                        help="the GGUF's dtype for llama.cpp (ours runs its default, --dtype auto)")
    parser.add_argument("--contexts", type=int, nargs="+", default=list(CONTEXTS),
                        help="prompt lengths in tokens (default: %(default)s)")
    parser.add_argument("--repeats", type=int, default=2, help="runs per context, best kept (default: 2)")
    parser.add_argument("--llama-context", type=int, default=16384,
                        help="llama-server's -c (default: %(default)s)")
    parser.add_argument("--skip-batched", action="store_true", help="do not measure batched decode")
    parser.add_argument("--rounds", type=int, default=1,
                        help="times both servers take turns, best speeds kept (default: %(default)s)")


class SideResult(NamedTuple):
    prefill_tok_s: dict[int, float]
    decode_tok_s: dict[int, float]
    rss_idle: int
    rss_after: int
    rss_peak: int
    batched_vs_single: float | None
    decode_runs: dict[int, list[tuple[float, float]]]
    """Per context, each decode run's (tok/s, bytes/s the bandwidth probe read right after it)."""


def run(args: argparse.Namespace) -> int:
    from hybridcache.gpu.model.config import read_model_config
    from hybridcache.tools.bandwidth_probe import BandwidthProbe
    from hybridcache.tools.make_tiny_model import ensure_preset

    checkpoint = args.checkpoint or ensure_preset(args.preset)
    print(f"checkpoint={checkpoint}")
    print(f"threads={args.threads}")
    probe = BandwidthProbe(args.threads)
    ours_rounds, their_rounds = [], []
    for round_index in range(args.rounds):
        prompts = _prompts(args.contexts, args.repeats, seed=20261201 + round_index)
        ours_rounds.append(_run_ours(checkpoint, args, prompts, probe))
        if args.llama_server is not None:
            their_rounds.append(_run_llama(checkpoint, args, prompts, probe))
    ours = _best_of(ours_rounds)
    _print_side("ours", ours)
    theirs = _best_of(their_rounds) if their_rounds else None
    if theirs is not None:
        _print_side("llama_cpp", theirs)
    peak = probe.best()
    print(f"read_bandwidth_gib_s={peak / 2**30:.1f}")
    step_bytes = _step_bytes(read_model_config(checkpoint / "config.json"), args.dtype, args.contexts)
    for context in args.contexts:
        step = step_bytes[context]
        print(f"decode_step_mib_{context}={step / 2**20:.0f}")
        print(f"decode_limit_tok_s_{context}={peak / step:.1f}")
        print(f"decode_vs_peak_bandwidth_{context}={ours.decode_tok_s[context] * step / peak:.2f}")
        print(f"decode_vs_bandwidth_limit_{context}={_bandwidth_fraction(ours, context, step):.2f}")
        if theirs is not None:
            theirs_fraction = _bandwidth_fraction(theirs, context, step)
            print(f"llama_cpp_decode_vs_bandwidth_limit_{context}={theirs_fraction:.2f}")
    if theirs is not None:
        for context in args.contexts:
            print(f"prefill_vs_llama_cpp_{context}="
                  f"{ours.prefill_tok_s[context] / theirs.prefill_tok_s[context]:.2f}")
            print(f"decode_vs_llama_cpp_{context}="
                  f"{ours.decode_tok_s[context] / theirs.decode_tok_s[context]:.2f}")
        print(f"rss_vs_llama_cpp={ours.rss_after / theirs.rss_after:.2f}")
        print(f"rss_peak_vs_llama_cpp={ours.rss_peak / theirs.rss_peak:.2f}")
    return 0


def _step_bytes(config: ModelConfig, dtype_name: str, contexts: list[int]) -> dict[int, int]:
    """Bytes of one single-lane decode step at each context, in the GGUF's dtype (ours runs the same).
    Pure."""
    import torch

    from hybridcache.tools.decode_bound import decode_step_bytes

    dtype = torch.bfloat16 if dtype_name == "bfloat16" else torch.float32
    return {context: decode_step_bytes(config, dtype, context).total for context in contexts}


def _bandwidth_fraction(side: SideResult, context: int, step_bytes: int) -> float:
    """The best over `side`'s decode runs at `context` of the rate reached over the rate its own window's
    bandwidth allows. Pure."""
    return max(tok_s * step_bytes / bandwidth for tok_s, bandwidth in side.decode_runs[context])


def _best_of(rounds: list[SideResult]) -> SideResult:
    """One side's figures over its rounds: the best speeds, the largest memory. Pure."""
    ratios = [result.batched_vs_single for result in rounds if result.batched_vs_single is not None]
    contexts = rounds[0].prefill_tok_s.keys()
    return SideResult(
        {context: max(result.prefill_tok_s[context] for result in rounds) for context in contexts},
        {context: max(result.decode_tok_s[context] for result in rounds) for context in contexts},
        max(result.rss_idle for result in rounds),
        max(result.rss_after for result in rounds),
        max(result.rss_peak for result in rounds),
        max(ratios) if ratios else None,
        {context: [run for result in rounds for run in result.decode_runs[context]] for context in contexts},
    )


def _prompts(contexts: list[int], repeats: int, seed: int) -> dict[int, list[list[int]]]:
    """A fresh random prompt for every run (so no prefix cache on either side can serve it). Pure."""
    chooser = random.Random(seed)
    return {
        context: [[chooser.randrange(FIRST_PLAIN_TOKEN, LAST_PLAIN_TOKEN) for _ in range(context)]
                  for _ in range(repeats)]
        for context in contexts
    }


def _run_ours(checkpoint: Path, args: argparse.Namespace, prompts: dict[int, list[list[int]]],
              probe: BandwidthProbe) -> SideResult:
    from hybridcache.tools.serve_launch import ServeProcess

    argv = [sys.executable, "-m", "hybridcache", "serve", "--host", "127.0.0.1", "--port", "0",
            "--model", str(checkpoint), "--served-model-name", MODEL]
    env = {**os.environ, "OMP_NUM_THREADS": str(args.threads)}
    with ServeProcess.launch_argv(argv, env=env) as server:
        return _measure(server.url, server.process.pid, prompts, probe, batched=not args.skip_batched)


def _run_llama(checkpoint: Path, args: argparse.Namespace, prompts: dict[int, list[list[int]]],
               probe: BandwidthProbe) -> SideResult:
    from hybridcache.tools.peer_llama import LlamaServer, converted_gguf, find_converter

    gguf = converted_gguf(checkpoint, args.dtype, find_converter(args.llama_server))
    port = _free_port()
    with LlamaServer.launch(args.llama_server, gguf, port, args.threads, args.llama_context) as server:
        return _measure(server.url, server.process.pid, prompts, probe, batched=False)


def _measure(url: str, pid: int, prompts: dict[int, list[list[int]]], probe: BandwidthProbe,
             batched: bool) -> SideResult:
    from hybridcache.tools.stream_timing import timed_completion

    chooser = random.Random(7)
    warm_up = [chooser.randrange(FIRST_PLAIN_TOKEN, LAST_PLAIN_TOKEN) for _ in range(WARM_UP_PROMPT_TOKENS)]
    rss_idle = _rss(pid)["VmRSS"]
    timed_completion(url, MODEL, warm_up, 8)
    prefill: dict[int, float] = {}
    decode: dict[int, float] = {}
    decode_runs: dict[int, list[tuple[float, float]]] = {}
    for context, runs in prompts.items():
        timings, decode_runs[context] = [], []
        for prompt in runs:
            timing = timed_completion(url, MODEL, prompt, DECODE_TOKENS)
            timings.append(timing)
            _wait_until_idle(url)
            decode_runs[context].append((timing.decode_tok_s, probe.sustained(timing.decode_s)))
        prefill[context] = max(timing.prefill_tok_s for timing in timings)
        decode[context] = max(timing.decode_tok_s for timing in timings)
    ratio = _batched_vs_single(url) if batched else None
    _wait_until_idle(url)
    time.sleep(RSS_SETTLE_S)
    memory = _rss(pid)
    return SideResult(prefill, decode, rss_idle, memory["VmRSS"], memory["VmHWM"], ratio, decode_runs)


def _wait_until_idle(url: str, timeout_s: float = 60.0) -> None:
    """Wait until our server has no idle-time work left (the endpoint re-prefill of the answer just
    streamed), so the bandwidth probe and the next prompt find it idle; returns at once for a server without
    `/v1/cache/stats` (llama-server)."""
    import json
    import urllib.error
    import urllib.request

    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(f"{url}/v1/cache/stats", timeout=5) as response:
                stats = json.load(response)
        except (urllib.error.URLError, OSError, ValueError):
            return
        if not stats.get("endpoint_refills_pending") and not stats.get("endpoint_refills_running"):
            return
        time.sleep(0.05)


def _batched_vs_single(url: str) -> float:
    """Decode tok/s of `BATCH_LANES` concurrent requests (while all decode) over one request's."""
    from hybridcache.tools.stream_timing import timed_completion

    chooser = random.Random(11)

    def prompt() -> list[int]:
        return [chooser.randrange(FIRST_PLAIN_TOKEN, LAST_PLAIN_TOKEN) for _ in range(BATCH_PROMPT_TOKENS)]

    single = timed_completion(url, MODEL, prompt(), BATCH_DECODE_TOKENS).decode_tok_s
    _wait_until_idle(url)
    arrivals: list[list[float]] = [[] for _ in range(BATCH_LANES)]
    batch_prompts = [prompt() for _ in range(BATCH_LANES)]

    def one(lane: int) -> None:
        timed_completion(url, MODEL, batch_prompts[lane], BATCH_DECODE_TOKENS, arrivals=arrivals[lane])

    threads = [threading.Thread(target=one, args=(lane,)) for lane in range(BATCH_LANES)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    start = max(times[0] for times in arrivals)
    end = min(times[-1] for times in arrivals)
    if end <= start:
        return 0.0
    tokens = sum(sum(1 for t in times if start < t <= end) for times in arrivals)
    return tokens / (end - start) / single


def _print_side(name: str, result: SideResult) -> None:
    for context in result.prefill_tok_s:
        print(f"{name}_prefill_{context}_tok_s={result.prefill_tok_s[context]:.1f}")
        print(f"{name}_decode_{context}_tok_s={result.decode_tok_s[context]:.1f}")
    print(f"{name}_rss_idle_mib={result.rss_idle >> 20}")
    print(f"{name}_rss_mib={result.rss_after >> 20}")
    print(f"{name}_rss_peak_mib={result.rss_peak >> 20}")
    if result.batched_vs_single is not None:
        print(f"{name}_batched{BATCH_LANES}_vs_single={result.batched_vs_single:.2f}")
    for context, runs in result.decode_runs.items():
        pairs = ",".join(f"{tok_s:.1f}@{bandwidth / 2**30:.1f}" for tok_s, bandwidth in runs)
        print(f"{name}_decode_runs_{context}={pairs}")


def _rss(pid: int) -> dict[str, int]:
    """VmRSS and VmHWM of process `pid` in bytes (from /proc)."""
    values = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if name in ("VmRSS", "VmHWM"):
            values[name] = int(rest.split()[0]) * 1024
    return values


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])
