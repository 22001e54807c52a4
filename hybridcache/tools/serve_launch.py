"""Servers for benchmarks to drive over loopback: in this process, or `hybridcache serve` as a child.

- `start_server(directory, args, prefix_reuse)`: an engine behind the aiohttp app on 127.0.0.1 in the
  caller's event loop (what `bench serve` measures; stop it with `runner.cleanup()` then
  `engine.stop()`).
- `ServeProcess.launch(ServeFlags(...))`: the `hybridcache serve` command in a child process on a free
  port, exactly as a user runs it; `url` once it logs that it listens, `stop()` sends SIGTERM (an orderly
  stop) and kills it only if it does not exit in time. A context manager.
"""

from __future__ import annotations

import collections
import re
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import IO, TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    import argparse

    from aiohttp import web

    from hybridcache.core.engine import Engine

MODEL = "bench"
LISTENING = re.compile(r"listening on (http://[0-9.]+:\d+)")
LOG_LINES_KEPT = 40


class LiveServer(NamedTuple):
    engine: Engine
    runner: web.AppRunner
    url: str


async def start_server(directory: Path, args: argparse.Namespace, prefix_reuse: bool) -> LiveServer:
    """An engine behind the app on 127.0.0.1 (a free port), as `serve` runs it. Returns it started.

    Reads `args.dtype`, `args.clients` (lanes) and `args.kv_pages`."""
    from aiohttp import web

    from hybridcache.config import CacheOptions, EngineOptions, resolve_options
    from hybridcache.core.engine import Engine
    from hybridcache.core.frontend import Frontend
    from hybridcache.http.app import create_app
    from hybridcache.http.server_options import ServerOptions

    cache = CacheOptions(host_cache_mib=256) if prefix_reuse else CacheOptions(prefix_reuse=False)
    options = EngineOptions(
        model=str(directory),
        dtype=args.dtype,
        device="cpu",
        max_concurrency=args.clients,
        kv_capacity=args.kv_pages,
        cache=cache,
    )
    engine = Engine(directory, resolve_options(options), model_name=MODEL)
    await engine.start()
    frontend = Frontend.from_dir(directory, engine.max_model_len, engine.tokenizer)
    runner = web.AppRunner(create_app(engine, frontend, ServerOptions(served_model_name=MODEL)))
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    host, port = runner.addresses[0][:2]
    return LiveServer(engine, runner, f"http://{host}:{port}")


class ServeFlags(NamedTuple):
    """What a child `hybridcache serve` is started with (the rest are serve's defaults)."""

    checkpoint: Path
    prefix_reuse: bool = True
    served_model_name: str = MODEL
    max_concurrency: int = 4
    kv_pages: int | None = 1024  # None: serve's own --kv-capacity auto
    host_cache_mib: int | None = None
    extra: tuple[str, ...] = ()

    def command(self) -> list[str]:
        """The child's argv (this Python, port 0 so the kernel picks a free one)."""
        argv = [sys.executable, "-m", "hybridcache", "serve", "--host", "127.0.0.1", "--port", "0",
                "--model", str(self.checkpoint), "--served-model-name", self.served_model_name,
                "--max-concurrency", str(self.max_concurrency)]
        if self.kv_pages is not None:
            argv += ["--kv-capacity", str(self.kv_pages)]
        if not self.prefix_reuse:
            argv.append("--no-prefix-reuse")
        if self.host_cache_mib is not None:
            argv += ["--host-cache-mib", str(self.host_cache_mib)]
        return argv + list(self.extra)


class ServeLaunchError(RuntimeError):
    """The child server exited or stayed silent before it listened; the message ends with its last log."""


class ServeProcess:
    """A running child `hybridcache serve`. Its stderr is drained on a thread (the last lines are kept
    for error messages), so a chatty server never blocks on a full pipe."""

    def __init__(self, process: subprocess.Popen[str], url: str, log: collections.deque[str]) -> None:
        self.process = process
        self.url = url
        self._log = log

    @classmethod
    def launch(cls, flags: ServeFlags, startup_timeout_s: float = 300.0) -> ServeProcess:
        """Start the child and wait until it listens. Raises ServeLaunchError when it exits or does not
        listen within `startup_timeout_s` (the child is killed then)."""
        return cls.launch_argv(flags.command(), startup_timeout_s)

    @classmethod
    def launch_argv(
        cls, argv: list[str], startup_timeout_s: float = 300.0, env: dict[str, str] | None = None
    ) -> ServeProcess:
        """`launch` for a full `hybridcache serve` command line `argv` (it must log its listening URL)."""
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                   stderr=subprocess.PIPE, text=True, env=env)
        log: collections.deque[str] = collections.deque(maxlen=LOG_LINES_KEPT)
        found = threading.Event()
        urls: list[str] = []
        assert process.stderr is not None
        threading.Thread(target=_drain, args=(process.stderr, log, urls, found), daemon=True).start()
        if not found.wait(startup_timeout_s):
            _kill(process)
            raise ServeLaunchError(f"hybridcache serve did not listen within {startup_timeout_s:.0f} s:\n"
                                   + "".join(log))
        if not urls:  # its stderr closed before it listened: it exited
            _kill(process)
            raise ServeLaunchError(f"hybridcache serve exited with {process.returncode}:\n" + "".join(log))
        return cls(process, urls[0], log)

    def recent_log(self) -> str:
        """The last lines the server wrote to stderr."""
        return "".join(self._log)

    def stop(self, timeout_s: float = 60.0) -> int:
        """SIGTERM (the orderly stop), then kill after `timeout_s`. Returns the exit code. Idempotent."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                _kill(self.process)
        return int(self.process.returncode)

    def __enter__(self) -> ServeProcess:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def _drain(stream: IO[str], log: collections.deque[str], urls: list[str], found: threading.Event) -> None:
    for line in stream:
        log.append(line)
        if not found.is_set() and (match := LISTENING.search(line)):
            urls.append(match.group(1))
            found.set()
    found.set()  # end of stream: wake the waiter (it checks the exit code)


def _kill(process: subprocess.Popen[str]) -> None:
    if process.poll() is None:
        process.kill()
    process.wait()
