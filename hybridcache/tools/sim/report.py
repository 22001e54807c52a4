"""Printing a simulation: ``name=value`` lines for one run, a table for a sweep, and the sweep plot.

Pure formatting, except ``plot_sweep`` which writes a PNG (matplotlib, imported inside, Agg backend).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import msgspec

from hybridcache.tools.sim.explain import ExplainReport
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
        "hedges": config.hedges,
        "hedge_budget": config.hedge_budget,
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
    floor = result.capacity_floor
    if floor is not None:
        derived.update({
            "capacity_floor_tokens": floor.tokens,
            "capacity_floor_vs_bound": floor.tokens / max(result.bound_tokens, 1),
            "computed_vs_capacity_floor": result.counters.computed_tokens / max(floor.tokens, 1),
            "capacity_floor_blocks": floor.capacity_blocks,
            "capacity_floor_belady_misses": floor.belady_misses,
            "capacity_floor_output_repeats": floor.output_repeats,
            "capacity_floor_seconds": result.floor_seconds,
        })
    return [f"{name}={_format(value)}" for name, value in {**settings, **counters, **derived}.items()]


def told_lines(told: str, untold: SimResult) -> list[str]:
    """What a ``--told`` run was told, and what the same run computed untold (sim/told_cache.py). Pure."""
    return [f"told={told}", f"untold_computed_tokens={untold.counters.computed_tokens}",
            f"untold_computed_vs_bound={_format(untold.computed_vs_bound)}"]


def explain_lines(report: ExplainReport) -> list[str]:
    """``explain_<field>=value`` per line (sim/explain.py). Pure."""
    return [f"explain_{name}={_format(value)}" for name, value in msgspec.structs.asdict(report).items()]


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


class UsersPoint(NamedTuple):
    """One concurrency of ``--sweep-users``: ours, the oracle, align and lru under the same settings."""

    users: int
    ours: SimResult
    oracle: SimResult
    align: SimResult
    lru: SimResult


USERS_COLUMNS = ("users", "bound_tokens", "ours", "oracle", "align", "lru", "floor", "ours_vs_bound",
                 "oracle_vs_bound", "align_vs_bound", "lru_vs_bound", "floor_vs_bound", "ours_vs_floor",
                 "ours_vs_oracle", "align_excess_closed")


def users_table(points: Sequence[UsersPoint]) -> list[str]:
    """A fixed-width table, one row per concurrency: computed prefill tokens of each policy, each over the
    bound, the capacity floor of ours's admission order (sim/capacity_floor.py; "-" when not computed),
    ours over the floor and over the oracle, and the share of align's excess over the bound that ours
    closes, (align − ours) / (align − bound). Header first. Pure."""
    rows = [list(USERS_COLUMNS)]
    for point in points:
        bound = point.ours.bound_tokens
        results = (point.ours, point.oracle, point.align, point.lru)
        ours, oracle, align, lru = (r.counters.computed_tokens for r in results)
        closed = (align - ours) / (align - bound) if align != bound else float("nan")
        floor = point.ours.capacity_floor
        floor_cells = ["-", "-", "-"] if floor is None else [
            str(floor.tokens), f"{floor.tokens / max(bound, 1):.4f}", f"{ours / max(floor.tokens, 1):.4f}"]
        counts = [str(point.users), str(bound), str(ours), str(oracle), str(align), str(lru)]
        ratios = [f"{value / max(bound, 1):.4f}" for value in (ours, oracle, align, lru)]
        rows.append([*counts, floor_cells[0], *ratios, *floor_cells[1:], f"{ours / max(oracle, 1):.4f}",
                     f"{closed:.3f}"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(USERS_COLUMNS))]
    return ["  ".join(cell.rjust(width) for cell, width in zip(row, widths)) for row in rows]


# Each policy keeps one look in every plot: a marker, a line style and a colour, hollow markers of
# different sizes so that a line lying on another still shows.
POLICY_STYLES = {
    "ours": {"marker": "o", "linestyle": "-", "color": "#1f77b4", "markersize": 10},
    "lru": {"marker": "s", "linestyle": "--", "color": "#d62728", "markersize": 7},
    "align": {"marker": "^", "linestyle": ":", "color": "#2ca02c", "markersize": 5},
    "oracle": {"marker": "D", "linestyle": "-.", "color": "#7f7f7f", "markersize": 4},
}
_FALLBACK_STYLE = {"marker": "D", "linestyle": "-.", "markersize": 6}
LOG_AXIS_SPAN = 10.0  # ratios spanning a decade or more get a log axis


def token_unit(tokens: float) -> tuple[float, str]:
    """(divisor, unit) that writes ``tokens`` with one to three digits before the point. Pure."""
    for divisor, unit in ((1e9, "billion tokens"), (1e6, "million tokens"), (1e3, "thousand tokens")):
        if tokens >= divisor:
            return divisor, unit
    return 1.0, "tokens"


def ratio_ticks(low: float, high: float) -> list[float]:
    """Round tick values for a log axis of ratios from ``low`` to ``high``. Pure."""
    steps = (1, 1.2, 1.5, 2, 3, 5, 7)
    decades = [10.0**k for k in range(-2, 5)]
    ticks = [step * decade for decade in decades for step in steps]
    return [tick for tick in ticks if low <= tick <= high]


def plot_sweep(points: Sequence[SweepPoint], bound_tokens: int, title: str, out: Path) -> None:
    """Computed prefill tokens over the infinite-cache bound vs the host budget, one line per policy,
    with the computed tokens themselves on the right axis. Writes ``out``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(8, 5), dpi=120)
    ratios = []
    for policy in dict.fromkeys(p.policy for p in points):
        mine = sorted((p for p in points if p.policy == policy), key=lambda p: p.host_cache_mib)
        ratio = [p.result.computed_vs_bound for p in mine]
        ratios += ratio
        style = POLICY_STYLES.get(policy, _FALLBACK_STYLE)
        axes.plot([p.host_cache_mib / 1024 for p in mine], ratio, label=policy, markerfacecolor="none",
                  markeredgewidth=1.5, linewidth=1.5, **style)
    axes.axhline(1.0, color="black", linewidth=1, label="infinite-cache bound (1.0)")
    low, high = min(1.0, min(ratios)), max(ratios)
    if high / low >= LOG_AXIS_SPAN:
        axes.set_yscale("log")
        axes.set_ylim(low / 1.08, high * 1.15)
        axes.set_yticks(ratio_ticks(low / 1.08, high * 1.15))
        axes.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:g}"))
        axes.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    else:
        axes.set_ylim(low - 0.03 * (high - low + 0.1), high + 0.05 * (high - low + 0.1))
    budgets = sorted({p.host_cache_mib / 1024 for p in points})
    axes.set_xticks(budgets, [f"{budget:g}" for budget in budgets])
    axes.set_xlabel("host cache budget (GiB)")
    axes.set_ylabel("computed prefill tokens / infinite-cache bound")
    divisor, unit = token_unit(bound_tokens * max(ratios))
    right = axes.secondary_yaxis(
        "right", functions=(lambda r: r * bound_tokens / divisor, lambda t: t * divisor / bound_tokens)
    )
    right.set_ylabel(f"computed prefill tokens ({unit})")
    if axes.get_yscale() == "log":
        right.set_yticks([tick * bound_tokens / divisor for tick in axes.get_yticks()])
    right.yaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda value, _: f"{value:.3g}"))
    right.yaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
    axes.set_title(f"{title}\nlower is better; the bound, {bound_tokens:,} tokens, is what even an infinite "
                   "cache computes", fontsize=10)
    axes.grid(True, alpha=0.3, which="both")
    axes.legend(title="policy")
    figure.tight_layout()
    figure.savefig(out)
    plt.close(figure)
