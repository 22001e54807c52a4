"""`hybridcache bench trace TRACE`: replay a trace against live servers, prefix cache on and off.

    hybridcache bench trace-gen --kind agent --seed 1 --scale 0.05 --out agent.jsonl
    hybridcache bench trace agent.jsonl --max-requests 24 --time-scale 0 --plot ttft.png
    hybridcache bench trace TRACE --server http://127.0.0.1:8000 --nocache-server http://127.0.0.1:8001
    hybridcache bench trace WEKA_DIR --server URL --checkpoint CKPT --time-scale 0 --concurrency 1 \
        --max-prompt-tokens 200000 --max-output-tokens 16

Requests go through the `openai` async client, a task per conversation, concurrently as in the trace
(see `trace_client`); message traces go through /v1/chat/completions, block-id traces (WEKA, Mooncake)
through /v1/completions with deterministic token-id prompts (see `trace_plan`). Without `--server` it
starts `hybridcache serve` itself on a free port with the chosen checkpoint, first with the prefix cache,
then with `--no-prefix-reuse`, one after the other (they share this machine's cores), and stops each with
an orderly SIGTERM (`--cache-only`: the cached one alone). Each server first answers one short warm-up
request of its own. `--concurrency U` replays at most U conversations at a time (WEKA: a root with its
sub-agents inline is one conversation).

Prints one name=value per line: `requests`, then per server (`cache.`, `nocache.`) answered requests,
errors, TTFT p50/p90/p99 in seconds, prompt, cached, computed (prompt − cached) and output tokens, then
`prefill_tokens_computed` and `prefill_tokens_saved` of the cached server, `ttft_p50_vs_nocache`,
`ttft_p90_vs_nocache` and `computed_vs_nocache`. `note=` lines say what was capped or skipped. Progress
goes to stderr. `--plot out.png` draws TTFT per turn for both servers. Exit status 2 for a missing or
unreadable trace, a bad flag or an unreachable server; 1 when a server answered no request at all.

For token-id prompts (block-id traces) each server also gets the token-exact infinite-cache bound
(`trace_bound`): `<label>.bound_tokens`, `<label>.evaluated_tokens` (prompt − cached) and
`<label>.evaluated_vs_bound`, overall and per conversation (`<label>.bound.<conversation>.…`), and a
`<label>.late=` line for every request that evaluated more than bound + 64 tokens: its prompt length,
where it resumed, where it diverges from the earlier prompt it shares most with (the nearest snapshot
would have had to be there) and that prompt. Behind a router whose replicas name themselves
(`x-hybridcache-replica`, as `hybridcache cluster` sets up), the line ends with the replica that served
the request and the one that served the prompt it shares most with (`on r1, shared on r0`): a request
sent away from its prefix is misrouted; one on the same replica found its prefix evicted. The progress
lines on stderr name the replica too.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from hybridcache.tools.bench_engine import preset_checkpoint, run_loop
from hybridcache.tools.serve_launch import ServeFlags, ServeLaunchError, ServeProcess
from hybridcache.tools.trace_bound import Evaluated, LateResume, bound_report, prompt_bounds
from hybridcache.tools.trace_client import (
    OpenAIMissing,
    RequestRecord,
    ServerInfo,
    ServerUnreachable,
    make_client,
    probe_server,
    replay,
    require_openai,
    send_request,
)
from hybridcache.tools.trace_plan import PlanLimits, PlannedRequest, ReplayPlan, plan_replay
from hybridcache.tools.trace_report import compare, format_value, plot_ttft_per_turn, summarize_server
from hybridcache.tools.traces import Trace, TraceFormatError, load_trace

USAGE_EXIT = 2
NO_ANSWER_EXIT = 1
PROG = "hybridcache bench trace"


class BenchTraceError(Exception):
    """A condition the user must fix (exit 2); the message says what."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the benchmark's flags to `parser`. Mutates `parser`."""
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument("trace", type=Path, help="trace file or directory (trace-gen JSONL, WEKA, Mooncake)")
    parser.add_argument("--server", help="URL of a running server with the prefix cache (default: start one)")
    parser.add_argument("--nocache-server", help="URL of a running --no-prefix-reuse server (needs --server)")
    parser.add_argument("--preset", default="small", choices=["small", "tiny", "micro"],
                        help="make-tiny-model preset to serve (default: %(default)s)")
    parser.add_argument("--checkpoint", type=Path,
                        help="a Qwen3.5 checkpoint directory (overrides --preset); with --server, the "
                             "tokenizer that block-id prompts are expanded into")
    parser.add_argument("--max-requests", type=int, help="replay only the first N requests (default: all)")
    parser.add_argument("--time-scale", type=float, default=1.0,
                        help="multiply the trace's arrival and think times; 0 sends as fast as replies "
                             "allow (default: %(default)s)")
    parser.add_argument("--max-prompt-tokens", type=int, default=4096,
                        help="cap token-id prompts of block-id traces (default: %(default)s)")
    parser.add_argument("--max-output-tokens", type=int, default=32,
                        help="cap each request's output (default: %(default)s)")
    parser.add_argument("--max-concurrency", type=int, default=4,
                        help="lanes of the servers this command starts (default: %(default)s)")
    parser.add_argument("--kv-pages", type=int,
                        help="device KV pages of the servers this command starts (default: serve's own, "
                             "--kv-capacity auto, so a long trace's prompts fit as they do in a served run)")
    parser.add_argument("--concurrency", type=int,
                        help="replay at most U conversations at a time (default: all at once)")
    parser.add_argument("--cache-only", action="store_true",
                        help="start only the server with the prefix cache (no --no-prefix-reuse run)")
    parser.add_argument("--api-key", default="none", help="bearer key for --server URLs")
    parser.add_argument("--plot", type=Path, help="write TTFT per turn for both servers to this PNG")


def run(args: argparse.Namespace) -> int:
    """Run the benchmark and print its lines; returns the exit status (see the module docstring)."""
    try:
        return _run(args)
    except BenchTraceError as error:
        print(f"{PROG}: {error}", file=sys.stderr)
        return USAGE_EXIT


def _run(args: argparse.Namespace) -> int:
    _check_flags(args)
    try:
        require_openai()
        trace = load_trace(args.trace, shared_prefix=True)
    except (OpenAIMissing, TraceFormatError) as error:
        raise BenchTraceError(str(error)) from None
    servers = [_probe(url) for url in (args.server, args.nocache_server) if url]  # fail before any work
    checkpoint = _checkpoint(args, needed=not args.server or _has_block_ids(trace))
    limits = PlanLimits(args.max_requests, args.max_prompt_tokens, args.max_output_tokens)
    try:
        plan = plan_replay(trace, limits, token_range(checkpoint) if checkpoint else None)
    except ValueError as error:
        raise BenchTraceError(str(error)) from None
    if plan.num_requests == 0:
        raise BenchTraceError(f"{args.trace}: no requests to replay")
    print(f"requests={plan.num_requests}")
    print(f"endpoint={plan.endpoint}")
    for note in plan.notes:
        print(f"note={note}")
    runs = _replay_all(args, plan, servers, checkpoint)
    summary: dict[str, float | int] = {}
    for label, records in runs.items():
        summary.update(summarize_server(label, records))
    summary.update(compare(summary))
    for name, value in summary.items():
        print(f"{name}={format_value(value)}")
    if plan.endpoint == "completion":
        for label, records in runs.items():
            _print_bound(label, plan, records)
    else:
        print("note=the infinite-cache bound needs token-id prompts (a block-id trace)")
    if args.plot:
        title = f"Time to first token: {args.trace.name} ({plan.num_requests} requests per server)"
        plot_ttft_per_turn(runs, title, args.plot)
        print(f"plot={args.plot}")
    _report_errors(runs)
    return NO_ANSWER_EXIT if any(not any(r.ok for r in records) for records in runs.values()) else 0


def _check_flags(args: argparse.Namespace) -> None:
    if args.nocache_server and not args.server:
        raise BenchTraceError("--nocache-server needs --server (or give neither to start both)")
    if args.time_scale < 0:
        raise BenchTraceError("--time-scale must not be negative")
    if not 1 <= args.max_concurrency <= 8:
        raise BenchTraceError("--max-concurrency must be 1..8")
    if args.max_requests is not None and args.max_requests < 1:
        raise BenchTraceError("--max-requests must be at least 1")
    if args.concurrency is not None and args.concurrency < 1:
        raise BenchTraceError("--concurrency must be at least 1")
    if not args.trace.exists():
        raise BenchTraceError(f"{args.trace}: no such trace file or directory")
    if args.plot and not args.plot.parent.is_dir():
        raise BenchTraceError(f"--plot {args.plot}: no such directory {args.plot.parent}")


def _probe(url: str) -> ServerInfo:
    try:
        return probe_server(url)
    except ServerUnreachable as error:
        raise BenchTraceError(str(error)) from None


def _has_block_ids(trace: Trace) -> bool:
    return any(r.messages is None for r in trace.requests())


def _checkpoint(args: argparse.Namespace, needed: bool) -> Path | None:
    if not needed:
        return None
    directory = args.checkpoint or preset_checkpoint(args.preset)
    if not (directory / "config.json").is_file():
        raise BenchTraceError(f"{directory}: not a checkpoint directory (no config.json)")
    return directory


def token_range(checkpoint: Path) -> tuple[int, int]:
    """[0, n): the ordinary (non-added) token ids of the checkpoint's tokenizer. Raises BenchTraceError
    when it has no tokenizer.json."""
    from tokenizers import Tokenizer

    path = checkpoint / "tokenizer.json"
    if not path.is_file():
        raise BenchTraceError(f"{checkpoint}: no tokenizer.json to expand block ids into tokens")
    return 0, Tokenizer.from_file(str(path)).get_vocab_size(with_added_tokens=False)


def _replay_all(args: argparse.Namespace, plan: ReplayPlan, servers: list[ServerInfo],
                checkpoint: Path | None) -> dict[str, list[RequestRecord]]:
    """label -> records, one server after the other (given ones, or ones this command starts)."""
    runs: dict[str, list[RequestRecord]] = {}
    if servers:
        for label, server in zip(("cache", "nocache"), servers):
            runs[label] = _replay_one(label, server, plan, args)
        if len(servers) == 1:
            print("note=no --nocache-server: ttft_p50_vs_nocache is not measured")
        return runs
    assert checkpoint is not None
    print(f"checkpoint={checkpoint}")
    for label, reuse in (("cache", True), ("nocache", False))[: 1 if args.cache_only else 2]:
        flags = ServeFlags(checkpoint, prefix_reuse=reuse, max_concurrency=args.max_concurrency,
                           kv_pages=args.kv_pages)
        _progress(f"[{label}] starting hybridcache serve{'' if reuse else ' --no-prefix-reuse'}")
        try:
            process = ServeProcess.launch(flags)
        except ServeLaunchError as error:
            raise BenchTraceError(str(error)) from None
        try:
            runs[label] = _replay_one(label, _probe(process.url), plan, args)
        finally:
            _progress(f"[{label}] stopping the server")
            if (code := process.stop()) != 0:
                _progress(f"[{label}] the server exited with {code}; its last lines:\n{process.recent_log()}")
    return runs


def _replay_one(label: str, server: ServerInfo, plan: ReplayPlan,
                args: argparse.Namespace) -> list[RequestRecord]:
    client = make_client(server, args.api_key)
    total = plan.num_requests
    done: list[RequestRecord] = []

    def progress(record: RequestRecord) -> None:
        done.append(record)
        where = f" on {record.replica}" if record.replica else ""
        outcome = record.error or (f"ttft {record.ttft_s:.3f} s, cached {record.cached_tokens}/"
                                   f"{record.prompt_tokens}{where}")
        _progress(f"[{label}] {len(done)}/{total} {record.conversation} turn {record.turn}: {outcome}")

    async def session() -> list[RequestRecord]:
        async with client:
            warm = await send_request(client, server.model, _warm_up_request(plan), time.perf_counter())
            if not warm.ok:
                _progress(f"[{label}] warm-up failed: {warm.error}")
            return await replay(client, server.model, plan, args.time_scale, progress, args.concurrency)

    _progress(f"[{label}] replaying {total} requests against {server.url} (model {server.model})")
    started = time.perf_counter()
    records = run_loop(session())
    print(f"{label}.wall_s={time.perf_counter() - started:.1f}")
    return records


def _print_bound(label: str, plan: ReplayPlan, records: list[RequestRecord]) -> None:
    """The bound lines of one server's replay (see the module docstring)."""
    planned = {(r.conversation, r.turn): (c.id, r) for c in plan.conversations for r in c.requests}
    answered = sorted((r for r in records if r.ok), key=lambda r: r.sent_s)
    bounds = prompt_bounds([((r.conversation, r.turn), planned[r.conversation, r.turn][1].prompt_token_ids)
                            for r in answered])
    evaluated = [Evaluated((r.conversation, r.turn), planned[r.conversation, r.turn][0], r.prompt_tokens,
                           r.cached_tokens) for r in answered]
    mismatched = sum(b.prompt_tokens != e.prompt_tokens for b, e in zip(bounds, evaluated))
    if mismatched:
        print(f"note={label}: {mismatched} replies counted a prompt length other than the tokens sent")
    summary, late = bound_report(bounds, evaluated)
    for name, value in summary.items():
        print(f"{label}.{name}={format_value(value)}")
    replicas = {(r.conversation, r.turn): r.replica for r in answered}
    for request in late:
        print(f"{label}.late={_describe_late(request, replicas)}")


def _describe_late(request: LateResume, replicas: dict[tuple[str, int], str]) -> str:
    """One late request; with the replicas that served it and the prompt it shares with, when known."""
    conversation, turn = request.key
    shared = "no earlier prompt" if request.shared_with is None else "{} turn {}".format(*request.shared_with)
    line = (f"{conversation} turn {turn}: prompt {request.prompt_tokens}, resumed at {request.resumed_at}, "
            f"diverges at {request.diverges_at} from {shared}; evaluated {request.evaluated}, "
            f"bound {request.bound}")
    served_on = replicas.get(request.key, "")
    if served_on:
        line += f"; on {served_on}"
        if request.shared_with is not None and replicas.get(request.shared_with):
            line += f", shared on {replicas[request.shared_with]}"
    return line


def _warm_up_request(plan: ReplayPlan) -> PlannedRequest:
    """A short request on the plan's endpoint that shares no prefix with the trace."""
    if plan.endpoint == "chat":
        messages = ({"role": "user", "content": "Warm up: say one word."},)
        return PlannedRequest(conversation="warm-up", turn=0, arrival_s=0.0, think_s=0.0, max_tokens=2,
                              messages=messages)
    return PlannedRequest(conversation="warm-up", turn=0, arrival_s=0.0, think_s=0.0, max_tokens=2,
                          prompt_token_ids=tuple(range(1, 17)))


def _report_errors(runs: dict[str, list[RequestRecord]]) -> None:
    for label, records in runs.items():
        failed = [r for r in records if not r.ok]
        if failed:
            _progress(f"[{label}] {len(failed)} requests failed; first: {failed[0].conversation} turn "
                      f"{failed[0].turn}: {failed[0].error}")


def _progress(message: str) -> None:
    print(f"{PROG}: {message}", file=sys.stderr, flush=True)
