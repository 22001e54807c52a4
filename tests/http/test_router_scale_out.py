"""Two `tiny` replicas behind real routers on loopback, as `hybridcache cluster` starts them.

vllm-router `kv_aware` routes by the KV events each replica publishes (`--kv-events`): four long
prefixes sent at once land on both replicas; every follow-up goes to the replica that holds its prefix
(its `cached_tokens` says so); after a replica's cache is flushed (POST /flush_cache, which publishes
AllBlocksCleared), the router follows the events to where the prefix lives now; killing a replica moves
its traffic to the other with no 5xx once the router has noticed. sglang-router `cache_aware` (its own
tree of request text, through /server_info and the OpenAI endpoints) gives the same prefix affinity.

Skipped, saying why, only where a router wheel (x86-64 Linux) or pyzmq is not installed.
"""

from __future__ import annotations

import json
import random
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from hybridcache.http.cluster_plan import Replica, plan_cluster, router_command, router_executable

pytest.importorskip("zmq", reason="pyzmq is not installed (pip install -e '.[test]')")
for _router in ("vllm-router", "sglang-router"):
    if not Path(router_executable(_router)).exists():
        pytest.skip(f"{_router} is not installed: its wheel exists for x86-64 Linux only "
                    f"(pip install -e '.[test]' installs it there)", allow_module_level=True)

MODEL = "tiny"
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda",
         "sigma", "tau", "omega"]
READY_TIMEOUT_S = 60.0
RESUMED_AT_LEAST = 192  # the system prompts are ~250 tokens: at least three whole blocks resume


def free_port_block(size: int) -> int:
    """A base port with `size` consecutive free ports above it (probed, then released)."""
    for _ in range(50):
        base = random.randrange(20000, 60000 - size)
        sockets = []
        try:
            for port in range(base, base + size):
                probe = socket.socket()
                sockets.append(probe)
                probe.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for probe in sockets:
                probe.close()
    raise RuntimeError("no block of free ports")


def post(url: str, body: dict, timeout: float = 60) -> tuple[int, dict | str]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return response.status, json.load(response)
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode(errors="replace")


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as response:
        return json.load(response)


def healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url + "/health", timeout=2) as response:
            return response.status == 200
    except (urllib.error.URLError, OSError):
        return False


def wait_healthy(urls: list[str], processes: list[subprocess.Popen]) -> None:
    deadline = time.monotonic() + READY_TIMEOUT_S
    pending = list(urls)
    while pending:
        assert time.monotonic() < deadline, f"not ready: {pending}"
        assert all(p.poll() is None for p in processes), "a process exited while starting"
        pending = [url for url in pending if not healthy(url)]
        time.sleep(0.2)


def system_prompt(seed: int) -> str:
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(230))


def chat_body(seed: int, turn: int) -> dict:
    messages = [{"role": "system", "content": system_prompt(seed)},
                {"role": "user", "content": f"question number {turn}"}]
    return {"model": MODEL, "messages": messages, "max_tokens": 1, "temperature": 0}


def cached_tokens(answer: dict) -> int:
    return answer["usage"]["prompt_tokens_details"]["cached_tokens"]


class Replicas:
    """The replica processes of a plan; `served(...)` tells which replica answered a request."""

    def __init__(self, planned: list[Replica], logs: Path) -> None:
        self.planned = planned
        self.logs = logs
        self.processes = [self._start(replica) for replica in planned]

    def _start(self, replica: Replica) -> subprocess.Popen:
        log = open(self.logs / f"replica{replica.index}.log", "ab")  # noqa: SIM115 - closed with the process
        return subprocess.Popen(replica.command, stdout=log, stderr=log, start_new_session=True)

    def stop(self, index: int, sig: int) -> None:
        process = self.processes[index]
        process.send_signal(sig)
        process.wait(timeout=30)

    def queries(self) -> list[int]:
        return [get_json(r.url + "/v1/cache/stats")["prefix_cache_query_requests"]
                if self.processes[r.index].poll() is None else -1 for r in self.planned]

    def served(self, send):
        """(replica index, answer) of one request sent by `send()`, told by the replicas' counters."""
        before = self.queries()
        status, answer = send()
        assert status == 200, answer
        after = self.queries()
        [index] = [i for i, (b, a) in enumerate(zip(before, after)) if a == b + 1]
        return index, answer

    def close(self) -> None:
        for process in self.processes:
            if process.poll() is None:
                process.kill()
                process.wait()


@pytest.fixture
def cluster(tiny_checkpoint: Path, tmp_path: Path):
    base = free_port_block(10)
    serve_flags = ["--model", str(tiny_checkpoint), "--served-model-name", MODEL, "--kv-capacity", "256",
                   "--max-concurrency", "2", "--host-cache-mib", "32", "--log-level", "warning"]
    plan = plan_cluster(2, "vllm-router", None, "127.0.0.1", base, serve_flags, MODEL)
    replicas = Replicas(plan.replicas, tmp_path)
    sglang_url = f"http://127.0.0.1:{base + 8}"
    routers: list[subprocess.Popen] = []
    try:
        wait_healthy([r.url for r in plan.replicas], replicas.processes)
        with open(tmp_path / "routers.log", "ab") as log:
            routers.append(subprocess.Popen(plan.router_command, stdout=log, stderr=log))
            sglang = router_command("sglang-router", "cache_aware", "127.0.0.1", base + 8, plan.replicas,
                                    MODEL, metrics_port=base + 9)
            routers.append(subprocess.Popen(sglang, stdout=log, stderr=log))
        wait_healthy([plan.router_url, sglang_url], routers)
        yield replicas, plan.router_url, sglang_url
    finally:
        for router in routers:
            router.kill()
            router.wait()
        replicas.close()


def check_prefix_affinity(replicas: Replicas, router_url: str, seeds: list[int]) -> dict[int, int]:
    """Send the prefixes at once, then two follow-ups each: the prefixes land on both replicas and every
    follow-up resumes on the replica that holds its prefix. Returns each prefix's replica."""
    before = replicas.queries()
    with ThreadPoolExecutor(len(seeds)) as pool:
        first = list(pool.map(lambda seed: post(router_url + "/v1/chat/completions", chat_body(seed, 0)),
                              seeds))
    assert [status for status, _ in first] == [200] * len(seeds), first
    landed = [after - b for b, after in zip(before, replicas.queries())]
    assert sum(landed) == len(seeds) and all(landed), f"the prefixes did not spread: {landed}"
    time.sleep(0.3)  # the events reach the router
    holder: dict[int, int] = {}
    for seed in seeds:
        for turn in (1, 2):
            index, answer = replicas.served(
                lambda seed=seed, turn=turn: post(router_url + "/v1/chat/completions", chat_body(seed, turn)))
            assert cached_tokens(answer) >= RESUMED_AT_LEAST, (seed, turn, answer["usage"])
            assert holder.setdefault(seed, index) == index
    return holder


def test_routers_send_each_follow_up_to_the_replica_holding_its_prefix(cluster):
    replicas, vllm_url, sglang_url = cluster

    # sglang-router cache_aware: affinity from its own tree of request text.
    check_prefix_affinity(replicas, sglang_url, [101, 102, 103, 104])

    # vllm-router kv_aware: affinity from the replicas' KV events.
    holder = check_prefix_affinity(replicas, vllm_url, [1, 2, 3, 4])

    # Flush replica 0's cache. Warm one of its prefixes on replica 1 directly: a router that follows
    # the events now credits replica 1 alone and sends it there; one that missed the clear would see a
    # tie with the emptied replica.
    moved = next(seed for seed, index in holder.items() if index == 0)
    status, flushed = post(replicas.planned[0].url + "/flush_cache", {})
    assert status == 200 and flushed["flushed_subtrees"] >= 1, flushed
    status, _ = post(replicas.planned[1].url + "/v1/chat/completions", chat_body(moved, 3))
    assert status == 200
    time.sleep(1.0)
    for turn in (4, 5):
        index, answer = replicas.served(
            lambda turn=turn: post(vllm_url + "/v1/chat/completions", chat_body(moved, turn)))
        assert (index, cached_tokens(answer) >= RESUMED_AT_LEAST) == (1, True), answer["usage"]

    # Kill replica 1: once the router's health check has noticed, everything goes to replica 0, no 5xx.
    replicas.stop(1, signal.SIGKILL)
    time.sleep(3.5)  # two health-check intervals
    statuses = []
    for seed in holder:
        index, _ = replicas.served(
            lambda seed=seed: post(vllm_url + "/v1/chat/completions", chat_body(seed, 6)))
        statuses.append(index)
    assert statuses == [0] * len(holder)
