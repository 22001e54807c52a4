"""`hybridcache serve` as a process: it binds, logs its ledger, answers, and stops on signals."""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator

import pytest

from tests.http.server_process import ServerProcess


@pytest.fixture
def server(micro_checkpoint) -> Iterator[ServerProcess]:
    process = ServerProcess("--model", str(micro_checkpoint), "--served-model-name", "micro")
    yield process
    if process.process.poll() is None:
        process.process.kill()
        process.process.wait()


def test_serve_logs_its_ledger_and_binds(server: ServerProcess):
    ledger = "".join(server.log)
    for row in (
        "max_concurrency",
        "host_tier",
        "device_snapshot_slots",
        "max_new_taps",
        "kv_pages",
        "state_slots",
    ):
        assert row in ledger


def test_the_server_answers_a_completion(server: ServerProcess):
    status, body = server.get("/v1/models")
    assert status == 200 and body["data"][0]["id"] == "micro"
    status, body = server.post("/v1/completions", {"model": "micro", "prompt": "hello", "max_tokens": 4})
    assert status == 200
    assert body["usage"]["completion_tokens"] >= 1


def test_sigterm_stops_cleanly_with_exit_0(server: ServerProcess):
    server.process.send_signal(signal.SIGTERM)
    assert server.wait() == 0
    assert "stopped" in "".join(server.log)


def test_ctrl_c_needs_a_second_press(server: ServerProcess):
    server.process.send_signal(signal.SIGINT)
    time.sleep(0.5)
    assert server.process.poll() is None, "one Ctrl+C must not stop the server"
    status, _ = server.get("/health")
    assert status == 200
    server.process.send_signal(signal.SIGINT)
    assert server.wait() == 0


def test_sigterm_during_a_long_generation_gives_the_client_a_clean_error(server: ServerProcess):
    results: list[tuple[int, dict]] = []
    body = {"model": "micro", "prompt": "count", "max_tokens": 30000, "ignore_eos": True, "temperature": 0}
    client = threading.Thread(target=lambda: results.append(server.post("/v1/completions", body)))
    client.start()
    time.sleep(1.5)
    server.process.send_signal(signal.SIGTERM)
    client.join(timeout=60)
    assert server.wait() == 0
    assert results, "the client got no answer"
    status, answer = results[0]
    assert status == 503
    assert "stopping" in answer["error"]["message"]
