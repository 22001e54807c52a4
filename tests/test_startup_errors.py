"""Start-up errors: one line naming the flag or resource and what to do, exit code 2, within 5 s — so
before any model loads — and before any file is changed."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

STARTUP_LIMIT_S = 5  # loading even the tiny model takes longer than this on a shared CPU


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hybridcache", *args],
        capture_output=True,
        text=True,
        timeout=STARTUP_LIMIT_S,
        cwd=cwd,
        env=_env_with_this_checkout(),
    )


def _env_with_this_checkout() -> dict[str, str]:
    """The environment with this checkout first on the path (the test may run from another directory)."""
    root = str(Path(__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}


def assert_one_line_error(result: subprocess.CompletedProcess, *fragments: str) -> str:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    for fragment in fragments:
        assert fragment in lines[0]
    assert "effective options" not in result.stderr  # the settings printout comes after the checks
    return lines[0]


@pytest.fixture
def busy_port() -> Iterator[int]:
    """A port another process is listening on."""
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        yield listener.getsockname()[1]


def test_a_port_in_use_is_reported_before_the_model_loads_and_before_any_file_is_written(
    busy_port: int, tmp_path: Path
):
    log = tmp_path / "events.log"
    line = assert_one_line_error(
        run_cli("serve", "--port", str(busy_port), "--event-log", str(log)), "--port", "in use"
    )
    assert str(busy_port) in line and "--port N" in line
    assert list(tmp_path.iterdir()) == []


def test_an_unresolvable_host_names_host():
    assert_one_line_error(run_cli("serve", "--host", "no-such-host.invalid"), "--host")


def test_a_missing_model_path_names_model_and_says_nothing_is_downloaded(tmp_path: Path):
    assert_one_line_error(
        run_cli("serve", "--model", str(tmp_path / "missing")), "--model", "nothing is downloaded"
    )


def test_a_hub_id_names_model_and_says_how_to_download_it(tmp_path: Path):
    line = assert_one_line_error(
        run_cli("serve", "--model", "Qwen/Qwen3.5-27B", cwd=tmp_path), "--model", "downloads nothing"
    )
    assert "huggingface-cli download Qwen/Qwen3.5-27B" in line


def test_a_directory_without_config_json_names_model(tmp_path: Path):
    assert_one_line_error(run_cli("serve", "--model", str(tmp_path)), "--model", "config.json")


def test_a_directory_without_weights_names_model(tmp_path: Path):
    (tmp_path / "config.json").write_text("{}")
    assert_one_line_error(run_cli("serve", "--model", str(tmp_path)), "--model", "safetensors")


def test_flags_are_never_abbreviated_and_the_full_flag_is_suggested(tmp_path: Path):
    target = tmp_path / "x.cache"
    line = assert_one_line_error(
        run_cli("serve", "--prefix-cache", str(target)), "--prefix-cache", "did you mean --prefix-cache-file"
    )
    assert line.startswith("hybridcache serve: error:")
    assert not target.exists()


def test_a_flag_before_the_sub_command_gets_a_hint():
    assert_one_line_error(
        run_cli("--port", "8001", "serve"),
        "put options after the sub-command: hybridcache serve --port 8001",
    )


def test_a_flag_before_a_benchmark_keeps_the_benchmark_in_the_hint():
    assert_one_line_error(
        run_cli("--preset", "tiny", "bench", "serve"), "hybridcache bench serve --preset tiny"
    )


@pytest.mark.parametrize(
    "flags",
    [["--default-max-tokens", "0"], ["--port", "-1"], ["--prefill-chunk", "100"]],
)
def test_bad_values_name_their_flag(flags: list[str]):
    assert_one_line_error(run_cli("serve", *flags), flags[0])
