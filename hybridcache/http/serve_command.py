"""Serve a Qwen3.5 checkpoint over HTTP (OpenAI- and Anthropic-compatible endpoints).

Without --model the embedded `tiny` checkpoint is served (built once into the user's cache directory).
Flags follow vLLM where the meaning is the same and the hybrid prefix cache spec elsewhere.
"""

from __future__ import annotations

import argparse
import sys

from hybridcache.cache.write_back import HostWrite
from hybridcache.config import (
    CPU_PREFILL_CHUNK,
    DEFAULT_HOST_CACHE_MIB,
    DEFAULT_MAX_CONCURRENCY,
    DEFAULT_PREFILL_CHUNK,
    CacheOptions,
    EngineOptions,
    HedgeBudget,
    OptionError,
    parse_hedge_budget,
    resolve_options,
)
from hybridcache.http.server_options import DEFAULT_MAX_TOKENS, ServerOptions
from hybridcache.http.startup_checks import check_bindable, check_model_dir

OPTION_ERROR_EXIT = 2


def _kv_capacity(text: str) -> int | str:
    if text == "auto":
        return text
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("must be 'auto' or a number of 64-token pages") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    server = parser.add_argument_group("server")
    server.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    server.add_argument(
        "--port", type=int, default=8000, help="port to bind; 0 picks a free one (default 8000)"
    )
    server.add_argument(
        "--served-model-name",
        default=None,
        help="model name clients use (default: the checkpoint directory's name)",
    )
    server.add_argument(
        "--api-key", action="append", default=None,
        help="require this bearer key (repeatable; argv is visible to local users: prefer --api-key-file "
        "or HYBRIDCACHE_API_KEY)",
    )
    server.add_argument(
        "--api-key-file", default=None, help="require the keys in this file (one per line, # comments)"
    )
    server.add_argument(
        "--metrics-require-api-key", action="store_true", help="require an API key on /metrics too"
    )
    server.add_argument(
        "--max-waiting", type=int, default=None,
        help="requests that may wait for a lane; more get 429 with Retry-After (default 64 x "
        "--max-concurrency)",
    )
    server.add_argument(
        "--replica-id", default=None,
        help="this server's name in the x-hybridcache-replica response header and /server_info, so a "
        "client behind a router can tell which replica answered (default HOST:PORT; `cluster`: r0, r1...)",
    )
    server.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    server.add_argument(
        "--default-max-tokens",
        type=int,
        default=DEFAULT_MAX_TOKENS,
        help="output cap in tokens for a request that sets no max_tokens (OpenAI) "
        f"(default {DEFAULT_MAX_TOKENS}; never more than the rest of the context)",
    )

    model = parser.add_argument_group("model")
    model.add_argument(
        "--model",
        default=None,
        help="a local Hugging Face checkpoint directory; nothing is downloaded "
        "(default: the embedded tiny checkpoint)",
    )
    model.add_argument(
        "--dtype",
        default="auto",
        choices=["auto", "float32", "bfloat16", "float16"],
        help="weight and KV dtype (default auto: the checkpoint's; on a CPU bf16 only where native)",
    )
    model.add_argument("--device", default="auto", help="auto | cpu | cuda | cuda:N (default auto)")
    model.add_argument(
        "--max-model-len", type=int, default=None, help="context limit in tokens (default: the model's)"
    )

    engine = parser.add_argument_group("engine")
    engine.add_argument(
        "--max-concurrency",
        type=int,
        default=DEFAULT_MAX_CONCURRENCY,
        help=f"concurrent requests (lanes), 1..8 (default {DEFAULT_MAX_CONCURRENCY})",
    )
    engine.add_argument(
        "--prefill-chunk",
        type=int,
        default=None,
        help=f"prefill chunk in tokens, a multiple of 64 (default {CPU_PREFILL_CHUNK} on a CPU, "
        f"{DEFAULT_PREFILL_CHUNK} on a GPU)",
    )
    engine.add_argument(
        "--kv-capacity",
        type=_kv_capacity,
        default="auto",
        help="device KV pages, or auto: size from free memory (default auto)",
    )
    engine.add_argument(
        "--pending-timeout",
        type=float,
        default=600.0,
        help="seconds a request may wait for a lane before failing (default 600)",
    )

    cache = parser.add_argument_group("prefix cache")
    cache.add_argument("--no-prefix-reuse", action="store_true", help="disable the prefix cache")
    cache.add_argument(
        "--host-cache-mib",
        type=int,
        default=None,
        help=f"Host slab tier size in MiB; 0 disables it (default {DEFAULT_HOST_CACHE_MIB})",
    )
    cache.add_argument(
        "--prefix-cache-file", default=None, help="save the Host tier here at stop and restore it at start"
    )
    cache.add_argument("--event-log", default=None, help="append every cache event to this journal")
    cache.add_argument(
        "--cache-dir",
        default=None,
        help="keep the Host tier in this directory, durable as it fills: restored after a stop or a crash "
        "(replaces --prefix-cache-file; implies --host-write through unless given)",
    )
    cache.add_argument(
        "--host-write",
        choices=[mode.value for mode in HostWrite],
        default=None,
        help="when device-only KV blocks are copied to the Host tier: back (when the device needs room; "
        "default) or through (whenever a request releases them)",
    )
    cache.add_argument(
        "--kv-events",
        default=None,
        metavar="tcp://HOST:PORT",
        help="publish which prefixes this replica can resume (KV events for vllm-router's kv_aware "
        "policy) on a ZMQ PUB socket bound here (off by default; needs pyzmq)",
    )
    cache.add_argument(
        "--kv-events-replay",
        default=None,
        metavar="tcp://HOST:PORT",
        help="answer a router's gap replay requests on a ZMQ ROUTER socket bound here "
        "(vllm-router --kv-event-replay-source)",
    )
    cache.add_argument(
        "--device-snapshot-slots",
        type=int,
        default=None,
        help="device snapshot slots D (default C+1 with a Host tier, else C+2)",
    )
    cache.add_argument(
        "--cache-taps-per-request",
        type=int,
        default=None,
        help="new snapshots (taps) per request (default 8 with a Host tier, else 2)",
    )
    cache.add_argument(
        "--cache-tap-ladder",
        type=int,
        default=None,
        help="ladder spacing G in tokens (default max(4096, 2*chunk))",
    )
    cache.add_argument(
        "--cache-tap-min-gap",
        type=int,
        default=None,
        help="minimum gap around ladder taps in tokens (default max(1024, chunk))",
    )
    cache.add_argument(
        "--no-cache-hedges",
        action="store_true",
        help="take no hedge snapshots a few hundred to 2,048 tokens before each prompt end (each costs "
        "one state image of host memory)",
    )
    cache.add_argument(
        "--inexact-resume",
        action="store_true",
        help="also resume from blocks and snapshots that decode steps produced (more reuse before the idle "
        "re-prefill has replaced them; resumed logits then differ from a cold run in the last bits)",
    )
    cache.add_argument(
        "--no-endpoint-refill",
        action="store_true",
        help="do not re-prefill finished requests' generated tokens while idle (that makes their blocks "
        "and a snapshot at their end exact)",
    )
    cache.add_argument(
        "--cache-hedge-budget",
        type=_hedge_budget,
        default="auto",
        metavar="BYTES|auto",
        help="host bytes hedge images may hold together (suffix K, M or G; 0 keeps hedges off the Host "
        "tier; default auto: 1/16 of the Host tier, or 0 when an image is "
        "larger than the KV of 256 tokens)",
    )


def _hedge_budget(text: str) -> HedgeBudget:
    try:
        return parse_hedge_budget(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def engine_options_from_args(args: argparse.Namespace) -> EngineOptions:
    """Map parsed flags to `EngineOptions` (no validation beyond argparse's types)."""
    return EngineOptions(
        model=args.model,
        dtype=args.dtype,
        device=args.device,
        max_concurrency=args.max_concurrency,
        prefill_chunk=args.prefill_chunk,
        kv_capacity=args.kv_capacity,
        max_model_len=args.max_model_len,
        pending_timeout_s=args.pending_timeout,
        cache=CacheOptions(
            prefix_reuse=not args.no_prefix_reuse,
            host_cache_mib=args.host_cache_mib,
            device_snapshot_slots=args.device_snapshot_slots,
            max_new_taps=args.cache_taps_per_request,
            tap_ladder_tokens=args.cache_tap_ladder,
            tap_min_gap_tokens=args.cache_tap_min_gap,
            hedges=not args.no_cache_hedges,
            exact_resume=not args.inexact_resume,
            endpoint_refill=not args.no_endpoint_refill,
            hedge_budget=args.cache_hedge_budget,
            prefix_cache_file=args.prefix_cache_file,
            event_log=args.event_log,
            cache_dir=args.cache_dir,
            host_write=args.host_write,
            kv_events=args.kv_events,
            kv_events_replay=args.kv_events_replay,
        ),
    )


def run(args: argparse.Namespace) -> int:
    """Check every flag, the checkpoint directory and the address first (exit 2 with one line naming the
    flag), then load the model and serve."""
    try:
        options = resolve_options(engine_options_from_args(args))
        server = ServerOptions.from_args(args)
        check_model_dir(options.model)
        check_bindable(server.host, server.port)
    except OptionError as error:
        print(f"hybridcache serve: error: {error}", file=sys.stderr)
        return OPTION_ERROR_EXIT
    from hybridcache.http.lifecycle import serve_forever

    return serve_forever(options, server)
