"""The report's figures (matplotlib, Agg backend, PNG bytes with no timestamp or version metadata,
so the same records give byte-identical files).

* :func:`bubble_chart` - AdaMRA Figure 1: examples/s (x) against accuracy (y, labelled with what it
  is: the LRA average only over five tasks, with its 95% interval where it has one), circle AREA
  proportional to peak memory where memory is shown. The suite's runs and the published Table 3 are
  separate panels: their speeds come from different hardware and must not share an axis.
* :func:`scaling_plot` - time and peak memory against sequence length, log-log, one line per variant,
  with the fitted ``a N^alpha`` dotted; at least three labelled ticks per axis (:func:`log_ticks`).
* :func:`length_plot` - accuracy per real-length bucket, one line per variant, with error bars.
* :func:`curve_plot` - validation accuracy against training step, mean over seeds with a min-max
  band; single-seed lines dashed and labelled "(1 seed)".
* :func:`small_multiples` - the grid the approximation map's plots draw one family per panel on.

Rules every figure keeps: a variant's colour and marker come from :mod:`lra.report.palette` (the same
in every plot and panel); a title is one line, and what a reader must know besides goes in the
report's text under the plot (:data:`CAPTIONS`); legends sit outside the data and list only what is
drawn.
"""
from __future__ import annotations

import io
import math
import textwrap
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter, NullLocator  # noqa: E402

from lra.report.palette import Palette, colour  # noqa: E402,F401  (Palette: the style every plot takes)
from lra.report.smat import TradeoffPoint  # noqa: E402

CAPTIONS = {  # plot file-name prefix -> the sentence report.md prints under it
    "bubble": "Circles are drawn in each variant's colour; bars are the 95% interval of the accuracy (the across "
              "table's) where the row has one.",
    "scaling": "Dotted: the fitted a·N^α, drawn a little past the measured lengths; memory peaks below the "
               "memory method's resolution are left out.",
    "length": "Bars: 95% interval over seeds and examples; the points of one bucket are dodged sideways.",
    "curves": "Band: min-max over seeds; a dashed line is a single seed.",
    "approximation_error_vs_n": "One panel per attention family; bars: sd over draws; errors below 1e-4 are "
                                "drawn at 1e-4.",
    "approximation_pareto": "One panel per attention family; black: the front over every variant (no point is "
                            "both faster and more accurate); circled: the default budget; bars: sd over draws; "
                            "errors below 1e-4 are drawn at 1e-4.",
}


def caption(path: str) -> str:
    """The caption of a plot file (``plots/<name>.png``): the longest matching prefix's, else none."""
    stem = path.rsplit("/", 1)[-1]
    found = [k for k in CAPTIONS if stem.startswith(k)]
    return CAPTIONS[max(found, key=len)] if found else ""


MAX_AREA = 2500.0  # points^2 of the largest circle
UNIFORM_AREA = 300.0  # circle area where memory is not shown
LEGEND_AREA = 60.0  # points^2 of a circle in a legend


def _png(fig) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, metadata={"Software": None}, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _area(mem: float | None, top: float) -> float:
    return UNIFORM_AREA if mem is None else MAX_AREA * mem / top


def _bubbles(ax, points: list[TradeoffPoint], title: str, empty: str, ylabel: str, colours: dict[str, str],
             intervals: dict[str, tuple[float, float]]) -> None:
    """One panel: a circle per point in the variant's colour, its accuracy interval as a vertical bar,
    and a legend below the panel instead of labels beside the circles (labels of close points collide)."""
    memory = any(p[2] is not None for p in points)
    ax.set_title(title + ("" if not points else "; circle area: peak memory" if memory
                          else "; equal circles: memory not drawn"), fontsize=9)
    ax.set_xlabel("speed (examples / s)")
    ax.set_ylabel(textwrap.fill(ylabel, 45))
    ax.grid(True, alpha=0.3)
    if not points:
        ax.text(0.5, 0.5, empty, ha="center", va="center", transform=ax.transAxes, fontsize=9, wrap=True)
        ax.set_xticks([])
        ax.set_yticks([])
        return
    top = max((p[2] for p in points if p[2] is not None), default=1.0) or 1.0
    xs, ys = [p[1] for p in points], [p[3] for p in points]
    lows = [intervals.get(p[0], (p[3], p[3]))[0] for p in points]
    highs = [intervals.get(p[0], (p[3], p[3]))[1] for p in points]
    xpad, ypad = (max(xs) - min(xs)) * 0.15 or max(xs) * 0.2 or 1.0, (max(highs) - min(lows)) * 0.15 or 1.0
    ax.set_xlim(min(xs) - xpad, max(xs) + xpad)
    ax.set_ylim(min(lows) - ypad, max(highs) + ypad)
    handles = []
    for name, speed, mem, acc in points:
        col = colours.get(name, colour(name))
        if name in intervals:
            lo, hi = intervals[name]
            ax.errorbar([speed], [acc], yerr=[[acc - lo], [hi - acc]], color=col, capsize=3, lw=1.2, zorder=3)
        ax.scatter([speed], [acc], s=[_area(mem, top)], alpha=0.45, color=col, edgecolors="black", zorder=2)
        handles.append(Line2D([], [], linestyle="none", marker="o", markersize=LEGEND_AREA ** 0.5, alpha=0.6,
                              markerfacecolor=col, markeredgecolor="black",
                              label=name + (f" ({mem:.0f} MB)" if mem is not None else "")))
    ax.legend(handles=handles, fontsize=7, ncol=3, loc="upper center", bbox_to_anchor=(0.5, -0.14), frameon=False)


def bubble_chart(*args: Any, **kwargs: Any) -> bytes:
    return _png(bubble_figure(*args, **kwargs))


def bubble_figure(runs: list[TradeoffPoint], reference: list[TradeoffPoint], runs_title: str, reference_title: str,
                  runs_ylabel: str, colours: dict[str, str] | None = None,
                  intervals: dict[str, tuple[float, float]] | None = None, variants: dict[str, str] | None = None):
    """Two panels that share nothing but the colours: this suite's runs (``runs_title``, one line; what
    its points are goes in the report's text) and a published table. ``intervals``: a run row's 95%
    accuracy interval (drawn as a bar); ``variants``: a published row's name -> the suite variant whose
    colour it takes."""
    fig, axes = plt.subplots(1, 2, figsize=(12, 5.5), layout="constrained")
    _bubbles(axes[0], runs, runs_title, "no variant has both efficiency figures\nand a complete accuracy row",
             runs_ylabel, colours or {}, intervals or {})
    ref_colours = {name: colour(v) for name, v in (variants or {}).items()}
    _bubbles(axes[1], reference, reference_title, "no reference data", "LRA average accuracy (%, 5 tasks)",
             ref_colours, {})
    fig.suptitle("Speed against accuracy: this suite and the published figures", fontsize=11)
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


FIT_DASHES = (0, (1.5, 1.5))


def scaling_figure(series: dict[str, list[tuple[int, float | None, float | None]]], title: str,
                   fits: dict[str, tuple[Any, Any]] | None = None, min_mb: float = 0.0,
                   palette: Palette | None = None):
    """``series``: variant -> [(length, ms, MB)]; missing figures (failed lengths) and peaks not above
    ``min_mb`` (below the memory method's resolution) are skipped. ``fits``: variant -> (time fit,
    memory fit) with ``a`` and ``alpha`` (:class:`lra.report.stats.PowerFit`), drawn dotted a little
    past the measured lengths so that a fit that lies on its points still shows. One legend for both
    panels (a variant has one colour), which lists the fit only where one is drawn."""
    palette = palette or Palette()
    fig, (t_ax, m_ax) = plt.subplots(1, 2, figsize=(12, 4.5), layout="constrained")
    lengths = sorted({n for pts in series.values() for n, _, _ in pts})
    handles, any_fit = [], False
    for name in series:
        pts = sorted(series[name])
        style = palette.style(name)
        alphas = []
        for ax, k in ((t_ax, 1), (m_ax, 2)):
            xy = [(p[0], p[k]) for p in pts if p[k] is not None and p[k] > (min_mb if k == 2 else 0)]
            if not xy:
                continue
            ax.plot([x for x, _ in xy], [y for _, y in xy], **style)
            fit = (fits or {}).get(name, (None, None))[k - 1]
            if fit is not None and len(xy) > 1:
                xs = [xy[0][0] / 1.25, xy[-1][0] * 1.25]
                ax.plot(xs, [fit.a * x ** fit.alpha for x in xs], color=style["color"], linestyle=FIT_DASHES,
                        linewidth=1.0, alpha=0.9)
                alphas.append(f"{'time' if k == 1 else 'memory'} α={fit.alpha:.2f}")
                any_fit = True
        handles.append(Line2D([], [], label=name + (f" ({', '.join(alphas)})" if alphas else ""), **style))
    if any_fit:
        handles.append(Line2D([], [], color="black", linestyle=FIT_DASHES, linewidth=1.0, label="fitted a·N^α"))
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
    t_ax.set_title("time per training step", fontsize=9)
    m_ax.set_title("peak memory", fontsize=9)
    if handles:
        fig.legend(handles=handles, fontsize=7, loc="outside right center")
    fig.suptitle(title, fontsize=11)
    return fig


def _line_chart(fig, ax, xlabel: str, ylabel: str, title: str):
    """Labels, grid, legend (outside, right: it never covers a line) and title of the per-variant line charts."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=7, loc="center left", bbox_to_anchor=(1.01, 0.5))
    ax.set_title(title, fontsize=10)
    return fig


def length_plot(*args: Any, **kwargs: Any) -> bytes:
    return _png(length_figure(*args, **kwargs))


def length_figure(labels: list[str], series: dict[str, list[tuple[float, float, float] | None]], title: str,
                  styles: dict[str, dict[str, Any]]):
    """``series``: row label -> (accuracy, low, high) (%) per bucket (None = empty bucket), drawn with
    error bars; ``styles``: row label -> matplotlib line style (:class:`Palette`)."""
    fig, ax = plt.subplots(figsize=(8, 4.5))
    k = max(1, len(series))
    width = min(0.06, 0.6 / k)
    for j, (name, buckets) in enumerate(series.items()):
        xs = [i + (j - (k - 1) / 2) * width for i in range(len(labels))]  # dodge, so error bars do not overlap
        pts = [(x, b) for x, b in zip(xs, buckets) if b is not None]
        ax.errorbar([x for x, _ in pts], [b[0] for _, b in pts],
                    yerr=[[b[0] - b[1] for _, b in pts], [b[2] - b[0] for _, b in pts]],
                    label=name, capsize=2, markersize=5, linewidth=1.0, **styles.get(name, {}))
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
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for name, (seeds, pts) in series.items():
        steps = [p[0] for p in pts]
        style = dict(styles.get(name, {}))
        if seeds == 1:
            style["linestyle"] = "--"
        ax.plot(steps, [p[1] for p in pts], label=f"{name} ({seeds} seed{'s' * (seeds != 1)})", markersize=3,
                markevery=max(1, len(pts) // 12), linewidth=1.2, **style)
        if seeds > 1 and any(p[2] != p[3] for p in pts):
            ax.fill_between(steps, [p[2] for p in pts], [p[3] for p in pts], color=style.get("color"), alpha=0.2, linewidth=0)
    return _line_chart(fig, ax, "training step", "validation accuracy (%)", title)


def small_multiples(groups: dict[str, list[str]], title: str, xlabel: str, ylabel: str, columns: int = 4):
    """A grid of panels with shared axes, one per family (``groups``: panel title -> its variants), for
    plots of more series than one panel can tell apart. Returns (figure, panel title -> axes)."""
    names = list(groups)
    rows = max(1, math.ceil(len(names) / columns))
    fig, axes = plt.subplots(rows, columns, figsize=(3.4 * columns, 2.7 * rows + 0.6), sharex=True, sharey=True,
                             layout="constrained", squeeze=False)
    panels = {}
    for i, ax in enumerate(axes.flat):
        if i >= len(names):
            ax.set_visible(False)
            continue
        panels[names[i]] = ax
        ax.set_title(names[i], fontsize=9)
        ax.grid(True, which="both", alpha=0.3)
    fig.supxlabel(xlabel, fontsize=9)
    fig.supylabel(ylabel, fontsize=9)
    fig.suptitle(title, fontsize=11)
    return fig, panels
