"""Printing a simulation: ``name=value`` lines for one run, a table for a sweep, and the sweep plot.

Pure formatting, except ``plot_sweep`` which writes a PNG (matplotlib, imported inside, Agg backend).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import msgspec

from hybridcache.tools.sim.runner import SimConfig, SimResult


class SweepPoint(NamedTuple):
    policy: str
    host_cache_mib: int
    result: SimResult


def _format(value: object) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def result_lines(trace_name: str, trace_format: str, config: SimConfig, result: SimResult) -> list[str]:
    """One ``name=value`` per line: the settings, every counter, the bound and the ratios. Pure."""
    counters = msgspec.structs.asdict(result.counters)
    settings = {
        "trace": trace_name,
        "trace_format": trace_format,
        "model_shape": config.shape.name,
        "policy": config.policy.value,
        "assume_echo": config.assume_echo,
        "host_write": config.host_write.value,
        "users": config.users,
        "max_concurrency": config.max_concurrency,
        "host_cache_mib": config.host_cache_mib,
        "device_pages": config.device_pages,
        "device_snapshot_slots": config.snapshot_slots(),
        "page_bytes": config.shape.page_bytes,
        "image_bytes": config.shape.image_bytes,
    }
    derived = {
        "bound_tokens": result.bound_tokens,
        "bound_tokens_inputs_only": result.bound_tokens_inputs_only,
        "computed_vs_bound": result.computed_vs_bound,
        "computed_vs_input": result.counters.computed_tokens / max(result.counters.input_tokens, 1),
        "simulated_seconds": result.simulated_seconds,
        "wall_seconds": result.wall_seconds,
    }
    return [f"{name}={_format(value)}" for name, value in {**settings, **counters, **derived}.items()]


SWEEP_COLUMNS = (
    "policy",
    "host_cache_mib",
    "computed_tokens",
    "computed_vs_bound",
    "reused_tokens_device_kv",
    "reused_tokens_host_kv",
    "restored_kv_bytes",
    "restored_state_bytes",
    "wall_seconds",
)


def sweep_table(points: Sequence[SweepPoint]) -> list[str]:
    """A fixed-width table, one row per (policy, host budget), header first. Pure."""
    rows = [list(SWEEP_COLUMNS)]
    for point in points:
        c = point.result.counters
        rows.append(
            [
                point.policy,
                str(point.host_cache_mib),
                str(c.computed_tokens),
                f"{point.result.computed_vs_bound:.4f}",
                str(c.reused_tokens_device_kv),
                str(c.reused_tokens_host_kv),
                str(c.restored_kv_bytes),
                str(c.restored_state_bytes),
                f"{point.result.wall_seconds:.1f}",
            ]
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(SWEEP_COLUMNS))]
    return ["  ".join(cell.rjust(width) for cell, width in zip(row, widths)) for row in rows]


def plot_sweep(points: Sequence[SweepPoint], bound_tokens: int, title: str, out: Path) -> None:
    """Computed prefill tokens vs host budget, one line per policy, the bound dashed. Writes ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 5), dpi=120)
    for policy in dict.fromkeys(p.policy for p in points):
        mine = sorted((p for p in points if p.policy == policy), key=lambda p: p.host_cache_mib)
        budgets = [p.host_cache_mib / 1024 for p in mine]
        computed = [p.result.counters.computed_tokens / 1e6 for p in mine]
        axes.plot(budgets, computed, marker="o", label=policy)
    axes.axhline(bound_tokens / 1e6, color="black", linestyle="--", label="infinite-cache bound")
    axes.set_xlabel("host cache budget (GiB)")
    axes.set_ylabel("computed prefill tokens (millions)")
    axes.set_title(title)
    axes.set_ylim(bottom=0)
    axes.grid(True, alpha=0.3)
    axes.legend()
    figure.tight_layout()
    figure.savefig(out)
    plt.close(figure)
