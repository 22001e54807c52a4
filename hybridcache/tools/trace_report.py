"""What `bench trace` prints and draws from the records of its replays. Pure, except `plot_ttft_per_turn`
(which writes a PNG).

Per server label (`cache`, `nocache`): requests answered and failed, TTFT p50/p90/p99 in seconds
(linear interpolation between closest ranks), prompt, cached, computed (prompt − cached) and output
tokens. Then the cached server's `prefill_tokens_computed` (prompt − cached) and `prefill_tokens_saved`
(cached), and, when both servers ran, `ttft_p50_vs_nocache` (cache p50 / nocache p50; below 1 is
faster), the same for p90, and `computed_vs_nocache`. Failed requests count in `errors`, never in the
TTFT percentiles.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from pathlib import Path

from hybridcache.tools.bench_serve import percentile
from hybridcache.tools.trace_client import RequestRecord

Summary = dict[str, float | int]
PERCENTILES = (50, 90, 99)
LABELS = {"cache": "prefix cache", "nocache": "--no-prefix-reuse"}
MIN_TURNS_TO_PLOT = 3  # fewer distinct turns: plot per request instead


def summarize_server(label: str, records: Sequence[RequestRecord]) -> Summary:
    """name -> value for one server's replay, names prefixed with `label.`. Pure."""
    answered = [r for r in records if r.ok]
    prompt = sum(r.prompt_tokens for r in answered)
    cached = sum(r.cached_tokens for r in answered)
    summary: Summary = {f"{label}.requests_ok": len(answered),
                        f"{label}.errors": len(records) - len(answered)}
    ttfts = [r.ttft_s for r in answered]
    for q in PERCENTILES:
        summary[f"{label}.ttft_p{q}_s"] = percentile(ttfts, q) if ttfts else float("nan")
    summary.update({
        f"{label}.prompt_tokens": prompt,
        f"{label}.cached_tokens": cached,
        f"{label}.computed_tokens": prompt - cached,
        f"{label}.saved_share": cached / prompt if prompt else 0.0,
        f"{label}.output_tokens": sum(r.completion_tokens for r in answered),
    })
    return summary


def compare(summary: Mapping[str, float | int]) -> Summary:
    """The headline lines of a summary: the cached server's prefill tokens computed and saved, and, when
    the nocache server ran too, the cache-vs-nocache ratios. Empty without the cache label. Pure."""
    if "cache.prompt_tokens" not in summary:
        return {}
    prefill = {"prefill_tokens_computed": summary["cache.computed_tokens"],
               "prefill_tokens_saved": summary["cache.cached_tokens"]}
    if "nocache.prompt_tokens" not in summary:
        return prefill
    return {
        **prefill,
        "ttft_p50_vs_nocache": _ratio(summary["cache.ttft_p50_s"], summary["nocache.ttft_p50_s"]),
        "ttft_p90_vs_nocache": _ratio(summary["cache.ttft_p90_s"], summary["nocache.ttft_p90_s"]),
        "computed_vs_nocache": _ratio(summary["cache.computed_tokens"], summary["nocache.computed_tokens"]),
    }


def _ratio(numerator: float, denominator: float) -> float:
    return float(numerator) / float(denominator) if denominator else float("nan")


def format_value(value: float | int | str) -> str:
    """How a value is printed: ints as they are, floats with 4 significant digits."""
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def ttft_by_turn(records: Sequence[RequestRecord]) -> dict[int, list[float]]:
    """Turn number -> TTFTs (s) of the answered requests at that turn, turns ascending. Pure."""
    by_turn: dict[int, list[float]] = {}
    for record in sorted(records, key=lambda r: r.turn):
        if record.ok:
            by_turn.setdefault(record.turn, []).append(record.ttft_s)
    return by_turn


def ttft_by_request(records: Sequence[RequestRecord]) -> dict[int, list[float]]:
    """Request number (1, 2, ... in send order) -> [its TTFT (s)], answered requests only. Pure."""
    answered = sorted((r for r in records if r.ok), key=lambda r: r.sent_s)
    return {number: [record.ttft_s] for number, record in enumerate(answered, 1)}


def plot_ttft_per_turn(runs: Mapping[str, Sequence[RequestRecord]], title: str, out: Path) -> None:
    """Draw each server's TTFT per turn (every request a dot, the median per turn a line) into a PNG at
    `out`; a trace with fewer than `MIN_TURNS_TO_PLOT` distinct turns (one-shot requests, sub-agent
    fan-outs) is drawn per request in send order instead. Writes the file; raises OSError when it cannot."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    per_turn = len({r.turn for records in runs.values() for r in records}) >= MIN_TURNS_TO_PLOT
    group = ttft_by_turn if per_turn else ttft_by_request
    figure, axes = plt.subplots(figsize=(9, 5), dpi=120)
    try:
        for (label, records), color in zip(runs.items(), ("tab:blue", "tab:orange", "tab:green")):
            series = group(records)
            dots = [(x, ttft) for x, values in series.items() for ttft in values]
            if dots:
                axes.scatter(*zip(*dots), s=12, alpha=0.35, color=color)
            xs = list(series)
            suffix = " (median per turn)" if per_turn else ""
            axes.plot(xs, [statistics.median(series[x]) for x in xs], marker="o", color=color,
                      label=LABELS.get(label, label) + suffix)
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.set_ylim(bottom=0)
        axes.set_title(title)
        axes.set_xlabel("turn within its conversation" if per_turn else "request, in send order")
        axes.set_ylabel("time to first token (s)")
        axes.grid(True, alpha=0.3)
        axes.legend()
        figure.tight_layout()
        figure.savefig(out, format="png")
    finally:
        plt.close(figure)
