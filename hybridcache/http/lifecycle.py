"""Process lifecycle of `hybridcache serve`: startup ledger, bind, signals, orderly stop."""

from __future__ import annotations

import asyncio
import os
import signal
import time

from aiohttp import web

from hybridcache import __version__
from hybridcache.config import EffectiveOptions
from hybridcache.http.app import MODEL_RUNTIME_MISSING, create_app
from hybridcache.http.server_options import ServerOptions
from hybridcache.http.stop_control import StopAction, StopControl
from hybridcache.logs import format_bytes, get_logger, log_ledger, setup_logging

log = get_logger(__name__)
EXIT_AT_ONCE_CODE = 130


def startup_ledger(options: EffectiveOptions, server: ServerOptions) -> list[tuple[str, object]]:
    """The rows of the startup ledger: every effective option that shapes serving."""
    cache = options.cache
    return [
        ("version", __version__),
        ("model", options.model or "embedded tiny checkpoint"),
        ("dtype", options.dtype),
        ("device", options.device),
        ("max_concurrency", options.max_concurrency),
        ("prefill_chunk", options.prefill_chunk),
        ("kv_capacity", options.kv_capacity),
        ("max_model_len", options.max_model_len or "model's own"),
        ("prefix_reuse", cache.prefix_reuse),
        ("host_tier", format_bytes(cache.host_cache_bytes) if cache.host_tier else "off"),
        ("device_snapshot_slots", cache.device_snapshot_slots),
        ("max_new_taps", cache.max_new_taps),
        ("tap_ladder_tokens", cache.tap_ladder_tokens),
        ("tap_min_gap_tokens", cache.tap_min_gap_tokens),
        ("prefix_cache_file", cache.prefix_cache_file or "none"),
        ("event_log", cache.event_log or "none"),
        ("api_keys", len(server.api_keys)),
    ]


def serve_forever(options: EffectiveOptions, server: ServerOptions) -> int:
    """Run the server until an orderly stop; returns the process exit code."""
    setup_logging(server.log_level)
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a dependency; stay usable without it
        log.warning("uvloop not available; using the default asyncio loop")
    return asyncio.run(_serve(options, server))


async def _serve(options: EffectiveOptions, server: ServerOptions) -> int:
    log_ledger(log, "hybridcache serve: effective options", startup_ledger(options, server))
    log.warning("%s: model endpoints answer 503 until the engine lands", MODEL_RUNTIME_MISSING)
    app = create_app(server.max_body_bytes)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, server.host, server.port)
    await site.start()
    bound_port = runner.addresses[0][1] if runner.addresses else server.port
    log.info("listening on http://%s:%d", server.host, bound_port)

    stop = asyncio.Event()
    control = StopControl()
    loop = asyncio.get_running_loop()

    def on_signal(signum: int) -> None:
        action = (
            control.on_terminate() if signum == signal.SIGTERM else control.on_interrupt(time.monotonic())
        )
        if action is StopAction.STOP:
            log.info("stopping: no new requests; answering running ones")
            stop.set()
        elif action is StopAction.EXIT_NOW:
            log.warning("second interrupt while stopping: exiting at once")
            os._exit(EXIT_AT_ONCE_CODE)
        elif signum == signal.SIGINT:
            log.info("press Ctrl+C again within 5 s to stop the server")

    loop.add_signal_handler(signal.SIGTERM, on_signal, signal.SIGTERM)
    loop.add_signal_handler(signal.SIGINT, on_signal, signal.SIGINT)
    try:
        await stop.wait()
    finally:
        await runner.cleanup()
        log.info("stopped")
    return 0
