"""The approximation map in the report (issue 37): tables and plots from the ``mode=approximation``
records of ``python -m lra.bench --protocol approximation`` (:mod:`lra.bench.approximation`).

Rules, written down:

* Admission (done here, so the shared screening stays as it is): a finished record whose file name
  is its run id, holding an ``approximation`` block with its settings and points. The newest such
  record per variant counts; older ones are listed as superseded duplicates. Records of different
  settings (lengths, draws, shapes, ListOps checkpoint) are not mixed: the newest record's settings
  define the map, and a record of other settings is listed as not used.
* Input kinds are never mixed: one table and one error-vs-N plot per input kind, one Pareto plot per
  input kind and length.
* Error cells are the mean relative output error over the draws (± sd for random variants); TV
  cells the mean and worst-row total variation at the largest length where the matrix was read.
* The Pareto plot: the budget sweep's error against the bench harness's block step time at the same
  N (measured by the protocol for every budget point), one curve per variant, its default point
  circled; the black line is the front (no point is both faster and more accurate). Both plots are
  small multiples, one panel per attention family on shared axes (the front over every variant in
  each), so that no panel holds more series than a reader can tell apart.
"""
from __future__ import annotations

import csv
import io
import json
import math
from pathlib import Path
from typing import Any

from lra.records import record_files
from lra.report.cells import order
from lra.report.tables import MISSING, Table, TableCell, slug

MODE = "approximation"
FLOOR = 1e-4   # plotted errors are clamped here: an exact point (~1e-16) would flatten every other curve
SETTING_KEYS = ("lengths", "inputs", "draws", "draws_long", "tv_max_len", "tv_draws", "heads", "head_dim", "seed")


def _check(path: Path) -> tuple[dict | None, str | None]:
    try:
        rec = json.loads(path.read_text())
    except (OSError, ValueError) as e:
        return None, f"unreadable record ({e})"
    if not isinstance(rec, dict) or rec.get("mode") != MODE:
        return None, None
    if path.stem != str(rec.get("run_id")):
        return rec, f"the file name {path.name} does not match its run_id {rec.get('run_id')}"
    if rec.get("status") != "finished":
        return rec, None   # the shared screening lists it as not finished
    block = rec.get("approximation")
    if not isinstance(block, dict) or not isinstance(block.get("points"), list) or not isinstance(block.get("settings"), dict):
        return rec, "no approximation block with its settings and points"
    return rec, ""


def screen_records(results_dir: str | Path) -> tuple[list[dict], list[tuple[str, dict, str, str]]]:
    """The admitted approximation records (newest per variant, of the newest settings) and the
    excluded ones as ``(file, record, kind, reason)``."""
    found, excluded = [], []
    for path in record_files(results_dir):
        rec, problem = _check(path)
        if rec is None and problem:
            continue  # malformed files are the shared screening's
        if rec is None or problem is None:
            continue
        if problem:
            excluded.append((path.name, rec, "failed a check", problem))
        else:
            found.append((path.name, rec))
    found.sort(key=lambda fr: (str(fr[1].get("started_at") or ""), str(fr[1]["run_id"])), reverse=True)
    runs: list[dict] = []
    settings = None
    for file, rec in found:
        s = {k: rec["approximation"]["settings"].get(k) for k in SETTING_KEYS}
        s["checkpoint"] = (rec["approximation"]["settings"].get("listops") or {}).get("checkpoint")
        settings = settings or s
        if s != settings:
            excluded.append((file, rec, "not used", "approximation settings differ from the newest record's"))
        elif any(r["attention"] == rec["attention"] for r in runs):
            excluded.append((file, rec, "superseded duplicate", "a newer approximation record of this variant counts"))
        else:
            runs.append(rec | {"_file": file})
    return sorted(runs, key=lambda r: order(r["attention"])), excluded


def admit(results_dir: str | Path, ledger: Any) -> list[dict]:
    """Replace the shared screening's "not used" verdict on approximation records by this module's
    own (used, or excluded with its reason); returns the admitted records."""
    from lra.report.screening import NOT_USED, Exclusion

    runs, excluded = screen_records(results_dir)
    ledger.excluded = [e for e in ledger.excluded if not (e.mode == MODE and e.kind == NOT_USED)]
    for file, rec, kind, reason in excluded:
        if not any(e.file == file for e in ledger.excluded):
            ledger.excluded.append(Exclusion.of(file, rec, kind, reason))
    return runs


def _fmt(x: float | None) -> str:
    if x is None or not math.isfinite(x):
        return MISSING
    return f"{x:.2e}" if x < 1e-3 else f"{x:.3f}" if x < 10 else f"{x:.1f}"


def _err_cell(p: dict | None, key: str = "rel_error") -> TableCell:
    if p is None or p.get("status") != "ok" or key not in p:
        return TableCell(MISSING if p is None or p.get("status") == "ok" else "failed")
    s = p[key]
    text = _fmt(s["mean"]) + (f" ± {_fmt(s['sd'])}" if p.get("draws", 1) > 1 else "")
    return TableCell(text, s["mean"])


def _value_text(v: Any) -> str:
    return "null" if v is None else f"{v:g}" if isinstance(v, float) else str(v)


def _points(rec: dict, kind: str) -> list[dict]:
    return [p for p in rec["approximation"]["points"] if p["input"] == kind]


def defaults_table(runs: list[dict], kind: str, lengths: list[int], meta: dict) -> Table:
    tv_n = max([n for n in lengths if n <= meta.get("tv_max_len", 0)], default=None)
    ent = "; ".join(f"N={n}: {meta[f'{kind}@{n}']['entropy']:.2f} nats (log N {math.log(n):.2f})"
                    for n in lengths if f"{kind}@{n}" in meta and "entropy" in meta[f"{kind}@{n}"])
    header = ["variant", "budget (default)"] + [f"rel. error N={n}" for n in lengths]
    if tv_n:
        header += [f"TV mean N={tv_n}", f"TV worst row N={tv_n}"]
    header += ["draws"]
    t = Table(f"approximation_{slug(kind)}", f"Approximation of exact softmax attention at each variant's default budget, "
              f"input {kind}", header,
              csv_header=["variant", "knob", "value", *[f"rel_error_{n}" for n in lengths], *[f"rel_error_sd_{n}" for n in lengths],
                          "tv_mean", "tv_max", "draws", "random"])
    for rec in runs:
        pts = {p["n"]: p for p in _points(rec, kind) if p["default"]}
        if not pts:
            continue
        first = next(iter(pts.values()))
        knob = f"{first['knob']} = {_value_text(first['value'])}" if first["knob"] else "none"
        row = [TableCell(rec["attention"]), TableCell(knob)] + [_err_cell(pts.get(n)) for n in lengths]
        if tv_n:
            p = pts.get(tv_n)
            if p is not None and "tv_mean" not in p and p.get("matrix"):
                row += [TableCell("no A"), TableCell("no A")]
            else:
                row += [_err_cell(p, "tv_mean"), _err_cell(p, "tv_max")]
        row.append(TableCell(str(max(p.get("draws", 1) for p in pts.values()))))
        t.rows.append(row)
        g = lambda n, k: (pts.get(n) or {}).get("rel_error", {}).get(k)  # noqa: E731
        tvp = pts.get(tv_n) or {}
        t.csv_rows.append([rec["attention"], first["knob"], _value_text(first["value"]), *[g(n, "mean") for n in lengths],
                           *[g(n, "sd") for n in lengths], (tvp.get("tv_mean") or {}).get("mean"),
                           (tvp.get("tv_max") or {}).get("mean"), max(p.get("draws", 1) for p in pts.values()),
                           rec["approximation"].get("random")])
    t.notes = [
        "Relative error ||Y − Y*||_F / ||Y*||_F over real query rows, float64, eval mode, same q, k, v as exact softmax; "
        "mean ± sd over the draws of a random variant (construction seeds), one value for a deterministic one.",
        "TV: row-wise total variation ½Σ_j|A_ij − P_ij| between the variant's mixing matrix (read as its output for V = I, "
        "kept only when Y = A V holds) and softmax's; 'no A': the output is not A V for an A free of V.",
        f"Mean row entropy of softmax's attention for this input: {ent or 'not recorded'}.",
        "No ranking marks: the table is a map, not a contest. Full budget sweep: tables/approximation_sweep.csv.",
    ]
    if kind.startswith("listops"):
        lm = meta.get("listops") or {}
        acc = lm.get("checkpoint_test_acc")   # the path where it was read is in each record (meta.listops.checkpoint)
        t.notes.append(f"Captured from checkpoint {Path(str(lm.get('checkpoint'))).name} of run {lm.get('run_id')} (test "
                       f"accuracy {f'{100 * acc:.2f}%' if isinstance(acc, (int, float)) else acc}); "
                       + ("a short fallback training run (no checkpoint was given), " if lm.get("fallback_training") else "")
                       + f"sequences of {lm.get('sequence_lengths')} tokens cropped or padded (masked) to N.")
    return t


def sweep_csv(runs: list[dict]) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["variant", "input", "n", "knob", "value", "default", "status", "draws", "rel_error_mean", "rel_error_sd",
                "rel_error_min", "rel_error_max", "tv_mean", "tv_max", "time_ms"])
    for rec in runs:
        for p in rec["approximation"]["points"]:
            e = p.get("rel_error") or {}
            w.writerow([rec["attention"], p["input"], p["n"], p["knob"], _value_text(p["value"]), p["default"], p["status"],
                        p.get("draws"), e.get("mean"), e.get("sd"), e.get("min"), e.get("max"),
                        (p.get("tv_mean") or {}).get("mean"), (p.get("tv_max") or {}).get("mean"),
                        (p.get("time") or {}).get("ms")])
    return buf.getvalue()


def _families(runs: list[dict]) -> dict[str, list[dict]]:
    """The records by attention family (one small-multiple panel each), in report order."""
    from lra.report.palette import family

    out: dict[str, list[dict]] = {}
    for rec in runs:
        out.setdefault(family(rec["attention"]), []).append(rec)
    return out


def _panels(runs: list[dict], title: str, xlabel: str) -> tuple[Any, dict[str, Any]]:
    from lra.report.plots import small_multiples

    fams = _families(runs)
    return small_multiples({f: [r["attention"] for r in rs] for f, rs in fams.items()}, title, xlabel,
                           "relative output error vs exact softmax")


def _finish(fig: Any, panels: dict[str, Any], log_x: int | None) -> bytes:
    """The shared error axis (log, floored), a legend in every panel that has lines; the PNG."""
    from lra.report.plots import _png

    for ax in panels.values():
        ax.set_yscale("log")
        if log_x:
            ax.set_xscale("log", base=log_x)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=6, loc="best")
    return _png(fig)


def error_vs_n_plot(runs: list[dict], kind: str, palette: Any) -> bytes:
    """Error at the default budget against N, one panel per family (26 curves in one panel cannot be
    told apart); bars are the sd over draws; errors below FLOOR are drawn at FLOOR (said in report.md)."""
    fig, panels = _panels(runs, f"Approximation error at the default budget, input {kind}", "sequence length N")
    for fam, recs in _families(runs).items():
        for rec in recs:
            pts = sorted((p for p in _points(rec, kind) if p["default"] and p["status"] == "ok"), key=lambda p: p["n"])
            if not pts:
                continue
            panels[fam].errorbar([p["n"] for p in pts], [max(FLOOR, p["rel_error"]["mean"]) for p in pts],
                                 yerr=[p["rel_error"]["sd"] for p in pts], label=rec["attention"], capsize=2,
                                 markersize=4, **palette.style(rec["attention"]))
    return _finish(fig, panels, 2)


def pareto_front(points: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """The (time, error) points no other point beats on both (sorted by time)."""
    front, best = [], math.inf
    for t, e in sorted(points):
        if e < best:
            front.append((t, e))
            best = e
    return front


def pareto_plot(runs: list[dict], kind: str, n: int, palette: Any) -> bytes | None:
    """Error against block step time over each variant's budget sweep, one panel per family with the
    front over every variant drawn in each (black), the default point circled, bars the sd over draws."""
    sweeps = {}
    for rec in runs:
        pts = [p for p in _points(rec, kind) if p["n"] == n and p["status"] == "ok"
               and (p.get("time") or {}).get("status") == "ok"]
        if pts:
            sweeps[rec["attention"]] = sorted(pts, key=lambda p: p["time"]["ms"])
    if not sweeps:
        return None
    drawn = [r for r in runs if r["attention"] in sweeps]
    fig, panels = _panels(drawn, f"Error against step time over each budget sweep, input {kind}, N={n}",
                          f"block step time at N={n} (ms; fwd+bwd of one encoder block, batch 1, float32)")
    every = [(p["time"]["ms"], max(FLOOR, p["rel_error"]["mean"])) for pts in sweeps.values() for p in pts]
    front = pareto_front(every)
    for fam, recs in _families(drawn).items():
        ax = panels[fam]
        ax.step([f[0] for f in front], [f[1] for f in front], where="post", color="black", lw=1.0, label="front (all)")
        for rec in recs:
            pts = sweeps[rec["attention"]]
            style = palette.style(rec["attention"])
            xs, ys = [p["time"]["ms"] for p in pts], [max(FLOOR, p["rel_error"]["mean"]) for p in pts]
            ax.errorbar(xs, ys, yerr=[p["rel_error"].get("sd") or 0.0 for p in pts], label=rec["attention"],
                        markersize=4, capsize=2, **style)
            for p, x, y in zip(pts, xs, ys):
                if p["default"]:
                    ax.scatter([x], [y], s=70, facecolors="none", edgecolors=style["color"])
    return _finish(fig, panels, 10)


def approximation_section(runs: list[dict], palette: Any = None) -> tuple[list[Table], dict[str, bytes], dict[str, str]]:
    """Tables (one per input kind), plots (error vs N per input kind, Pareto per input kind and N)
    and extra files (the full sweep as CSV)."""
    from lra.report.palette import Palette

    if not runs:
        return [], {}, {}
    palette = palette or Palette()
    settings = runs[0]["approximation"]["settings"]
    lengths = sorted({p["n"] for r in runs for p in r["approximation"]["points"]})
    kinds = [k for k in settings.get("inputs", []) if any(_points(r, k) for r in runs)]
    meta = {"tv_max_len": settings.get("tv_max_len", 0), "listops": settings.get("listops")}
    for r in runs:
        for key, value in (r["approximation"].get("inputs") or {}).items():
            meta.setdefault(key, value)
    tables, plots = [], {}
    for kind in kinds:
        tables.append(defaults_table(runs, kind, lengths, meta))
        plots[f"plots/approximation_error_vs_n_{slug(kind)}.png"] = error_vs_n_plot(runs, kind, palette)
        for n in lengths:
            png = pareto_plot(runs, kind, n, palette)
            if png is not None:
                plots[f"plots/approximation_pareto_{slug(kind)}_n{n}.png"] = png
    return tables, plots, {"tables/approximation_sweep.csv": sweep_csv(runs)}
