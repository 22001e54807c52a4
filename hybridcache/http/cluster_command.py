"""`hybridcache cluster`: N local `serve` replicas behind one cache-aware router, as one endpoint.

Every `serve` flag is accepted and given to each replica, except the ones the cluster derives per
replica (see `cluster_plan.py`): `--host`/`--port` name the router's address, replica ports follow it,
each replica publishes KV events (`--kv-events`) for vllm-router's `kv_aware` policy, and file flags get
the replica's index. The flags are checked before anything starts. The command prints the router's URL
once every replica and the router answer, and stops them all on Ctrl+C (replicas stop in order, so
each saves its own prefix-cache file).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from hybridcache.config import OptionError, resolve_options
from hybridcache.http import serve_command
from hybridcache.http.cluster_plan import (
    DEFAULT_POLICY,
    DEFAULT_SESSION_AFFINITY_TTL_S,
    ROUTERS,
    ClusterPlan,
    plan_cluster,
)
from hybridcache.http.lifecycle import DEFAULT_MODEL_NAME
from hybridcache.http.server_options import ServerOptions
from hybridcache.http.startup_checks import check_bindable, check_model_dir

OPTION_ERROR_EXIT = 2
STARTUP_ERROR_EXIT = 1
READY_TIMEOUT_S = 600.0
STOP_TIMEOUT_S = 120.0
CLUSTER_ONLY = ("replicas", "router", "policy", "session_affinity_ttl")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    cluster = parser.add_argument_group("cluster")
    cluster.add_argument("--replicas", type=int, required=True, help="number of local serve replicas")
    cluster.add_argument("--router", choices=ROUTERS, default="vllm-router",
                         help="the router in front (default vllm-router)")
    cluster.add_argument("--policy", default=None,
                         help="the router's policy (default: " +
                         ", ".join(f"{name} {policy}" for name, policy in DEFAULT_POLICY.items()) + ")")
    cluster.add_argument("--session-affinity-ttl", type=int, default=DEFAULT_SESSION_AFFINITY_TTL_S,
                         metavar="SECONDS",
                         help="vllm-router kv_aware: keep a session (x-session-id) on its replica until it "
                         f"is idle this long; 0 turns it off (default {DEFAULT_SESSION_AFFINITY_TTL_S})")
    serve_command.add_arguments(parser)


def serve_flags(args: argparse.Namespace) -> list[str]:
    """The `serve` flags given on this command line, as argv words (defaults left out). Pure."""
    parser = argparse.ArgumentParser(add_help=False)
    serve_command.add_arguments(parser)
    words: list[str] = []
    for action in parser._actions:  # the serve parser's own flags, in their declared order
        value = getattr(args, action.dest, action.default)
        if not action.option_strings or value == action.default or action.dest in ("host", "port"):
            continue
        flag = action.option_strings[0]
        if isinstance(action, argparse._StoreTrueAction):
            words.append(flag)
        elif isinstance(value, list):
            for item in value:
                words += [flag, str(item)]
        else:
            words += [flag, str(value)]
    return words


def run(args: argparse.Namespace) -> int:
    try:
        options = resolve_options(serve_command.engine_options_from_args(args))
        check_model_dir(options.model)
        name = args.served_model_name or (Path(options.model).name if options.model else DEFAULT_MODEL_NAME)
        keys = ServerOptions.from_args(args).api_keys
        plan = plan_cluster(args.replicas, args.router, args.policy, args.host, args.port,
                            serve_flags(args), name, api_key=keys[0] if keys else None,
                            session_affinity_ttl_s=args.session_affinity_ttl)
        check_bindable(args.host, args.port)
        for replica in plan.replicas:
            check_bindable(args.host, int(replica.url.rsplit(":", 1)[1]))
    except OptionError as error:
        print(f"hybridcache cluster: error: {error}", file=sys.stderr)
        return OPTION_ERROR_EXIT
    return Cluster(plan).run()


class Cluster:
    """The running processes of a plan; `run()` blocks until Ctrl+C (or a process dies)."""

    def __init__(self, plan: ClusterPlan) -> None:
        self.plan = plan
        self.replicas: list[subprocess.Popen] = []
        self.router: subprocess.Popen | None = None

    def run(self) -> int:
        stop_requested = False

        def on_signal(signum: int, frame: object) -> None:
            nonlocal stop_requested
            stop_requested = True

        previous = {sig: signal.signal(sig, on_signal) for sig in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.replicas = [_start(replica.command) for replica in self.plan.replicas]
            if not self._wait_ready([replica.url for replica in self.plan.replicas], lambda: stop_requested):
                return STARTUP_ERROR_EXIT
            try:
                self.router = _start(self.plan.router_command)
            except OSError as error:
                print(f"hybridcache cluster: cannot start the router: {error} (pip install "
                      "'vllm-router==0.1.17' or 'sglang-router==0.3.2')", file=sys.stderr)
                return STARTUP_ERROR_EXIT
            if not self._wait_ready([self.plan.router_url], lambda: stop_requested):
                return STARTUP_ERROR_EXIT
            print(f"hybridcache cluster: {len(self.replicas)} replicas behind {self.plan.router_url}",
                  flush=True)
            while not stop_requested:
                if self._someone_died():
                    return STARTUP_ERROR_EXIT
                time.sleep(0.5)
            return 0
        finally:
            self._stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _wait_ready(self, urls: list[str], stopping) -> bool:
        deadline = time.monotonic() + READY_TIMEOUT_S
        pending = list(urls)
        while pending and time.monotonic() < deadline and not stopping():
            if self._someone_died():
                return False
            pending = [url for url in pending if not _healthy(url)]
            time.sleep(0.3)
        if pending:
            print(f"hybridcache cluster: not ready: {', '.join(pending)}", file=sys.stderr)
        return not pending

    def _someone_died(self) -> bool:
        for process in [*self.replicas, *([self.router] if self.router else [])]:
            if process.poll() is not None:
                print(f"hybridcache cluster: {' '.join(process.args[:4])}... exited with "
                      f"{process.returncode}; stopping the others", file=sys.stderr)
                return True
        return False

    def _stop_all(self) -> None:
        """The router first (no new requests), then each replica with SIGTERM (`serve`'s orderly stop,
        which saves its cache file; its Ctrl+C asks for a confirmation), waiting for all; a replica that
        outstays the timeout is killed."""
        if self.router is not None and self.router.poll() is None:
            self.router.terminate()
            _wait_or_kill(self.router, 10)
        for process in self.replicas:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.replicas:
            _wait_or_kill(process, STOP_TIMEOUT_S)


def _start(command: list[str]) -> subprocess.Popen:
    # Each child gets its own process group: the terminal's Ctrl+C reaches this command only, which then
    # stops the router before the replicas (a replica stopped first would fail requests in flight).
    return subprocess.Popen(command, start_new_session=True, env=os.environ.copy())


def _wait_or_kill(process: subprocess.Popen, timeout_s: float) -> None:
    try:
        process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False
