"""`hybridcache serve` as a child process on a free port, for tests that need the real command."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import urllib.error
import urllib.request

LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")


class ServerProcess:
    def __init__(self, *flags: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-m", "hybridcache", "serve", "--port", "0", "--kv-capacity", "512", *flags],
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

    def post(self, path: str, body: dict, timeout: float = 60) -> tuple[int, dict]:
        data = json.dumps(body).encode()
        request = urllib.request.Request(
            f"http://127.0.0.1:{self.port}{path}", data, {"Content-Type": "application/json"}
        )
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                return response.status, json.load(response)
        except urllib.error.HTTPError as error:
            return error.code, json.load(error)

    def wait(self, timeout_s: float = 30.0) -> int:
        code = self.process.wait(timeout=timeout_s)
        assert self.process.stderr is not None
        self.log.extend(self.process.stderr.readlines())
        return code

    def stop(self) -> None:
        """Kill the server if it still runs (fixture teardown)."""
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait()

    @property
    def root(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def get_text(self, path: str) -> str:
        with urllib.request.urlopen(self.root + path, timeout=10) as response:
            return response.read().decode()
