"""Soak: C clients for M minutes of mixed traffic against a live `hybridcache serve`, then leak checks.

    hybridcache bench soak --minutes 10 --clients 8 [--preset tiny]

Starts `hybridcache serve` itself (a child, niced like this process) with a small device KV pool and
Host tier, so the growing conversations overflow the device pool and the Host tier and both evict.
The clients (tools/soak_client.py) mix chat and completions, streaming and not, Anthropic messages,
two tenants (API keys: different cache salts) plus per-request salts, requests abandoned mid-prefill and
mid-decode, deliberately bad requests (each must get a 4xx), and repeats of earlier greedy requests
whose replies must not change. Printed (name=value): requests by outcome, the server's RSS at the end
of warm-up and at the end of the load (medians over a window, and the growth between them), its peak
and idle RSS, the longest worker (event-loop) stall, and once every client has stopped and transfers
have drained: /v1/cache/integrity and the leak counters (pins, lanes, lane pages, slots, transfers).
Exit status 1 when a Done-when condition fails (each is named), 0 otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp

from hybridcache.tools.soak_client import ClientPlan, SoakClient
from hybridcache.tools.soak_server import SoakServer, serve_argv
from hybridcache.tools.soak_tally import HELD_WHEN_BUSY, OUTCOMES, Tally, judge

MODEL = "soak"
MIB = 1 << 20
SETTLE_TIMEOUT_S = 60.0


@dataclass
class SoakSettings:
    checkpoint: Path
    workdir: Path
    minutes: float = 10.0
    clients: int = 8
    lanes: int = 4
    kv_pages: int = 128
    host_cache_mib: int = 8
    warmup_s: float | None = None  # default: a fifth of the run, at most 2 minutes
    seed: int = 0
    max_rss_growth_percent: float = 5.0
    require_eviction: bool = True  # a run too short to fill the pools can turn this off

    @property
    def duration_s(self) -> float:
        return self.minutes * 60.0

    @property
    def warmup(self) -> float:
        return self.warmup_s if self.warmup_s is not None else min(120.0, self.duration_s / 5)


@dataclass
class SoakResult:
    figures: dict[str, object]
    failures: list[str]

    @property
    def passed(self) -> bool:
        return not self.failures


class RssSampler:
    """The server's RSS once a second while the clients run: (seconds since start, bytes)."""

    def __init__(self, server: SoakServer) -> None:
        self.server = server
        self.samples: list[tuple[float, int]] = []

    async def run(self, started: float, until: float) -> None:
        while time.monotonic() < until:
            self.samples.append((time.monotonic() - started, self.server.rss_bytes()))
            await asyncio.sleep(1.0)

    def median_between(self, low_s: float, high_s: float) -> int:
        inside = [rss for at, rss in self.samples if low_s <= at <= high_s]
        return int(statistics.median(inside)) if inside else 0


async def run_soak(settings: SoakSettings, report=print) -> SoakResult:
    """Start the server, run the clients, check what is left; `report` gets each name=value line."""
    settings.workdir.mkdir(parents=True, exist_ok=True)
    keys = (f"soak-tenant-a-{settings.seed}", f"soak-tenant-b-{settings.seed}")
    key_file = settings.workdir / "api-keys"
    key_file.unlink(missing_ok=True)
    descriptor = os.open(key_file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(descriptor, ("\n".join(keys) + "\n").encode())
    os.close(descriptor)
    argv = serve_argv(settings.checkpoint, MODEL, settings.lanes, settings.kv_pages, settings.host_cache_mib,
                      key_file)
    with SoakServer(argv, settings.workdir / "serve.log") as server:
        figures = await _drive(settings, server, keys)
        exit_code = server.stop()
        errors = server.error_lines()
    figures["server_exit_code"] = exit_code
    figures["server_error_log_lines"] = len(errors)
    failures = list(figures.pop("_failures"))  # type: ignore[call-overload]
    if exit_code != 0:
        failures.append(f"the server exited {exit_code} on SIGTERM")
    for name, value in figures.items():
        report(f"{name}={value}")
    for line in errors[:5]:
        report(f"server_error_log: {line}")
    for failure in failures:
        report(f"failed: {failure}")
    report(f"verdict={'pass' if not failures else 'fail'}")
    return SoakResult(figures, failures)


async def _drive(settings: SoakSettings, server: SoakServer, keys: tuple[str, str]) -> dict[str, object]:
    tally = Tally()
    rng = random.Random(settings.seed)
    plan = ClientPlan(model=MODEL)
    preamble = " ".join(rng.choice(("alpha", "beta", "gamma", "delta", "omega")) + f"{i % 97}"
                        for i in range(plan.preamble_words)) + " "
    clients = [SoakClient(n, server.url, keys[n % 2], plan, tally, random.Random(settings.seed * 1000 + n),
                          preamble) for n in range(settings.clients)]
    started = time.monotonic()
    deadline = started + settings.duration_s
    sampler = RssSampler(server)
    sampling = asyncio.create_task(sampler.run(started, deadline))
    await asyncio.gather(*(client.run(deadline) for client in clients))
    load_s = time.monotonic() - started
    await sampling
    window = min(30.0, settings.warmup / 2)
    rss_warm = sampler.median_between(settings.warmup - window, settings.warmup)
    rss_end = sampler.median_between(settings.duration_s - window, settings.duration_s)
    growth = 100.0 * (rss_end - rss_warm) / rss_warm if rss_warm else float("inf")

    headers = {"Authorization": f"Bearer {keys[0]}"}
    async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=120)) as session:
        idle = await _settled_stats(session, server.url)
        async with session.get(server.url + "/v1/cache/integrity") as reply:
            integrity = await reply.json()
        idle = await _get_json(session, server.url + "/v1/cache/stats")  # after the check, still idle
        rss_idle = server.rss_bytes()
        served_after = await _served_after(session, server.url)

    figures: dict[str, object] = {
        "clients": settings.clients, "lanes": settings.lanes, "kv_pages": settings.kv_pages,
        "host_cache_mib": settings.host_cache_mib, "load_seconds": round(load_s, 1),
        "warmup_seconds": round(settings.warmup, 1), "requests": tally.total,
        "requests_per_second": round(tally.total / load_s, 2),
        **{f"outcome_{name}": tally.outcomes[name] for name in OUTCOMES},
        "unexpected_5xx": tally.outcomes["unexpected_5xx"],
        "rss_warmup_mib": round(rss_warm / MIB, 1), "rss_end_mib": round(rss_end / MIB, 1),
        "rss_growth_percent": round(growth, 2),
        "rss_peak_mib": round(max((rss for _, rss in sampler.samples), default=0) / MIB, 1),
        "rss_idle_mib": round(rss_idle / MIB, 1),
        "worker_stall_max_seconds": idle.get("worker_stall_max_seconds"),
        "worker_stall_max_cpu_seconds": idle.get("worker_stall_max_cpu_seconds"),
        "worker_stall_max_process_cpu_seconds": idle.get("worker_stall_max_process_cpu_seconds"),
        "worker_stalls_over_100ms": idle.get("worker_stalls_over_100ms"),
        "integrity": "clean" if integrity.get("clean") is True else integrity.get("problem"),
        **{key: idle.get(key) for key in (*HELD_WHEN_BUSY, "worker_lanes_free")},
        "device_evictions": _events(idle, "device"), "host_evictions": _events(idle, "host"),
        "host_tier_written_mib": round(int(idle.get("host_tier_written_bytes", 0)) / MIB, 1),  # type: ignore[call-overload]
        "host_tier_restored_mib": round(int(idle.get("host_tier_restored_bytes", 0)) / MIB, 1),  # type: ignore[call-overload]
        "reused_tokens": json.dumps(idle.get("prefix_cache_hit_tokens")),
        "requests_by_kind": json.dumps(dict(sorted(tally.kinds.items()))),
    }
    verdict = judge(tally, growth, settings.max_rss_growth_percent, integrity, idle, settings.lanes,
                    served_after)
    if settings.require_eviction:
        verdict.require(figures["device_evictions"] > 0, "the device pool never evicted")  # type: ignore[operator]
        verdict.require(figures["host_evictions"] > 0, "the Host tier never evicted")  # type: ignore[operator]
    figures["_failures"] = verdict.failures + [f"example {example}" for example in tally.examples
                                               if verdict.failures]
    return figures


def _events(stats: dict, tier: str) -> int:
    events = stats.get("prefix_cache_eviction_events") or {}
    return int(events.get(tier, 0))


async def _get_json(session: aiohttp.ClientSession, url: str) -> dict:
    async with session.get(url) as reply:
        return await reply.json()


async def _settled_stats(session: aiohttp.ClientSession, url: str) -> dict:
    """/v1/cache/stats once nothing runs, waits or is in flight, idle-time endpoint refills included (a
    refill holds a lane; or after SETTLE_TIMEOUT_S: then the leak check reports what stayed)."""
    deadline = time.monotonic() + SETTLE_TIMEOUT_S
    while True:
        stats = await _get_json(session, url + "/v1/cache/stats")
        busy = any(stats.get(key) for key in ("requests_running", "requests_waiting",
                                               "host_writes_in_flight", "restores_in_flight",
                                               "endpoint_refills_pending", "endpoint_refills_running"))
        if not busy or time.monotonic() > deadline:
            return stats
        await asyncio.sleep(0.1)


async def _served_after(session: aiohttp.ClientSession, url: str) -> bool:
    body = {"model": MODEL, "messages": [{"role": "user", "content": "still there?"}], "max_tokens": 4}
    async with session.post(url + "/v1/chat/completions", json=body) as reply:
        return reply.status == 200 and bool((await reply.json()).get("choices"))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--minutes", type=float, default=10.0, help="length of the load (default: 10)")
    parser.add_argument("--clients", type=int, default=8, help="concurrent clients (default: 8)")
    parser.add_argument("--preset", default="tiny", help="make-tiny-model preset (default: tiny)")
    parser.add_argument("--checkpoint", type=Path, default=None, help="a checkpoint instead of a preset")
    parser.add_argument("--workdir", type=Path, default=Path("/tmp/hybridcache-soak"),
                        help="server log and key file (default: %(default)s)")
    parser.add_argument("--lanes", type=int, default=4, help="the server's --max-concurrency (default: 4)")
    parser.add_argument("--kv-pages", type=int, default=128, help="the server's --kv-capacity (default: 128)")
    parser.add_argument("--host-cache-mib", type=int, default=8, help="the server's Host tier (default: 8)")
    parser.add_argument("--warmup-seconds", type=float, default=None,
                        help="RSS baseline at the end of this (default: a fifth of the run, at most 120)")
    parser.add_argument("--max-rss-growth", type=float, default=5.0, help="percent (default: 5)")
    parser.add_argument("--no-require-eviction", action="store_true",
                        help="do not fail when the pools never evicted (short runs)")
    parser.add_argument("--seed", type=int, default=0)


def run(args: argparse.Namespace) -> int:
    from hybridcache.tools.make_tiny_model import ensure_preset

    if args.minutes <= 0 or args.clients < 1:
        print("bench soak: --minutes must be > 0 and --clients >= 1", file=sys.stderr)
        return 2
    settings = SoakSettings(
        checkpoint=args.checkpoint or ensure_preset(args.preset), workdir=args.workdir, minutes=args.minutes,
        clients=args.clients, lanes=args.lanes, kv_pages=args.kv_pages, host_cache_mib=args.host_cache_mib,
        warmup_s=args.warmup_seconds, seed=args.seed, max_rss_growth_percent=args.max_rss_growth,
        require_eviction=not args.no_require_eviction,
    )
    print(f"checkpoint={settings.checkpoint}", flush=True)
    result = asyncio.run(run_soak(settings, report=lambda line: print(line, flush=True)))
    return 0 if result.passed else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_soak", description=__doc__.split("\n")[0])
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
