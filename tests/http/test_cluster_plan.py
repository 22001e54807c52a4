"""What `hybridcache cluster` would start: derived ports and event sockets, per-replica files, the
router's command line naming every replica; flags the cluster derives itself are refused."""

from __future__ import annotations

import pytest

from hybridcache.cli import build_parser
from hybridcache.config import OptionError
from hybridcache.http.cluster_command import serve_flags
from hybridcache.http.cluster_plan import plan_cluster, replica_file


def test_replica_ports_events_and_files_are_derived_and_distinct():
    plan = plan_cluster(3, "vllm-router", None, "127.0.0.1", 9000,
                        ["--prefix-cache-file", "/data/cache.hcf", "--event-log=/data/events.log",
                         "--host-cache-mib", "64"], "tiny")
    assert plan.router_url == "http://127.0.0.1:9000"
    assert [r.url for r in plan.replicas] == [f"http://127.0.0.1:{9001 + i}" for i in range(3)]
    assert [r.kv_events for r in plan.replicas] == [f"tcp://127.0.0.1:{9004 + i}" for i in range(3)]
    assert [r.kv_events_replay for r in plan.replicas] == [f"tcp://127.0.0.1:{9007 + i}" for i in range(3)]
    files = [r.command[r.command.index("--prefix-cache-file") + 1] for r in plan.replicas]
    assert files == ["/data/cache.r0.hcf", "/data/cache.r1.hcf", "/data/cache.r2.hcf"]
    logs = [word for word in plan.replicas[1].command if word.startswith("--event-log")]
    assert logs == ["--event-log=/data/events.r1.log"]
    assert all("--host-cache-mib" in r.command for r in plan.replicas)


def test_vllm_router_kv_aware_names_each_replicas_event_and_replay_sockets():
    plan = plan_cluster(2, "vllm-router", None, "127.0.0.1", 9000, [], "tiny")
    command = plan.router_command
    assert command[command.index("--policy") + 1] == "kv_aware"
    sources = [command[i + 1] for i, word in enumerate(command) if word == "--kv-event-source"]
    assert sources == ["http://127.0.0.1:9001=tcp://127.0.0.1:9003", "http://127.0.0.1:9002=tcp://127.0.0.1:9004"]
    assert command[command.index("--kv-event-block-size") + 1] == "64"
    assert command[command.index("--kv-event-model") + 1] == "tiny"


def test_replicas_are_named_and_kv_aware_keeps_sessions_on_their_replica():
    plan = plan_cluster(2, "vllm-router", None, "127.0.0.1", 9000, [], "tiny")
    assert [r.command[r.command.index("--replica-id") + 1] for r in plan.replicas] == ["r0", "r1"]
    command = plan.router_command
    assert command[command.index("--kv-aware-session-affinity-ttl-secs") + 1] == "1800"
    off = plan_cluster(2, "vllm-router", None, "127.0.0.1", 9000, [], "tiny", session_affinity_ttl_s=0)
    assert "--kv-aware-session-affinity-ttl-secs" not in off.router_command
    with pytest.raises(OptionError, match="--session-affinity-ttl"):
        plan_cluster(2, "vllm-router", None, "127.0.0.1", 9000, [], "tiny", session_affinity_ttl_s=-1)


def test_the_router_gets_the_replicas_key_only_when_they_have_one():
    for router in ("vllm-router", "sglang-router"):
        keyed = plan_cluster(2, router, None, "127.0.0.1", 9000, ["--api-key", "k1"], "tiny", api_key="k1")
        assert keyed.router_command[keyed.router_command.index("--api-key") + 1] == "k1"
        assert "--api-key" not in plan_cluster(2, router, None, "127.0.0.1", 9000, [], "tiny").router_command


def test_sglang_router_cache_aware_needs_no_event_sockets():
    plan = plan_cluster(2, "sglang-router", None, "127.0.0.1", 9000, [], "tiny")
    command = plan.router_command
    assert command[1] == "launch" and command[command.index("--policy") + 1] == "cache_aware"
    assert "--kv-event-source" not in command
    assert command[command.index("--worker-urls") + 1:][:2] == ["http://127.0.0.1:9001", "http://127.0.0.1:9002"]


@pytest.mark.parametrize("flag", ["--kv-events", "--kv-events-replay=tcp://x:1", "--replica-id"])
def test_flags_the_cluster_derives_are_refused(flag):
    with pytest.raises(OptionError, match="derived per replica"):
        plan_cluster(2, "vllm-router", None, "127.0.0.1", 9000, [flag, "tcp://127.0.0.1:1"], "tiny")


def test_bad_counts_and_ports_are_refused():
    with pytest.raises(OptionError, match="--replicas"):
        plan_cluster(0, "vllm-router", None, "127.0.0.1", 9000, [], "tiny")
    with pytest.raises(OptionError, match="--port"):
        plan_cluster(4, "vllm-router", None, "127.0.0.1", 65530, [], "tiny")


def test_the_serve_flags_given_to_cluster_reach_every_replica():
    argv = ["cluster", "--replicas", "2", "--port", "9000", "--host-cache-mib", "64",
            "--no-prefix-reuse", "--api-key", "a", "--api-key", "b", "--max-concurrency", "2"]
    args = build_parser(argv).parse_args(argv)
    flags = serve_flags(args)
    assert flags[flags.index("--host-cache-mib") + 1] == "64"
    assert "--no-prefix-reuse" in flags and flags.count("--api-key") == 2
    assert "--port" not in flags and "--replicas" not in flags


def test_replica_file_keeps_directory_and_extension():
    assert replica_file("cache.hcf", 3) == "cache.r3.hcf"
    assert replica_file("/a/b/log", 0) == "/a/b/log.r0"
