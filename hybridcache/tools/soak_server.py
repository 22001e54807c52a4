"""The server a soak runs against: `hybridcache serve` as a child process with its whole log kept in a
file (the soak counts its error lines), its RSS read from /proc, and an orderly SIGTERM stop.

The child inherits this process's niceness, so a niced bench starts a niced server.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time
from pathlib import Path

LISTENING = re.compile(r"listening on (http://[0-9.]+:\d+)")
ERROR_LINE = re.compile(r"^\d\d:\d\d:\d\d [EC] ")  # the log format's level letter: Error, Critical


class SoakServer:
    """A started child server. `url` once it listens; `stop()` is the orderly stop. A context manager."""

    def __init__(self, argv: list[str], log_path: Path, startup_timeout_s: float = 600.0) -> None:
        self.log_path = log_path
        self._log = open(log_path, "w")  # noqa: SIM115 (kept open for the child's whole life)
        self.process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log, stderr=self._log)
        self.url = self._wait_until_listening(startup_timeout_s)

    def _wait_until_listening(self, timeout_s: float) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if match := LISTENING.search(self.log_path.read_text(errors="replace")):
                return match.group(1)
            if self.process.poll() is not None:
                break
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"hybridcache serve did not start (exit {self.process.returncode}); its log:\n"
                           + self.log_path.read_text(errors="replace")[-4000:])

    def rss_bytes(self) -> int:
        """The server's resident set size now (0 once it has exited). Reads /proc."""
        try:
            status = Path(f"/proc/{self.process.pid}/status").read_text()
        except OSError:
            return 0
        match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
        return int(match.group(1)) * 1024 if match else 0

    def error_lines(self) -> list[str]:
        """The log lines the server wrote at error level (and tracebacks' first lines)."""
        lines = self.log_path.read_text(errors="replace").splitlines()
        return [line for line in lines if ERROR_LINE.match(line) or line.startswith("Traceback")]

    def stop(self, timeout_s: float = 120.0) -> int:
        """SIGTERM, then kill after `timeout_s`. Returns the exit code. Idempotent."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self._log.close()
        return int(self.process.returncode)

    def __enter__(self) -> SoakServer:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def serve_argv(checkpoint: Path, model: str, lanes: int, kv_pages: int, host_cache_mib: int,
               api_key_file: Path) -> list[str]:
    """The child's command line: this Python, a free port, a small device pool and Host tier."""
    return [sys.executable, "-m", "hybridcache", "serve", "--host", "127.0.0.1", "--port", "0",
            "--model", str(checkpoint), "--served-model-name", model, "--max-concurrency", str(lanes),
            "--kv-capacity", str(kv_pages), "--host-cache-mib", str(host_cache_mib),
            "--api-key-file", str(api_key_file)]
