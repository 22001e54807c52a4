"""`hybridcache serve` as a process: it binds, logs its ledger, answers, and stops on signals."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest

LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")


class ServerProcess:
    def __init__(self, *flags: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "hybridcache", "serve", "--port", "0", *flags],
            stderr=subprocess.PIPE,
            text=True,
        )
        self.log: list[str] = []
        self.port = self._wait_for_port()

    def _wait_for_port(self, timeout_s: float = 60.0) -> int:
        deadline = time.monotonic() + timeout_s
        assert self.process.stderr is not None
        while time.monotonic() < deadline:
            line = self.process.stderr.readline()
            if not line:
                break
            self.log.append(line)
            if found := LISTENING.search(line):
                return int(found.group(1))
        self.process.kill()
        raise AssertionError("server never said it was listening:\n" + "".join(self.log))

    def get(self, path: str) -> tuple[int, dict]:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=10) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as error:
            return error.code, json.load(error)

    def wait(self, timeout_s: float = 30.0) -> int:
        code = self.process.wait(timeout=timeout_s)
        assert self.process.stderr is not None
        self.log.extend(self.process.stderr.readlines())
        return code


@pytest.fixture
def server() -> Iterator[ServerProcess]:
    process = ServerProcess()
    yield process
    if process.process.poll() is None:
        process.process.kill()
        process.process.wait()


def test_serve_logs_its_ledger_and_binds(server: ServerProcess):
    ledger = "".join(server.log)
    for row in ("max_concurrency", "host_tier", "device_snapshot_slots", "max_new_taps", "tap_ladder_tokens"):
        assert row in ledger


def test_model_endpoints_say_the_runtime_is_missing(server: ServerProcess):
    status, body = server.get("/v1/models")
    assert status == 503
    assert "model runtime not built yet" in body["error"]["message"]


def test_sigterm_stops_cleanly_with_exit_0(server: ServerProcess):
    server.process.send_signal(signal.SIGTERM)
    assert server.wait() == 0
    assert "stopped" in "".join(server.log)


def test_ctrl_c_needs_a_second_press(server: ServerProcess):
    server.process.send_signal(signal.SIGINT)
    time.sleep(0.5)
    assert server.process.poll() is None, "one Ctrl+C must not stop the server"
    status, _ = server.get("/health")
    assert status == 503
    server.process.send_signal(signal.SIGINT)
    assert server.wait() == 0
