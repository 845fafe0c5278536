"""The report's figures (matplotlib, Agg backend, PNG bytes with no timestamp or version metadata,
so the same records give byte-identical files).

* :func:`bubble_chart` - AdaMRA Figure 1: examples/s (x) against LRA average (y), circle AREA
  proportional to peak memory. The suite's runs and the published Table 3 are separate panels:
  their speeds come from different hardware and must not share an axis.
* :func:`scaling_plot` - time and peak memory against sequence length, log-log, one line per variant,
  with the fitted ``a N^alpha`` dashed.
* :func:`length_plot` - accuracy per real-length bucket, one line per variant.
* :func:`curve_plot` - validation accuracy against training step, mean over seeds with a min-max band.
"""
from __future__ import annotations

import io
import textwrap
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FuncFormatter, NullFormatter  # noqa: E402

Point = tuple[str, float, float, float]  # name, examples/s, peak MB, LRA average
MAX_AREA = 2500.0  # points^2 of the largest circle
LINESTYLES = ("-", "--", ":")
MARKERS = ("o", "s", "^")


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, metadata={"Software": None}, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _bubbles(ax, points: list[Point], title: str, empty: str) -> None:
    ax.set_title(textwrap.fill(title, 62), fontsize=9)
    ax.set_xlabel("speed (examples / s)")
    ax.set_ylabel("LRA average accuracy (%)")
    ax.grid(True, alpha=0.3)
    if not points:
        ax.text(0.5, 0.5, empty, ha="center", va="center", transform=ax.transAxes, fontsize=9, wrap=True)
        return
    top = max(p[2] for p in points) or 1.0
    xs, ys = [p[1] for p in points], [p[3] for p in points]
    xpad, ypad = (max(xs) - min(xs)) * 0.2 or max(xs) * 0.2 or 1.0, (max(ys) - min(ys)) * 0.25 or 1.0
    ax.set_xlim(min(xs) - xpad, max(xs) + 2 * xpad)  # room for the labels on the right
    ax.set_ylim(min(ys) - ypad, max(ys) + ypad)
    for i, (name, speed, mem, acc) in enumerate(points):
        ax.scatter([speed], [acc], s=[MAX_AREA * mem / top], alpha=0.45, color=f"C{i % 10}", edgecolors="black")
    for (name, speed, mem, acc), dy in zip(points, _label_offsets(ax, points, top)):
        # label just outside the circle's right edge (radius in points = sqrt(area / pi)), moved up or
        # down (with a leader line) where it would overlap another label
        ax.annotate(f"{name} ({mem:.0f} MB)", (speed, acc), xytext=((MAX_AREA * mem / top / 3.1416) ** 0.5 + 3, dy),
                    textcoords="offset points", ha="left", va="center", fontsize=7,
                    arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "0.4"} if dy else None)


LABEL_HEIGHT = 10.0  # points between label centres


def _label_offsets(ax, points: list[Point], top: float) -> list[float]:
    """Vertical offsets (points) so that labels whose x ranges overlap are >= LABEL_HEIGHT apart."""
    fig = ax.figure
    fig.canvas.draw()  # the limits are final: data -> display coordinates
    scale = 72.0 / fig.dpi
    pos = [(ax.transData.transform((p[1], p[3])), p) for p in points]
    placed: list[tuple[float, float, float]] = []  # x0, x1, y in points
    offsets = [0.0] * len(points)
    for i in sorted(range(len(points)), key=lambda i: -pos[i][0][1]):
        (x, y), p = pos[i]
        x0 = x * scale + (MAX_AREA * p[2] / top / 3.1416) ** 0.5 + 3
        x1 = x0 + 4.2 * (len(p[0]) + 10)  # ~ label width at fontsize 7
        target = y * scale
        moved = True
        while moved:  # target only moves down, so this ends
            moved = False
            for px0, px1, py in placed:
                if x0 < px1 and px0 < x1 and abs(target - py) < LABEL_HEIGHT - 1e-9:
                    target, moved = py - LABEL_HEIGHT, True
        placed.append((x0, x1, target))
        offsets[i] = target - y * scale
    return offsets


def bubble_chart(runs: list[Point], reference: list[Point], runs_title: str, reference_title: str) -> bytes:
    fig, axes = plt.subplots(1, 2, figsize=(12, 5))
    _bubbles(axes[0], runs, runs_title, "no variant has both a SMAT bench record\nand a complete accuracy row")
    _bubbles(axes[1], reference, reference_title, "no reference data")
    fig.suptitle("Speed-memory-accuracy trade-off (circle area = peak memory)", fontsize=11)
    return _png(fig)


def scaling_plot(series: dict[str, list[tuple[int, float | None, float | None]]], title: str,
                 fits: dict[str, tuple[Any, Any]] | None = None, min_mb: float = 0.0) -> bytes:
    """``series``: variant -> [(length, ms, MB)]; missing figures (failed lengths) and peaks not above
    ``min_mb`` (below the memory method's resolution) are skipped.
    ``fits``: variant -> (time fit, memory fit) with ``a`` and ``alpha`` (:class:`lra.report.stats.PowerFit`)."""
    fig, (t_ax, m_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    lengths = sorted({n for pts in series.values() for n, _, _ in pts})
    for i, name in enumerate(series):
        pts = sorted(series[name])
        style = _style(i)
        for ax, k in ((t_ax, 1), (m_ax, 2)):
            xy = [(p[0], p[k]) for p in pts if p[k] is not None and p[k] > (min_mb if k == 2 else 0)]
            if xy:
                fit = (fits or {}).get(name, (None, None))[k - 1]
                alpha = f", α={fit.alpha:.2f}" if fit is not None else ""
                ax.plot([x for x, _ in xy], [y for _, y in xy], label=f"{name}{alpha}", **style)
                if fit is not None:
                    xs = [xy[0][0], xy[-1][0]]
                    ax.plot(xs, [fit.a * x ** fit.alpha for x in xs], color=style["color"], linestyle=(0, (2, 2)),
                            linewidth=0.9, alpha=0.8)
    for ax, ylabel in ((t_ax, "time per step (ms)"), (m_ax, "peak memory (MB)")):
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        lo, hi = ax.get_ylim()
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
        ax.yaxis.set_minor_formatter(FuncFormatter(lambda v, _: f"{v:g}") if hi / lo < 30 else NullFormatter())
        ax.set_xticks(lengths)
        ax.set_xticklabels([str(n) for n in lengths])
        ax.set_xlabel("sequence length")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper left")
    t_ax.set_title("time (dashed: fitted a·N^α)", fontsize=9)
    m_ax.set_title("memory (dashed: fitted a·N^α)" + (f"; peaks < {min_mb:g} MB not shown" if min_mb else ""), fontsize=9)
    fig.suptitle(title, fontsize=11)
    return _png(fig)


def _style(i: int) -> dict[str, Any]:
    """> 10 variants: colours repeat, line styles and markers differ."""
    return {"color": f"C{i % 10}", "linestyle": LINESTYLES[i // 10 % len(LINESTYLES)], "marker": MARKERS[i // 10 % len(MARKERS)]}


def _line_chart(fig, ax, xlabel: str, ylabel: str, title: str) -> bytes:
    """Labels, grid, legend and title of the per-variant line charts, rendered to PNG."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    return _png(fig)


def length_plot(labels: list[str], series: dict[str, list[float]], title: str) -> bytes:
    """``series``: variant -> accuracy (%) per bucket (NaN = empty bucket)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (name, accs) in enumerate(series.items()):
        ax.plot(range(len(labels)), accs, label=name, **_style(i))
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels)
    return _line_chart(fig, ax, "real length of the test example (tokens), quartile buckets", "test accuracy (%)", title)


def curve_plot(series: dict[str, list[tuple[int, float, float, float]]], title: str) -> bytes:
    """``series``: variant -> [(step, mean, min, max)] validation accuracy (%)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for i, (name, pts) in enumerate(series.items()):
        steps = [p[0] for p in pts]
        style = _style(i)
        ax.plot(steps, [p[1] for p in pts], label=name, markersize=3, **style)
        if any(p[2] != p[3] for p in pts):
            ax.fill_between(steps, [p[2] for p in pts], [p[3] for p in pts], color=style["color"], alpha=0.2, linewidth=0)
    return _line_chart(fig, ax, "training step", "validation accuracy (%)", title)
