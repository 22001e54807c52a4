"""`hybridcache inspect --plot`: what a prefix-cache file holds, as a PNG (matplotlib, Agg backend).

Left: host bytes by kind, each bar labelled with its size. Right: one marker per snapshot at its
frontier (x, tokens) and its host-eviction value H (y; log when the values span a decade), the marker's
shape and colour saying its kind and its area the requests that resumed from it (the legend shows the
scale). Every snapshot's image and tail take the same bytes, so size is not plotted against position.
"""

from __future__ import annotations

from pathlib import Path

from hybridcache.persistence.file_summary import FileSummary, SnapshotRow

KIND_STYLES = {
    "tap": ("o", "#1f77b4"),
    "boundary": ("s", "#ff7f0e"),
    "endpoint": ("^", "#2ca02c"),
    "output_boundary": ("D", "#9467bd"),
}
_OTHER_STYLE = ("X", "#7f7f7f")
BASE_AREA = 30.0  # marker area of a snapshot nobody resumed from
AREA_PER_HIT = 25.0
LEGEND_HITS = (0, 1, 4, 16)
LOG_AXIS_SPAN = 10.0


def byte_unit(nbytes: float) -> tuple[float, str]:
    """(divisor, name) writing ``nbytes`` with one to three digits before the point. Pure."""
    for divisor, name in ((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")):
        if nbytes >= divisor:
            return divisor, name
    return 1.0, "bytes"


def marker_area(hits: int) -> float:
    """Marker area for a snapshot with ``hits`` resumptions (linear in hits, never zero). Pure."""
    return BASE_AREA + AREA_PER_HIT * hits


def plot_summary(summary: FileSummary, out: Path) -> None:
    """Write the two panels for ``summary`` to ``out`` (a PNG). Imports matplotlib."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (bars, scatter) = plt.subplots(1, 2, figsize=(12, 4.5), gridspec_kw={"width_ratios": [1, 1.6]})
    _composition(bars, summary)
    _snapshots(scatter, summary.snapshots, plt)
    figure.tight_layout()
    figure.savefig(out, dpi=100)
    plt.close(figure)


def _composition(axes, summary: FileSummary) -> None:
    names = list(summary.kinds)
    sizes = [summary.kinds[name].bytes for name in names]
    divisor, unit = byte_unit(max(sizes, default=0))
    drawn = axes.bar(names, [size / divisor for size in sizes], color=["#4c72b0", "#dd8452", "#55a868"])
    axes.bar_label(drawn, [f"{summary.kinds[n].count} x, {size / divisor:.3g} {unit}"
                           for n, size in zip(names, sizes)], padding=2, fontsize=8)
    axes.set_ylabel(unit)
    axes.set_ylim(0, max(size / divisor for size in sizes) * 1.15 if any(sizes) else 1)
    total_divisor, total_unit = byte_unit(sum(sizes))
    axes.set_title(f"host tier: {sum(sizes) / total_divisor:.3g} {total_unit} by kind")


def _snapshots(axes, rows: list[SnapshotRow], plt) -> None:
    for kind in dict.fromkeys(row.kind for row in rows):
        mine = [row for row in rows if row.kind == kind]
        marker, color = KIND_STYLES.get(kind, _OTHER_STYLE)
        axes.scatter([r.frontier for r in mine], [r.h for r in mine], s=[marker_area(r.hits) for r in mine],
                     marker=marker, facecolors="none", edgecolors=color, linewidths=1.5, label=kind)
    values = [row.h for row in rows if row.h > 0]
    if values and max(values) / min(values) >= LOG_AXIS_SPAN:
        axes.set_yscale("log")
    elif values:
        axes.set_ylim(0, max(values) * 1.15)
    axes.yaxis.set_major_formatter(plt.FuncFormatter(lambda value, _: f"{value:.3g}"))
    axes.set_xlim(0, max((row.frontier for row in rows), default=64) * 1.08)
    axes.set_xlabel("frontier: where the snapshot resumes (tokens)")
    axes.set_ylabel("H: host-eviction value (lowest goes first)")
    axes.set_title(f"{len(rows)} snapshots")
    axes.grid(True, alpha=0.3)
    kinds = axes.legend(title="kind", loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize=8)
    axes.add_artist(kinds)
    sizes = [axes.scatter([], [], s=marker_area(hits), marker="o", facecolors="none", edgecolors="black")
             for hits in LEGEND_HITS]
    axes.legend(sizes, [str(hits) for hits in LEGEND_HITS], title="hits: requests\nresumed from it\n"
                "(marker area)", loc="lower left", bbox_to_anchor=(1.02, 0.0), fontsize=8, labelspacing=1.3,
                borderpad=0.9)
