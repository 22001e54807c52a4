"""Simulate the hybrid prefix cache on real agent traces: the real cache index, no model.

Drives the cache through the engine's admission, tap, commit and finish calls for every request of the
traces (WEKA Claude-Code JSON, Mooncake JSONL or our JSONL, auto-detected), sized for a model shape, and
prints one name=value per line: what was computed, what was reused from device and host, what was
evicted, and the infinite-cache bound (computed_vs_bound). --sweep runs several host budgets (and, with
--plot, every policy) and prints a table. --sweep-users 4,8,12,16 prints, per number of concurrent users,
what ``ours``, the offline ``oracle`` (Belady, same capacity; sim/oracle.py), ``align`` and ``lru``
compute, with the capacity floor of ours's admission order (a proven lower bound for a cache of that
size; sim/capacity_floor.py).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import msgspec

from hybridcache.cache.write_back import HostWrite
from hybridcache.config import HedgeBudget, parse_hedge_budget
from hybridcache.tools.sim.policies import Policy
from hybridcache.tools.sim.report import (
    SweepPoint,
    UsersPoint,
    explain_lines,
    plot_sweep,
    result_lines,
    sweep_table,
    told_lines,
    users_table,
)
from hybridcache.tools.sim.runner import (
    SimConfig,
    simulate,
    simulate_explained,
    simulate_told,
    simulate_with_oracle,
)
from hybridcache.tools.sim.shapes import DEFAULT_SHAPE, SHAPES, get_shape
from hybridcache.tools.sim.told_cache import Told
from hybridcache.tools.traces import TraceFormatError, load_trace

DEFAULT_SWEEP_MIB = (0, 8192, 32768, 65536, 131072)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `simulate` command's arguments. Mutates ``parser``."""
    parser.add_argument("traces", nargs="+", metavar="TRACE", help="trace files or directories")
    parser.add_argument("--model-shape", default=DEFAULT_SHAPE, choices=sorted(SHAPES))
    parser.add_argument(
        "--host-cache-mib",
        type=int,
        default=65536,
        help="host slab tier in MiB, 0 for none (default 65536: a serving host of the default 27B shape; "
        "serve defaults to 8192 because it allocates real memory on the machine it runs on)",
    )
    parser.add_argument("--device-pages", type=int, default=16384, help="device KV page groups")
    parser.add_argument(
        "--device-snapshot-slots", type=int, default=None, help="D (default C + 1, C + 2 without host)"
    )
    parser.add_argument("--max-concurrency", type=int, default=8, help="C: lanes running at once")
    parser.add_argument("--users", type=int, default=8, help="conversations running at once (WEKA)")
    parser.add_argument("--policy", default="ours", choices=[p.value for p in Policy])
    parser.add_argument(
        "--assume-echo",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="a request extending the previous one echoes its output (endpoint is a resume point)",
    )
    parser.add_argument(
        "--hedges",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="plan hedge taps a few hundred to 2,048 tokens before each prompt end (as serve does)",
    )
    parser.add_argument(
        "--hedge-budget",
        type=_hedge_budget,
        default="auto",
        metavar="BYTES|auto",
        help="host bytes hedge images may hold together (suffix K, M or G; as serve's "
        "--cache-hedge-budget; default auto: 1/16 of the host tier, or 0 when an "
        "image is larger than the KV of 256 tokens, as for the 27B shapes)",
    )
    parser.add_argument(
        "--capacity-floor",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="also compute the capacity floor of the run's admission order: the fewest tokens any cache "
        "of the same device pages and host bytes could compute (sim/capacity_floor.py; --sweep-users "
        "computes it for ours)",
    )
    parser.add_argument(
        "--explain",
        action="store_true",
        help="run ours twice (the first run gives the future) and print what the host held whenever a "
        "snapshot that a request within 50 admissions needs was deleted (sim/explain.py)",
    )
    parser.add_argument(
        "--told",
        default=None,
        choices=[t.value for t in Told],
        help="run ours twice (the first run gives the future) and print the second, whose host tier "
        "evicts first the snapshots no later request resumes from: those of conversations that have sent "
        "their last request (ended) or all of them (dead): what ours would compute if it knew "
        "(sim/told_cache.py)",
    )
    parser.add_argument(
        "--host-write",
        default=HostWrite.BACK.value,
        choices=[w.value for w in HostWrite],
        help="when device-only blocks get a host copy: back (when the device needs room) or through "
        "(when a lane releases them, spec §7.6)",
    )
    parser.add_argument(
        "--sweep",
        default=None,
        metavar="MIB,MIB,...",
        help="host budgets to sweep (a table; every policy with --plot)",
    )
    parser.add_argument(
        "--sweep-users",
        default=None,
        metavar="U,U,...",
        help="numbers of concurrent users to run ours, oracle, align and lru at (a table; ignores --users)",
    )
    parser.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="OUT.png",
        help="run every policy over the --sweep host budgets (default "
        + ",".join(map(str, DEFAULT_SWEEP_MIB))
        + ") and plot computed tokens vs host budget",
    )


def _config(args: argparse.Namespace, policy: Policy, host_mib: int) -> SimConfig:
    return SimConfig(
        shape=get_shape(args.model_shape),
        policy=policy,
        host_cache_mib=host_mib,
        device_pages=args.device_pages,
        max_concurrency=args.max_concurrency,
        device_snapshot_slots=args.device_snapshot_slots,
        users=args.users,
        assume_echo=args.assume_echo,
        host_write=HostWrite(args.host_write),
        hedges=args.hedges,
        hedge_budget=args.hedge_budget,
        capacity_floor=args.capacity_floor,
    )


def _hedge_budget(text: str) -> HedgeBudget:
    try:
        return parse_hedge_budget(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def _sweep_budgets(text: str | None) -> list[int]:
    if text is None:
        return list(DEFAULT_SWEEP_MIB)
    try:
        budgets = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--sweep wants comma-separated MiB values, got {text!r}") from None
    if not budgets or min(budgets) < 0:
        raise ValueError(f"--sweep wants non-negative MiB values, got {text!r}")
    return budgets


def _sweep_users(text: str) -> list[int]:
    try:
        users = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise ValueError(f"--sweep-users wants comma-separated user counts, got {text!r}") from None
    if not users or min(users) < 1:
        raise ValueError(f"--sweep-users wants positive user counts, got {text!r}")
    return users


def _watched_run_error(args: argparse.Namespace) -> str | None:
    """Why ``--explain`` / ``--told`` cannot run with the other flags given; None when they can (or
    neither is given). Pure."""
    if not (args.explain or args.told):
        return None
    if args.explain and args.told:
        return "--explain and --told are separate runs: give one"
    if args.policy != Policy.OURS.value:
        return "--explain and --told run the ours policy only"
    if args.sweep or args.plot or args.sweep_users is not None:
        return "--explain and --told are single runs: not with --sweep, --sweep-users or --plot"
    return None


def run(args: argparse.Namespace) -> int:
    """Run the simulation(s) and print the report. Returns the exit status (2 for bad input)."""
    refused = _watched_run_error(args)
    if refused is not None:
        print(f"hybridcache simulate: {refused}", file=sys.stderr)
        return 2
    try:
        trace = load_trace(args.traces, shared_prefix=True)
        budgets = _sweep_budgets(args.sweep) if (args.sweep or args.plot) else None
        users = _sweep_users(args.sweep_users) if args.sweep_users is not None else None
    except (TraceFormatError, ValueError) as error:
        print(f"hybridcache simulate: {error}", file=sys.stderr)
        return 2
    if users is not None:
        points = []
        for count in users:
            args.users = count
            ours, oracle = simulate_with_oracle(trace, _config(args, Policy.OURS, args.host_cache_mib))
            baseline = _config(args, Policy.ALIGN, args.host_cache_mib)
            baseline = msgspec.structs.replace(baseline, capacity_floor=False)
            align = simulate(trace, baseline)
            lru = simulate(trace, msgspec.structs.replace(baseline, policy=Policy.LRU))
            points.append(UsersPoint(count, ours, oracle, align, lru))
            row = users_table(points[-1:])[1]
            print(f"hybridcache simulate: {count} users done: {row.split()}", file=sys.stderr, flush=True)
        print("\n".join(users_table(points)))
        return 0
    if budgets is None:
        config = _config(args, Policy(args.policy), args.host_cache_mib)
        if args.told:
            ours, told = simulate_told(trace, config, Told(args.told))
            lines = result_lines(trace.name, trace.format, config, told) + told_lines(args.told, ours)
        elif args.explain:
            result, explained = simulate_explained(trace, config)
            lines = result_lines(trace.name, trace.format, config, result) + explain_lines(explained)
        else:
            lines = result_lines(trace.name, trace.format, config, simulate(trace, config))
        print("\n".join(lines))
        return 0
    policies = list(Policy) if args.plot else [Policy(args.policy)]
    if args.plot is not None:
        print(
            f"hybridcache simulate: --plot runs {len(policies)} policies x {len(budgets)} host budgets "
            f"({','.join(map(str, budgets))} MiB; --sweep chooses them)",
            file=sys.stderr,
        )
    points = [
        SweepPoint(policy.value, budget, simulate(trace, _config(args, policy, budget)))
        for policy in policies
        for budget in budgets
    ]
    print("\n".join(sweep_table(points)))
    print(f"bound_tokens={points[0].result.bound_tokens}")
    if args.plot is not None:
        sources = Path(args.traces[0]).name if len(args.traces) == 1 else f"{len(args.traces)} trace paths"
        title = (f"{sources} ({len(trace.conversations)} conversations): {args.model_shape}, "
                 f"{args.users} users")
        plot_sweep(points, points[0].result.bound_tokens, title, args.plot)
        print(f"plot={args.plot}")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Stand-alone entry (``python -m hybridcache.tools.simulate``)."""
    parser = argparse.ArgumentParser(prog="hybridcache simulate", description=__doc__, allow_abbrev=False)
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
