"""What `hybridcache cluster` starts: N `serve` replicas on derived ports and one router in front.

Pure: the plan is argument lists and URLs, nothing runs here. Ports follow the router's: with the router
on PORT, replica i (0-based) serves HTTP on PORT+1+i, publishes KV events on PORT+1+N+i and answers
replays on PORT+1+2N+i; the router's own Prometheus exporter listens on PORT+1+3N (both routers open
one, on the same default port). Replica i is named ``r{i}`` (`--replica-id`, echoed in every response's
``x-hybridcache-replica`` header). When the replicas require an API key, the router gets the first one
(`--api-key`: both routers send it to their workers, the render calls kv_aware makes included).
vllm-router's `kv_aware` gets session affinity (`--kv-aware-session-affinity-ttl-secs`, the
`session_affinity_ttl_s` given, 0 for none): a request naming its session (`x-session-id`, as agent
clients send) goes back to the replica that served the session's last request; without it, the router
adds the tokens each replica is still prefilling to its cost, and a long conversation whose follow-up
costs less than another conversation's running prefill is sent to the replica without its prefix, where
it is recomputed whole. A request without a session is routed by prefix and load as before.
A file flag (`--prefix-cache-file`, `--event-log`) gets the replica's index
before its extension (``cache.hcf`` -> ``cache.r0.hcf``), so two replicas never write the same file.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path
from typing import NamedTuple

from hybridcache.cache.ids import BLOCK_TOKENS
from hybridcache.config import OptionError

ROUTERS = ("vllm-router", "sglang-router")
DEFAULT_POLICY = {"vllm-router": "kv_aware", "sglang-router": "cache_aware"}
PER_REPLICA_FILE_FLAGS = ("--prefix-cache-file", "--event-log")
DERIVED_FLAGS = ("--port", "--host", "--kv-events", "--kv-events-replay", "--replica-id")
HEALTH_CHECK_INTERVAL_S = 2
DEFAULT_SESSION_AFFINITY_TTL_S = 1800  # a conversation idle longer is routed afresh (by prefix and load)


class Replica(NamedTuple):
    index: int
    url: str
    kv_events: str
    kv_events_replay: str
    command: list[str]


class ClusterPlan(NamedTuple):
    replicas: list[Replica]
    router_url: str
    router_command: list[str]


def replica_file(path: str, index: int) -> str:
    """``path`` with ``.r{index}`` before its extension. Pure."""
    file = Path(path)
    return str(file.with_name(f"{file.stem}.r{index}{file.suffix}"))


def plan_cluster(replicas: int, router: str, policy: str | None, host: str, port: int,
                 serve_flags: list[str], model_name: str, api_key: str | None = None,
                 session_affinity_ttl_s: int = DEFAULT_SESSION_AFFINITY_TTL_S) -> ClusterPlan:
    """The replicas' and the router's command lines. Raises OptionError for a flag the cluster derives
    itself, a replica count below 1, or a port range past 65535."""
    if replicas < 1:
        raise OptionError("--replicas", f"must be >= 1, got {replicas}")
    if not 0 <= session_affinity_ttl_s <= 31536000:
        raise OptionError("--session-affinity-ttl", "must be 0 (off) to 31536000 seconds")
    if router not in ROUTERS:
        raise OptionError("--router", f"must be one of {', '.join(ROUTERS)}, got {router!r}")
    if port + 1 + 3 * replicas > 65535:
        raise OptionError("--port", f"{port} leaves no room for {replicas} replicas' derived ports")
    for flag in serve_flags:
        if flag.split("=", 1)[0] in DERIVED_FLAGS:
            raise OptionError(flag.split("=", 1)[0], "is derived per replica by `cluster`; give --port "
                              "(the router's) and --host instead")
    planned = []
    for index in range(replicas):
        http_port = port + 1 + index
        kv_events = f"tcp://{host}:{port + 1 + replicas + index}"
        replay = f"tcp://{host}:{port + 1 + 2 * replicas + index}"
        command = [sys.executable, "-m", "hybridcache", "serve", "--host", host, "--port", str(http_port),
                   "--kv-events", kv_events, "--kv-events-replay", replay, "--replica-id", f"r{index}",
                   *_per_replica_files(serve_flags, index)]
        planned.append(Replica(index, f"http://{host}:{http_port}", kv_events, replay, command))
    command = router_command(router, policy or DEFAULT_POLICY[router], host, port, planned, model_name,
                             metrics_port=port + 1 + 3 * replicas, api_key=api_key,
                             session_affinity_ttl_s=session_affinity_ttl_s)
    return ClusterPlan(planned, f"http://{host}:{port}", command)


def router_command(router: str, policy: str, host: str, port: int, replicas: list[Replica],
                   model_name: str, metrics_port: int, api_key: str | None = None,
                   session_affinity_ttl_s: int = 0) -> list[str]:
    """The router's command line naming every replica (and, for vllm-router's kv_aware, each replica's
    event and replay sockets). Pure apart from finding the executable on PATH or beside Python."""
    urls = [replica.url for replica in replicas]
    common = ["--host", host, "--port", str(port), "--worker-urls", *urls, "--policy", policy,
              "--health-check-interval-secs", str(HEALTH_CHECK_INTERVAL_S), "--health-failure-threshold", "1",
              "--prometheus-host", host, "--prometheus-port", str(metrics_port)]
    if api_key is not None:
        common += ["--api-key", api_key]
    if router == "sglang-router":
        return [router_executable(router), "launch", *common]
    command = [router_executable(router), *common]
    if policy == "kv_aware":
        for replica in replicas:
            command += ["--kv-event-source", f"{replica.url}={replica.kv_events}",
                        "--kv-event-replay-source", f"{replica.url}={replica.kv_events_replay}"]
        command += ["--kv-event-block-size", str(BLOCK_TOKENS), "--kv-event-model", model_name]
        if session_affinity_ttl_s:
            command += ["--kv-aware-session-affinity-ttl-secs", str(session_affinity_ttl_s)]
    return command


def router_executable(router: str) -> str:
    """The router's console script: beside this Python (a venv) first, then on PATH; the bare name when
    neither has it (starting it then fails with a clear error)."""
    beside = Path(sys.executable).with_name(router)
    if beside.exists():
        return str(beside)
    return shutil.which(router) or router


def _per_replica_files(flags: list[str], index: int) -> list[str]:
    out: list[str] = []
    rename_next = False
    for flag in flags:
        if rename_next:
            out.append(replica_file(flag, index))
            rename_next = False
        elif flag in PER_REPLICA_FILE_FLAGS:
            out.append(flag)
            rename_next = True
        elif flag.split("=", 1)[0] in PER_REPLICA_FILE_FLAGS:
            name, value = flag.split("=", 1)
            out.append(f"{name}={replica_file(value, index)}")
        else:
            out.append(flag)
    return out
