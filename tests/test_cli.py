"""The command line: every sub-command's help is reachable, unbuilt ones say so, bad flags exit 2."""

import subprocess
import sys

import pytest

from hybridcache.cli import BENCHMARKS, COMMANDS, NOT_IMPLEMENTED_EXIT, main


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "hybridcache", *args], capture_output=True, text=True, timeout=120
    )


def test_top_level_help_lists_every_command():
    result = run_cli("--help")
    assert result.returncode == 0
    for command in COMMANDS:
        assert command.name in result.stdout
    assert "bench" in result.stdout


@pytest.mark.parametrize("name", [command.name for command in COMMANDS])
def test_every_command_has_help(name: str, capsys: pytest.CaptureFixture):
    with pytest.raises(SystemExit) as exited:
        main([name, "--help"])
    assert exited.value.code == 0
    assert "usage: hybridcache " + name in capsys.readouterr().out


@pytest.mark.parametrize("kind", [command.name for command in BENCHMARKS])
def test_every_benchmark_has_help(kind: str, capsys: pytest.CaptureFixture):
    with pytest.raises(SystemExit) as exited:
        main(["bench", kind, "--help"])
    assert exited.value.code == 0
    assert f"usage: hybridcache bench {kind}" in capsys.readouterr().out


UNBUILT = [[command.name] for command in COMMANDS if command.module is None] + [
    ["bench", command.name] for command in BENCHMARKS if command.module is None
]


@pytest.mark.parametrize("words", UNBUILT)
def test_unbuilt_commands_exit_2_and_say_so(words: list[str], capsys: pytest.CaptureFixture):
    assert main([*words, "some-argument"]) == NOT_IMPLEMENTED_EXIT
    assert "not implemented yet" in capsys.readouterr().err


@pytest.mark.parametrize("words", UNBUILT)
def test_unbuilt_commands_say_so_in_their_help(words: list[str], capsys: pytest.CaptureFixture):
    with pytest.raises(SystemExit):
        main([*words, "--help"])
    assert "Not implemented yet" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("flags", "flag_named"),
    [
        (["--no-prefix-reuse", "--cache-taps-per-request", "3"], "--cache-taps-per-request"),
        (["--host-cache-mib", "0", "--prefix-cache-file", "/tmp/x.cache"], "--prefix-cache-file"),
        (["--max-concurrency", "12"], "--max-concurrency"),
        (["--prefix-cache-file", "/"], "--prefix-cache-file"),
        (["--port", "70000"], "--port"),
        (["--kv-events", "udp://127.0.0.1:5557"], "--kv-events"),
        (["--kv-events-replay", "tcp://127.0.0.1:5558"], "--kv-events-replay"),
        (["--no-prefix-reuse", "--kv-events", "tcp://127.0.0.1:5557"], "--kv-events"),
    ],
)
def test_invalid_serve_options_give_one_line_and_exit_2(flags: list[str], flag_named: str):
    result = run_cli("serve", *flags)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert flag_named in lines[0]


@pytest.mark.parametrize(
    ("flags", "flag_named"),
    [
        (["--replicas", "0"], "--replicas"),
        (["--replicas", "2", "--kv-events", "tcp://127.0.0.1:5557"], "--kv-events"),
        (["--replicas", "2", "--session-affinity-ttl", "-1"], "--session-affinity-ttl"),
        (["--replicas", "2", "--replica-id", "r9"], "--replica-id"),
        (["--replicas", "2", "--host-cache-mib", "0", "--prefix-cache-file", "/tmp/x.hcf"],
         "--prefix-cache-file"),
    ],
)
def test_invalid_cluster_options_give_one_line_and_exit_2(flags: list[str], flag_named: str):
    result = run_cli("cluster", *flags)
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert flag_named in lines[0]
