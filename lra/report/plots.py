"""The report's figures (matplotlib, Agg backend, PNG bytes with no timestamp or version metadata,
so the same records give byte-identical files).

* :func:`bubble_chart` - AdaMRA Figure 1: examples/s (x) against accuracy (y, labelled with what it
  is: the LRA average only over five tasks), circle AREA proportional to peak memory where memory
  is shown. The suite's runs and the published Table 3 are separate panels: their speeds come from
  different hardware and must not share an axis.
* :func:`scaling_plot` - time and peak memory against sequence length, log-log, one line per variant,
  with the fitted ``a N^alpha`` dashed; at least three labelled ticks per axis (:func:`log_ticks`).
* :func:`length_plot` - accuracy per real-length bucket, one line per variant, with error bars.
* :func:`curve_plot` - validation accuracy against training step, mean over seeds with a min-max
  band; single-seed lines dashed and labelled "(1 seed)".

A variant keeps its colour in every plot of a report (:class:`Palette`).
"""
from __future__ import annotations

import io
import math
import textwrap
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator  # noqa: E402

from lra.report.smat import TradeoffPoint  # noqa: E402

MAX_AREA = 2500.0  # points^2 of the largest circle
UNIFORM_AREA = 300.0  # circle area where memory is not shown
LINESTYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^")


class Palette:
    """One colour per variant for the whole report (so a variant looks the same in every plot);
    more than 10 variants: colours repeat with another marker. Rows of one variant that differ in
    settings (custom rows) share its colour with another line style."""

    def __init__(self, variants: list[str]) -> None:
        self.index = {v: i for i, v in enumerate(variants)}

    def style(self, variant: str, kind: int = 0) -> dict[str, Any]:
        i = self.index.get(variant, len(self.index))
        return {"color": f"C{i % 10}", "marker": MARKERS[i // 10 % len(MARKERS)], "linestyle": LINESTYLES[kind % len(LINESTYLES)]}


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, metadata={"Software": None}, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _area(mem: float | None, top: float) -> float:
    return UNIFORM_AREA if mem is None else MAX_AREA * mem / top


def _bubbles(ax, points: list[TradeoffPoint], title: str, empty: str, ylabel: str, colours: dict[str, str]) -> None:
    ax.set_title(textwrap.fill(title, 62), fontsize=9)
    ax.set_xlabel("speed (examples / s)")
    ax.set_ylabel(textwrap.fill(ylabel, 45))
    ax.grid(True, alpha=0.3)
    if not points:
        ax.text(0.5, 0.5, empty, ha="center", va="center", transform=ax.transAxes, fontsize=9, wrap=True)
        return
    top = max((p[2] for p in points if p[2] is not None), default=1.0) or 1.0
    xs, ys = [p[1] for p in points], [p[3] for p in points]
    xpad, ypad = (max(xs) - min(xs)) * 0.2 or max(xs) * 0.2 or 1.0, (max(ys) - min(ys)) * 0.25 or 1.0
    ax.set_xlim(min(xs) - xpad, max(xs) + 2 * xpad)  # room for the labels on the right
    ax.set_ylim(min(ys) - ypad, max(ys) + ypad)
    for i, (name, speed, mem, acc) in enumerate(points):
        ax.scatter([speed], [acc], s=[_area(mem, top)], alpha=0.45, color=colours.get(name, f"C{i % 10}"), edgecolors="black")
    for (name, speed, mem, acc), dy in zip(points, _label_offsets(ax, points, top)):
        # label just outside the circle's right edge (radius in points = sqrt(area / pi)), moved up or
        # down (with a leader line) where it would overlap another label
        ax.annotate(name + (f" ({mem:.0f} MB)" if mem is not None else ""), (speed, acc),
                    xytext=((_area(mem, top) / 3.1416) ** 0.5 + 3, dy),
                    textcoords="offset points", ha="left", va="center", fontsize=7,
                    arrowprops={"arrowstyle": "-", "lw": 0.5, "color": "0.4"} if dy else None)


LABEL_HEIGHT = 10.0  # points between label centres


def _label_offsets(ax, points: list[TradeoffPoint], top: float) -> list[float]:
    """Vertical offsets (points) so that labels whose x ranges overlap are >= LABEL_HEIGHT apart."""
    fig = ax.figure
    fig.canvas.draw()  # the limits are final: data -> display coordinates
    scale = 72.0 / fig.dpi
    pos = [(ax.transData.transform((p[1], p[3])), p) for p in points]
    placed: list[tuple[float, float, float]] = []  # x0, x1, y in points
    offsets = [0.0] * len(points)
    for i in sorted(range(len(points)), key=lambda i: -pos[i][0][1]):
        (x, y), p = pos[i]
        x0 = x * scale + (_area(p[2], top) / 3.1416) ** 0.5 + 3
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


def bubble_chart(*args: Any, **kwargs: Any) -> bytes:
    return _png(bubble_figure(*args, **kwargs))


def bubble_figure(runs: list[TradeoffPoint], reference: list[TradeoffPoint], runs_title: str, reference_title: str,
                  runs_ylabel: str, colours: dict[str, str] | None = None):
    fig, axes = plt.subplots(1, 2, figsize=(12, 5.5), layout="constrained")  # long panel titles clear the suptitle
    _bubbles(axes[0], runs, runs_title, "no variant has both efficiency figures\nand a complete accuracy row",
             runs_ylabel, colours or {})
    _bubbles(axes[1], reference, reference_title, "no reference data", "LRA average accuracy (%, 5 tasks)", {})
    fig.suptitle("Speed-memory-accuracy trade-off (circle area = peak memory where shown)", fontsize=11)
    return fig


TICK_SUBS = ((1.0,), (1.0, 2.0, 5.0), (1.0, 2.0, 3.0, 5.0), tuple(float(k) for k in range(1, 10)))


def log_ticks(ax, axis: str = "y", at_least: int = 3) -> list[float]:
    """Labelled ticks of a log axis: the coarsest of 1-2-5-style sets with >= ``at_least`` ticks in
    the visible range (matplotlib's own leaves a single label when the range holds one power of ten);
    a range too narrow even for 1..9 gets evenly spaced values. Returns the ticks."""
    lo, hi = ax.get_ylim() if axis == "y" else ax.get_xlim()
    lo, hi = min(lo, hi), max(lo, hi)
    ticks: list[float] = []
    for subs in TICK_SUBS:
        ticks = [m * 10.0 ** e for e in range(math.floor(math.log10(lo)) - 1, math.ceil(math.log10(hi)) + 1)
                 for m in subs if lo <= m * 10.0 ** e <= hi]
        if len(ticks) >= at_least:
            break
    if len(ticks) < at_least:
        ticks = [float(f"{v:.3g}") for v in (lo * (hi / lo) ** (k / (at_least - 1)) for k in range(at_least))]
    target = ax.yaxis if axis == "y" else ax.xaxis
    target.set_major_locator(FixedLocator(ticks))
    target.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    target.set_minor_locator(NullLocator())
    target.set_minor_formatter(NullFormatter())
    return ticks


def scaling_plot(*args: Any, **kwargs: Any) -> bytes:
    return _png(scaling_figure(*args, **kwargs))


def scaling_figure(series: dict[str, list[tuple[int, float | None, float | None]]], title: str,
                   fits: dict[str, tuple[Any, Any]] | None = None, min_mb: float = 0.0,
                   palette: Palette | None = None):
    """``series``: variant -> [(length, ms, MB)]; missing figures (failed lengths) and peaks not above
    ``min_mb`` (below the memory method's resolution) are skipped.
    ``fits``: variant -> (time fit, memory fit) with ``a`` and ``alpha`` (:class:`lra.report.stats.PowerFit`)."""
    palette = palette or Palette(list(series))
    fig, (t_ax, m_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    lengths = sorted({n for pts in series.values() for n, _, _ in pts})
    for name in series:
        pts = sorted(series[name])
        style = palette.style(name)
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
        if ax.get_lines():
            log_ticks(ax, "y")
        ax.set_xticks(lengths)
        ax.set_xticklabels([str(n) for n in lengths])
        ax.xaxis.set_minor_locator(NullLocator())
        ax.set_xlabel("sequence length")
        ax.set_ylabel(ylabel)
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7, loc="upper left")
    t_ax.set_title("time (dashed: fitted a·N^α)", fontsize=9)
    m_ax.set_title("memory (dashed: fitted a·N^α)" + (f"; peaks < {min_mb:g} MB not shown" if min_mb else ""), fontsize=9)
    fig.suptitle(title, fontsize=11)
    return fig


def _line_chart(fig, ax, xlabel: str, ylabel: str, title: str):
    """Labels, grid, legend and title of the per-variant line charts."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title(title, fontsize=10)
    return fig


def length_plot(*args: Any, **kwargs: Any) -> bytes:
    return _png(length_figure(*args, **kwargs))


def length_figure(labels: list[str], series: dict[str, list[tuple[float, float, float] | None]], title: str,
                  styles: dict[str, dict[str, Any]]):
    """``series``: row label -> (accuracy, low, high) (%) per bucket (None = empty bucket), drawn with
    error bars; ``styles``: row label -> matplotlib line style (:class:`Palette`)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    k = max(1, len(series))
    for j, (name, buckets) in enumerate(series.items()):
        xs = [i + (j - (k - 1) / 2) * 0.06 for i in range(len(labels))]  # dodge, so error bars do not overlap
        pts = [(x, b) for x, b in zip(xs, buckets) if b is not None]
        ax.errorbar([x for x, _ in pts], [b[0] for _, b in pts],
                    yerr=[[b[0] - b[1] for _, b in pts], [b[2] - b[0] for _, b in pts]],
                    label=name, capsize=3, **styles.get(name, {}))
    ax.set_xticks(range(len(labels)))
    ax.set_xticklabels(labels, fontsize=8)
    return _line_chart(fig, ax, "real length of the test example (tokens), quartile buckets",
                       "test accuracy (%), 95% interval", title)


def curve_plot(*args: Any, **kwargs: Any) -> bytes:
    return _png(curve_figure(*args, **kwargs))


def curve_figure(series: dict[str, tuple[int, list[tuple[int, float, float, float]]]], title: str,
                 styles: dict[str, dict[str, Any]]):
    """``series``: row label -> (seeds, [(step, mean, min, max)]) validation accuracy (%); a line of
    one seed is dashed and labelled so (it has no band)."""
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for name, (seeds, pts) in series.items():
        steps = [p[0] for p in pts]
        style = dict(styles.get(name, {}))
        if seeds == 1:
            style["linestyle"] = "--"
        ax.plot(steps, [p[1] for p in pts], label=f"{name} ({seeds} seed{'s' * (seeds != 1)})", markersize=3, **style)
        if seeds > 1 and any(p[2] != p[3] for p in pts):
            ax.fill_between(steps, [p[2] for p in pts], [p[3] for p in pts], color=style.get("color"), alpha=0.2, linewidth=0)
    return _line_chart(fig, ax, "training step", "validation accuracy (%)", title)
