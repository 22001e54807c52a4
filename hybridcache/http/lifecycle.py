"""Process lifecycle of `hybridcache serve`: model, engine, startup ledger, bind, signals, orderly stop.

Stop (spec §5.5): SIGTERM or a confirmed Ctrl+C (a second press within 5 s) stops accepting new
connections, fails running and queued requests as unavailable at the next unit boundary (their clients
get a clean error), then runs the engine's orderly stop. One more Ctrl+C exits at once.
"""

from __future__ import annotations

import asyncio
import os
import signal
import threading
import time
from pathlib import Path

from aiohttp import web

from hybridcache import __version__
from hybridcache.config import EffectiveCacheOptions, EffectiveOptions, OptionError
from hybridcache.http.app import create_app
from hybridcache.http.server_options import ServerOptions
from hybridcache.http.startup_checks import bind_error
from hybridcache.http.stop_control import StopAction, StopControl
from hybridcache.logs import format_bytes, get_logger, log_ledger, setup_logging

log = get_logger(__name__)
EXIT_AT_ONCE_CODE = 130
ABANDON_WAIT_S = 2.0
STARTUP_ERROR_EXIT = 2
DEFAULT_MODEL_NAME = "tiny"  # the embedded checkpoint's served name


def startup_ledger(options: EffectiveOptions, server: ServerOptions) -> list[tuple[str, object]]:
    """The rows of the startup ledger: every effective option that shapes serving."""
    cache = options.cache
    return [
        ("version", __version__),
        ("model", options.model or "embedded tiny checkpoint"),
        ("max_concurrency", options.max_concurrency),
        ("prefill_chunk", options.prefill_chunk),
        ("kv_capacity", options.kv_capacity),
        ("prefix_reuse", cache.prefix_reuse),
        ("host_tier", format_bytes(cache.host_cache_bytes) if cache.host_tier else "off"),
        ("device_snapshot_slots", cache.device_snapshot_slots),
        ("max_new_taps", cache.max_new_taps),
        ("tap_ladder_tokens", cache.tap_ladder_tokens),
        ("tap_min_gap_tokens", cache.tap_min_gap_tokens),
        ("hedges", _hedges_row(cache)),
        ("prefix_cache_file", cache.prefix_cache_file or "none"),
        ("event_log", cache.event_log or "none"),
        ("cache_dir", cache.cache_dir or "none"),
        ("host_write", cache.host_write if cache.host_tier else "off"),
        ("api_keys", len(server.api_keys)),
        ("default_max_tokens", server.default_max_tokens),
    ]


def _hedges_row(cache: EffectiveCacheOptions) -> str:
    """The ledger's hedge row: off, or the host budget of hedge images (auto is sized by the engine)."""
    if not cache.prefix_reuse or not cache.hedges:
        return "off"
    if cache.hedge_budget == "auto":
        return "on, host budget auto (1/16 of the Host tier; 0 when an image outweighs the KV of 256 " \
            "tokens)"
    return f"on, host budget {format_bytes(cache.hedge_budget)}"


def _exit_after_save(save_finished: threading.Event) -> None:
    """Give an abandoned save up to 2 s to remove its temporary file, then exit at once."""
    save_finished.wait(ABANDON_WAIT_S)
    os._exit(EXIT_AT_ONCE_CODE)


def serve_forever(options: EffectiveOptions, server: ServerOptions) -> int:
    """Run the server until an orderly stop; returns the process exit code."""
    setup_logging(server.log_level)
    try:
        import uvloop

        uvloop.install()
    except ImportError:  # pragma: no cover - uvloop is a dependency; stay usable without it
        log.warning("uvloop not available; using the default asyncio loop")
    return asyncio.run(_serve(options, server))


def _model_dir(options: EffectiveOptions) -> Path:
    if options.model is not None:
        return Path(options.model)
    from hybridcache.tools.make_tiny_model import default_model_dir, ensure_default_model

    if not default_model_dir().is_dir():
        log.info("building the embedded tiny checkpoint into %s (once, about 10 s)", default_model_dir())
    return ensure_default_model()


async def _serve(options: EffectiveOptions, server: ServerOptions) -> int:
    from hybridcache.core.engine import Engine
    from hybridcache.core.frontend import Frontend
    from hybridcache.core.tokenizer import FrontendError
    from hybridcache.gpu.model import CheckpointError
    from hybridcache.gpu.openmp_threads import serial_torch_in_this_thread

    # This thread runs the event loop; the model runs on the engine's compute thread. Whatever tensor work
    # lands here (restoring a cache file) must not start a second OpenMP team (see there).
    serial_torch_in_this_thread()
    log_ledger(log, "hybridcache serve: effective options", startup_ledger(options, server))
    try:
        model_dir = _model_dir(options)
        name = server.served_model_name or (None if options.model else DEFAULT_MODEL_NAME)
        engine = Engine(model_dir, options, model_name=name)
        frontend = Frontend.from_dir(model_dir, engine.max_model_len, engine.tokenizer)
    except (CheckpointError, FrontendError) as error:
        log.error("cannot start: %s%s", "--model: " if options.model else "", error)
        return STARTUP_ERROR_EXIT
    except (OptionError, MemoryError) as error:
        log.error("cannot start: %s", error)
        return STARTUP_ERROR_EXIT
    log_ledger(log, f"model {engine.model_name} from {model_dir}", engine.runtime.ledger())
    await engine.start()
    app = create_app(engine, frontend, server)
    runner = web.AppRunner(app, handle_signals=False, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, server.host, server.port)
    try:
        await site.start()
    except OSError as error:  # the port was free when checked before loading, and taken since
        log.error("cannot start: %s", bind_error(server.host, server.port, error))
        await engine.stop()
        await runner.cleanup()
        return STARTUP_ERROR_EXIT

    stop = asyncio.Event()
    control = StopControl()

    def on_signal(signum: int) -> None:
        action = (
            control.on_terminate() if signum == signal.SIGTERM else control.on_interrupt(time.monotonic())
        )
        if action is StopAction.STOP:
            log.info("stopping: no new requests; failing running and queued ones as unavailable")
            stop.set()
        elif action is StopAction.EXIT_NOW:
            log.warning("interrupt while stopping: abandoning any save in progress and exiting")
            engine.abandon_save.set()  # the save stops before its next slab and removes its temp file
            threading.Thread(target=_exit_after_save, args=(engine.save_finished,), daemon=True).start()
        elif signum == signal.SIGINT:
            log.info("press Ctrl+C again within 5 s to stop the server")

    loop = asyncio.get_running_loop()
    loop.add_signal_handler(signal.SIGTERM, on_signal, signal.SIGTERM)
    loop.add_signal_handler(signal.SIGINT, on_signal, signal.SIGINT)
    bound_port = runner.addresses[0][1] if runner.addresses else server.port
    log.info("listening on http://%s:%d", server.host, bound_port)
    try:
        await stop.wait()
        await site.stop()  # no new connections
        await engine.stop()  # running requests end with "unavailable"; transfers drain
    finally:
        await runner.cleanup()
        log.info("stopped")
    return 0
