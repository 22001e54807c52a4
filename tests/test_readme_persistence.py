"""The README's "Persistence in five commands" runs as written: serve with a cache file and an event log,
ask twice, stop, inspect, replay, restart, ask again and see the reuse survive the restart.

The commands are read from the README. What the test changes, and only that: `.venv/bin/hybridcache`
becomes this interpreter's `-m hybridcache`, the /tmp paths move into the test's directory, the server
listens on a free port (`--port 0`, and the curl command follows it), and the embedded `tiny` checkpoint
is the session's (XDG_CACHE_HOME points at it). `&` starts a server in the background and `kill %1`
stops it with SIGTERM, as a shell would.
"""

from __future__ import annotations

import ast
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hybridcache.tools.make_tiny_model import preset_dir

README = Path(__file__).resolve().parents[1] / "README.md"
SECTION = "## Persistence in five commands"
COMMAND_LIMIT_S = 30
LISTENING = re.compile(r"listening on http://127\.0\.0\.1:(\d+)")


def section_commands() -> list[str]:
    """The shell commands of the section's first ```sh block, continuation lines joined."""
    text = README.read_text()
    block = text[text.index(SECTION):].split("```sh\n", 1)[1].split("```", 1)[0]
    commands, current = [], ""
    for line in block.splitlines():
        if not current and (not line.strip() or line.lstrip().startswith("#")):
            continue
        current += line + "\n"
        if not line.endswith("\\") and current.count("'") % 2 == 0:  # not inside a quoted argument
            commands.append(current.strip())
            current = ""
    return commands


class Shell:
    """Runs the section's commands the way a user's shell would, with the substitutions above."""

    def __init__(self, tmp_path: Path, cache_home: Path) -> None:
        self.tmp_path = tmp_path
        path = os.pathsep.join(filter(None, [str(README.parent), os.environ.get("PYTHONPATH")]))
        self.env = {**os.environ, "XDG_CACHE_HOME": str(cache_home), "PYTHONPATH": path}
        self.server: subprocess.Popen | None = None
        self.port = 0
        self.logs: list[str] = []

    def rewrite(self, command: str) -> str:
        command = command.replace(".venv/bin/hybridcache", f"{sys.executable} -m hybridcache")
        command = command.replace("/tmp/demo", str(self.tmp_path / "demo"))
        return command.replace("127.0.0.1:8000", f"127.0.0.1:{self.port}")

    def run(self, command: str) -> str:
        """Run one command; returns what it printed (a background server's start-up log)."""
        if command == "kill %1":
            return self.stop()
        text = self.rewrite(command)
        if text.endswith("&"):
            return self.start(text.rstrip("&").strip() + " --port 0")
        result = subprocess.run(["sh", "-c", text], capture_output=True, text=True, env=self.env,
                                timeout=COMMAND_LIMIT_S)
        assert result.returncode == 0, f"{command}\n{result.stderr}"
        return result.stdout

    def start(self, text: str) -> str:
        assert self.server is None, "one background server at a time"
        self.server = subprocess.Popen(["sh", "-c", f"exec {text}"], stderr=subprocess.PIPE, text=True,
                                       env=self.env)
        assert self.server.stderr is not None
        deadline, log = time.monotonic() + 60, []
        while time.monotonic() < deadline:
            line = self.server.stderr.readline()
            if not line:
                break
            log.append(line)
            if found := LISTENING.search(line):
                self.port = int(found.group(1))
                return "".join(log)
        raise AssertionError("the server never listened:\n" + "".join(log))

    def stop(self) -> str:
        assert self.server is not None
        self.server.send_signal(signal.SIGTERM)
        assert self.server.wait(timeout=COMMAND_LIMIT_S) == 0
        assert self.server.stderr is not None
        log = self.server.stderr.read()
        self.server = None
        return log

    def close(self) -> None:
        if self.server is not None:
            self.server.kill()
            self.server.wait()


def cached_tokens(output: str) -> int:
    """cached_tokens of the usage dict the ask command prints."""
    return ast.literal_eval(output.strip())["prompt_tokens_details"]["cached_tokens"]


def test_the_readme_persistence_section_runs_as_written(
    tiny_checkpoint: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    cache_home = tmp_path / "xdg"
    monkeypatch.setenv("XDG_CACHE_HOME", str(cache_home))
    embedded = preset_dir("tiny")  # where `serve` without --model looks for the embedded checkpoint
    embedded.parent.mkdir(parents=True)
    embedded.symlink_to(tiny_checkpoint, target_is_directory=True)
    serve, ask, stop, inspect, replay, restart = section_commands()
    assert "--prefix-cache-file" in serve and serve == restart and stop == "kill %1"
    shell = Shell(tmp_path, cache_home)
    try:
        assert "no prefix-cache file yet" in shell.run(serve)
        first, second = cached_tokens(shell.run(ask)), cached_tokens(shell.run(ask))
        assert first == 0 and second > 0
        assert "prefix cache saved" in shell.run(stop)
        assert "snapshots" in shell.run(inspect)
        assert "checkpoints proved" in shell.run(replay)
        assert "prefix cache restored" in shell.run(restart)
        assert cached_tokens(shell.run(ask)) == second  # the reuse survived the restart
        shell.stop()
    finally:
        shell.close()
