"""``python run.py mode=report``: tables and plots from the run records alone.

Reads ``<report.results_dir>/runs/*.json`` (:func:`lra.records.load_records`; a malformed record is
named and skipped) and writes under ``<report.out_dir>``: ``report.md``, ``tables/<name>.{csv,tex}``
and ``plots/<name>.png``. Same records in, same files out: no timestamps, stable ordering (softmax
first, then variant names; tasks in LRA order), fixed number formats.

Rules, written down:

* Accuracy (AdaMRA Table 1), with intervals, paired significance against softmax, accuracy by
  length and learning curves: :mod:`lra.report.accuracy`. One table per training protocol, and a
  separate "custom" table per protocol for runs that overrode protocol-defining settings
  (:mod:`lra.report.protocols`); published rows only beside runs of their own protocol.
* Efficiency (AdaMRA Table 2): finished ``mode=bench`` records, one table per (bench protocol,
  device, batch size, task); the latest record per variant; ratios are softmax / variant (the
  paper's "improvement" factors: > 1 = faster or smaller than softmax); time and memory fitted to
  a N^alpha (alpha with its 95% interval). The published T4 figures are their own table.
* SMAT (AdaMRA Table 3, eq. 10 in :mod:`lra.report.smat`): speed and memory of the ``smat`` bench at its
  longest length, accuracy = the LRA average of protocol ``report.smat_protocol``; normalised over
  the suite's variants with all three figures. The published rows are their own table.
* Bubble chart: the smat bench points; without a smat bench, the accuracy runs' own training
  throughput and peak memory (one device only).
* Tables with no runs are omitted.
"""
from __future__ import annotations

import logging
import re
from collections import defaultdict
from pathlib import Path
from typing import Any

from lra.report import reference as ref
from lra.report import accuracy as acc_
from lra.report import stats
from lra.files import write_bytes, write_text
from lra.records import load_records
from lra.report.accuracy import chrono as _chrono
from lra.report.accuracy import order as _order
from lra.report.smat import smat_scores
from lra.report.tables import MISSING, Cell, Table, emphasise, slug

log = logging.getLogger(__name__)
OWN = "run"  # the source label of this suite's rows


def device_label(rec: dict[str, Any]) -> str:
    st = rec.get("stamp") or {}
    bench = (rec.get("efficiency") or {}).get("bench") or {}
    if bench.get("device", "cpu").startswith("cuda") and st.get("gpu"):
        return str(st["gpu"])
    return str(st.get("cpu") or "unknown device")


# ---------------------------------------------------------------------------------------------
# Efficiency
# ---------------------------------------------------------------------------------------------
def bench_groups(records: list[dict[str, Any]]) -> dict[tuple, dict[str, dict[str, Any]]]:
    """(protocol, device, batch, task) -> attention -> the latest finished bench record's bench block."""
    groups: dict = defaultdict(dict)
    for rec in sorted(records, key=_chrono):
        bench = (rec.get("efficiency") or {}).get("bench")
        if rec.get("mode") != "bench" or rec.get("status") != "finished" or not isinstance(bench, dict):
            continue
        key = (str(bench.get("protocol")), device_label(rec), int(bench.get("batch_size") or 0), str(rec["task"]))
        groups[key][rec["attention"]] = bench
    return dict(sorted(groups.items()))


def _ok(bench: dict[str, Any]) -> dict[int, dict[str, Any]]:
    return {int(r["length"]): r for r in bench.get("results", []) if r.get("status") == "ok"}


def _ratio_cell(value: float | None, base: float | None) -> Cell:
    if value is None:
        return Cell(MISSING)
    ratio = f" ({base / value:.2f}x)" if base and value > 0 else ""
    return Cell(f"{value:.1f}{ratio}", value)


def _memory_cell(value: float | None, base: float | None) -> Cell:
    """A peak under MIN_FIT_MB is below what the CPU method resolves (an in-process run, say): shown
    as such, never ranked or turned into a ratio."""
    if value is not None and value < MIN_FIT_MB:
        return Cell(f"<{MIN_FIT_MB:g} (unresolved)")
    return _ratio_cell(value, base if base is None or base >= MIN_FIT_MB else None)


MIN_FIT_MB = 1.0  # peaks below this are the CPU method's resolution (reused pages), not a size


def power_fits(rs: dict[int, dict[str, Any]]) -> tuple[stats.PowerFit | None, stats.PowerFit | None]:
    """Time and memory fitted to a N^alpha over the lengths measured (>= 2 lengths; memory only
    from peaks >= MIN_FIT_MB)."""
    out = []
    for k, floor in (("ms", 0.0), ("peak_mb", MIN_FIT_MB)):
        pts = [(n, r[k]) for n, r in sorted(rs.items()) if r.get(k) and r[k] > floor]
        out.append(stats.fit_power_law([n for n, _ in pts], [v for _, v in pts]) if len(pts) >= 2 else None)
    return out[0], out[1]


def _alpha_cell(fit: stats.PowerFit | None) -> Cell:
    if fit is None:
        return Cell(MISSING)
    ci = f" [{fit.low:.2f}, {fit.high:.2f}]" if fit.low is not None else " [—]"
    return Cell(f"{fit.alpha:.2f}{ci}")


def efficiency_table(key: tuple, group: dict[str, dict[str, Any]]) -> Table:
    protocol, device, batch, task = key
    per = {a: _ok(b) for a, b in group.items()}
    lengths = sorted({n for rs in per.values() for n in rs})
    header = (["attention", "source"] + [f"ms @{n}" for n in lengths] + [f"MB @{n}" for n in lengths]
              + ["time α [95% CI]", "memory α [95% CI]"])
    csv_header = (["attention", "source"] + [f"{k}_{n}" for n in lengths for k in ("ms", "ms_ratio", "mb", "mb_ratio", "examples_per_s")]
                  + ["time_alpha", "time_alpha_low", "time_alpha_high", "mem_alpha", "mem_alpha_low", "mem_alpha_high"])
    methods = sorted({b.get("memory_method") or "" for b in group.values()} - {""})
    table = Table(f"efficiency_{slug(protocol)}_{slug(device)}",
                  f"Efficiency, bench protocol {protocol}, {device}, batch {batch}, task {task}", header,
                  csv_header=csv_header)
    base = per.get("softmax", {})
    own = []
    for attn in sorted(per, key=_order):
        rs = per[attn]
        fits = power_fits(rs)
        cells = [Cell(attn), Cell(OWN)]
        cells += [_ratio_cell(rs[n]["ms"] if n in rs else None, base.get(n, {}).get("ms")) for n in lengths]
        cells += [_memory_cell(rs[n]["peak_mb"] if n in rs else None, base.get(n, {}).get("peak_mb")) for n in lengths]
        own.append(cells + [_alpha_cell(f) for f in fits])
        raw: list[Any] = [attn, OWN]
        for n in lengths:
            r, b = rs.get(n), base.get(n)
            raw += [r["ms"] if r else None, b["ms"] / r["ms"] if r and b else None, r["peak_mb"] if r else None,
                    b["peak_mb"] / r["peak_mb"] if r and b and min(r["peak_mb"], b["peak_mb"]) >= MIN_FIT_MB else None,
                    r["examples_per_s"] if r else None]
        for f in fits:
            raw += [f.alpha, f.low, f.high] if f is not None else [None] * 3
        table.csv_rows.append(raw)
    for col in range(2, 2 + 2 * len(lengths)):
        emphasise([r[col] for r in own], higher_is_better=False)
    table.rows += own
    table.notes += [
        f"ms = median time of one {'training step (fwd+bwd+optimiser)' if protocol != 'block' else 'block fwd+bwd'}; "
        "MB = peak memory of the step; (x) = softmax / variant (> 1: faster or smaller than softmax).",
        "α = exponent of a·N^α fitted by least squares on log-log (time, memory) over the lengths measured; "
        "95% CI from the slope's t-distribution (n - 2 dof; [—] with two lengths); memory peaks under "
        f"{MIN_FIT_MB:g} MB are left out of the fit. α ≈ 2: quadratic, ≈ 1: linear; "
        "fixed costs (weights, activations outside attention) pull α down at short lengths.",
        f"Memory method: {', '.join(methods) or 'unknown'} (see lra/bench/harness.py). Bold = best, underlined = second.",
        "Published figures were measured on other hardware: they are in their own table, never in this one.",
    ]
    return table


def efficiency_reference_table() -> Table:
    """AdaMRA Table 2 as published (T4 GPU): its own table, since the report never mixes devices."""
    lengths = list(ref.TABLE2_LENGTHS)
    header = ["model", "source"] + [f"ms @{n}" for n in lengths] + [f"MB @{n}" for n in lengths]
    table = Table("efficiency_reference_table2", f"Efficiency, published: {ref.TABLE2_SOURCE}, batch 16, task text", header,
                  csv_header=["model", "source"] + [f"{k}_{n}" for n in lengths for k in ("ms", "ms_ratio", "mb", "mb_ratio")])
    t_ref, m_ref = ref.ADAMRA_TABLE2["Transformer"]
    for model, (ms, mb) in ref.ADAMRA_TABLE2.items():
        table.rows.append([Cell(ref.label(model)), Cell(ref.TABLE2_SOURCE)]
                          + [_ratio_cell(float(ms[i]), float(t_ref[i])) for i in range(len(lengths))]
                          + [_ratio_cell(float(mb[i]), float(m_ref[i])) for i in range(len(lengths))])
        table.csv_rows.append([ref.label(model), ref.TABLE2_SOURCE]
                              + [x for i in range(len(lengths)) for x in (float(ms[i]), t_ref[i] / ms[i], float(mb[i]), m_ref[i] / mb[i])])
    table.notes.append("(x) = Transformer / model, as in the paper's improvement factors. Shown because this report has "
                       "table2 bench runs; compare ratios, not absolute figures, with them.")
    return table


# ---------------------------------------------------------------------------------------------
# SMAT
# ---------------------------------------------------------------------------------------------
def smat_rows(points: list[tuple[str, float, float, float | None]], source: str) -> tuple[list[list[Cell]], list[list[Any]]]:
    complete = [p for p in points if p[3] is not None]
    scores = dict(zip([p[0] for p in complete], smat_scores(*[list(c) for c in zip(*[p[1:] for p in complete])])
                      if complete else []))
    rows, raw = [], []
    for name, speed, mem, acc in points:
        s = scores.get(name)
        norm = (lambda v, k: f"{v:.1f} ({s[k]:.2f})" if s else f"{v:.1f}")  # noqa: E731
        rows.append([Cell(name), Cell(source), Cell(norm(speed, "s_norm")), Cell(norm(mem, "m_norm")),
                     Cell((f"{acc:.2f} ({s['acc_norm']:.2f})" if s else f"{acc:.2f}") if acc is not None else MISSING),
                     Cell(f"{s['smat']:.2f}" if s else MISSING, s["smat"] if s else None)])
        raw.append([name, source, speed, s["s_norm"] if s else None, mem, s["m_norm"] if s else None, acc,
                    s["acc_norm"] if s else None, s["smat"] if s else None])
    return rows, raw


def smat_table(device: str | None, group: dict[str, dict[str, Any]], averages: dict[str, float], protocol: str) -> tuple[Table, list]:
    """The table, and the suite's complete points (for the bubble chart)."""
    points = []
    for attn in sorted(group, key=_order):
        rs = _ok(group[attn])
        if rs:
            r = rs[max(rs)]
            points.append((attn, float(r["examples_per_s"]), float(r["peak_mb"]), averages.get(attn)))
    header = ["attention", "source", "Speed (ex/s)", "Peak MB", "LRA avg", "SMAT"]
    csv_header = ["attention", "source", "speed", "s_norm", "peak_mb", "m_norm", "lra_avg", "acc_norm", "smat"]
    name = f"smat_{slug(device)}" if device else "smat"
    table = Table(name, f"SMAT (eq. 10), {device or 'no SMAT bench records'}", header, csv_header=csv_header)
    own, raw = smat_rows(points, OWN)
    emphasise([r[-1] for r in own])
    table.rows += own
    table.csv_rows += raw
    table.notes += [
        "SMAT = S_norm + (1 - M_norm) + Acc_norm, min-max normalised (in brackets) over this table's variants; "
        f"speed and memory from the longest length of the smat bench, accuracy = Avg of protocol {protocol}.",
        f"{MISSING}: the variant has no complete accuracy row, so no SMAT. Bold = best, underlined = second.",
    ]
    return table, [p for p in points if p[3] is not None]


def smat_reference_table() -> Table:
    """AdaMRA Table 3 as published (T4 GPU), in its own table: the report never mixes devices."""
    header = ["model", "source", "Speed (ex/s)", "Peak MB", "LRA avg", "SMAT"]
    table = Table("smat_reference_table3", f"SMAT (eq. 10), published: {ref.TABLE3_SOURCE}", header,
                  csv_header=["model", "source", "speed", "s_norm", "peak_mb", "m_norm", "lra_avg", "acc_norm", "smat"])
    refs = [(ref.label(m), s, mb, acc) for m, (s, mb, acc, _) in ref.ADAMRA_TABLE3.items()]
    table.rows, table.csv_rows = smat_rows(refs, ref.TABLE3_SOURCE)
    table.notes.append("Normalised (in brackets) among the published models; recomputed from the printed inputs.")
    return table


def training_points(group: acc_.AccuracyGroup, averages: dict[str, float]) -> tuple[list, str | None]:
    """Bubble-chart points from the accuracy runs themselves (no smat bench needed): training
    examples/s (mean over the row's runs) and peak training memory (max), with the row's Avg.
    Only when every run of the point has both figures and all runs ran on one device."""
    points, devices = [], set()
    for attn, avg in sorted(averages.items(), key=lambda kv: _order(kv[0])):
        runs = [r for per in group.rows.get((attn, ()), {}).values() for r in per.values()]
        eff = [((r.get("efficiency") or {}).get("throughput") or {}).get("train", {}).get("examples_per_s") for r in runs]
        mem = [((r.get("efficiency") or {}).get("peak_memory") or {}).get("train_mb") for r in runs]
        if runs and all(isinstance(v, (int, float)) and v > 0 for v in eff + mem):
            points.append((attn, sum(eff) / len(eff), max(mem), avg))
            devices |= {device_label(r) for r in runs}
    if len(devices) != 1:
        return [], None
    return points, (f"this suite: training throughput and peak training memory of the protocol "
                    f"{group.protocol} runs on {devices.pop()}; accuracy = Avg")


def _accuracy_section(records: list[dict[str, Any]], results_dir: str | Path, metric: str,
                      compare: tuple[str, str] | None) -> tuple[list[Table], dict[str, bytes], list, dict[str, dict[str, float]]]:
    from lra.report.plots import curve_plot, length_plot

    preds = acc_.Predictions(results_dir)
    tables: list[Table] = []
    plots: dict[str, bytes] = {}
    groups = acc_.accuracy_groups(records, metric)
    averages: dict[str, dict[str, float]] = {}
    for g in groups:
        comps = acc_.comparisons(g, metric, preds, compare)
        table, avgs = acc_.accuracy_table(g, metric, preds, comps)
        tables.append(table)
        if not g.custom:
            averages[g.protocol] = avgs
        sig = acc_.significance_table(g, comps)
        if sig is not None:
            tables.append(sig)
        where = f"{'custom runs of ' if g.custom else ''}protocol {g.protocol}"
        for task in g.tasks:
            found = acc_.length_data(g, task, preds)
            if found is not None:
                edges, data = found
                lt = acc_.length_table(g, task, edges, data)
                tables.append(lt)
                plots[f"plots/{lt.name}.png"] = length_plot(
                    acc_.bucket_labels(edges), {acc_.row_text(k): [a for a, _ in b] for k, b in data.items()},
                    f"{task}: test accuracy by real length, {where}")
            series = acc_.curves(g, task)
            if series:
                plots[f"plots/curves_{'custom_' if g.custom else ''}{slug(g.protocol)}_{slug(task)}.png"] = curve_plot(
                    series, f"{task}: validation accuracy, {where} (band: min-max over seeds)")
    return tables, plots, groups, averages


# ---------------------------------------------------------------------------------------------
# Orchestration
# ---------------------------------------------------------------------------------------------
def build_report(results_dir: str | Path, metric: str = "test_acc", smat_protocol: str = "xiong2021",
                 compare: tuple[str, str] | list[str] | None = None) -> tuple[str, dict[str, str], dict[str, bytes]]:
    """report.md text, table files (relative path -> text) and plots (relative path -> PNG bytes).
    ``compare``: an extra pair of variants to test against each other (``report.compare``)."""
    from lra.report.plots import bubble_chart, scaling_plot

    if compare is not None and len(compare) != 2:
        raise ValueError(f"report.compare={list(compare)} must name two variants, e.g. report.compare=[adamra,linear]")
    records, problems = load_records(results_dir)
    tables, plots, acc_groups, averages_by_protocol = _accuracy_section(
        records, results_dir, metric, tuple(map(str, compare)) if compare else None)
    groups = bench_groups(records)
    for key, group in groups.items():
        if key[0] != "smat":
            tables.append(efficiency_table(key, group))
        lengths = {n for b in group.values() for n in _ok(b)}
        if len(lengths) > 1:
            ordered = sorted(group, key=_order)
            series = {a: [(n, r["ms"], r["peak_mb"]) for n, r in sorted(_ok(group[a]).items())] for a in ordered}
            plots[f"plots/scaling_{slug(key[0])}_{slug(key[1])}.png"] = scaling_plot(
                series, f"bench {key[0]} on {key[1]} (batch {key[2]}, task {key[3]}): log-log",
                fits={a: power_fits(_ok(group[a])) for a in ordered}, min_mb=MIN_FIT_MB)
    if any(k[0] == "table2" for k in groups):
        tables.append(efficiency_reference_table())
    runs_points, runs_title = [], "this suite"
    smat_groups = [(k, g) for k, g in groups.items() if k[0] == "smat"]
    for key, group in smat_groups:  # the bubble chart shows the first device with complete points
        t, pts = smat_table(key[1], group, averages_by_protocol.get(smat_protocol, {}), smat_protocol)
        tables.append(t)
        if pts and not runs_points:
            runs_points, runs_title = pts, f"this suite: smat bench on {key[1]}, accuracy {smat_protocol}"
    if smat_groups:
        tables.append(smat_reference_table())
    if not runs_points:  # no smat bench: the accuracy runs' own throughput and memory
        by_protocol = {g.protocol: g for g in acc_groups if not g.custom}
        for protocol in sorted(by_protocol, key=lambda p: (p != smat_protocol, p)):
            pts, title = training_points(by_protocol[protocol], averages_by_protocol.get(protocol, {}))
            if pts:
                runs_points, runs_title = pts, title
                break
    refs = [(m, s, mb, a) for m, (s, mb, a, _) in ref.ADAMRA_TABLE3.items()]
    plots["plots/bubble.png"] = bubble_chart(runs_points, refs, runs_title, ref.TABLE3_SOURCE)

    files = {}
    for t in tables:
        files[f"tables/{t.name}.csv"] = t.csv()
        files[f"tables/{t.name}.tex"] = t.latex()
    md = _markdown(records, problems, tables, plots, groups, runs_title if runs_points else None)
    return md, files, plots


def _markdown(records, problems, tables, plots, groups, bubble_runs: str | None) -> str:
    unfinished = sorted((r["run_id"], r["status"], (r.get("error") or "")[:120]) for r in records if r["status"] != "finished")
    out = ["# LRA benchmark report", "",
           f"Built from {len(records)} run record(s) under `runs/`; {len(problems)} malformed file(s) skipped; "
           f"{len(unfinished)} record(s) not finished. The same records always give the same report.", ""]
    if not groups:
        out += ["No finished bench records: run `python run.py -m mode=bench attention=...` for the efficiency tables.", ""]
    for t in tables:
        out += [f"## {t.title}", "", t.markdown(), ""] + [f"- {n}" for n in t.notes] + ["",
                f"Files: `tables/{t.name}.csv`, `tables/{t.name}.tex`", ""]
    out += ["## Plots", "", f"Bubble chart, left panel: {bubble_runs or 'empty (no variant with both accuracy and efficiency figures)'}.", ""]
    out += [f"![{Path(p).stem}]({p})" for p in sorted(plots)] + [""]
    if problems:
        out += ["## Skipped records", ""] + [f"- {p}" for p in problems] + [""]
    if unfinished:
        out += ["## Records not finished", "", "| run | status | error |", "|---|---|---|"]
        out += [f"| {i} | {s} | {e.replace('|', '/').replace(chr(10), ' ')} |" for i, s, e in unfinished] + [""]
    return "\n".join(out)


def _clean(out: Path) -> None:
    """Remove the files a previous report wrote (and nothing else), so stale tables do not linger."""
    for sub, pattern in (("tables", r"^(accuracy|significance|length|efficiency|smat)[\w.-]*\.(csv|tex)$"),
                         ("plots", r"^(bubble|scaling|length|curves)[\w.-]*\.png$")):
        for f in sorted((out / sub).glob("*")) if (out / sub).is_dir() else []:
            if re.match(pattern, f.name):
                f.unlink()


def run_report(cfg: Any) -> dict[str, Any]:
    rc = cfg.report
    out = Path(rc.out_dir)
    compare = rc.get("compare")
    md, files, plots = build_report(rc.results_dir, metric=str(rc.metric), smat_protocol=str(rc.smat_protocol),
                                    compare=list(compare) if compare else None)
    _clean(out)
    for rel, text in files.items():
        write_text(out / rel, text)
    for rel, data in plots.items():
        write_bytes(out / rel, data)
    write_text(out / "report.md", md)
    for p in load_records(rc.results_dir)[1]:
        log.warning(p)
    log.info("report: %s (%d tables, %d plots)", out / "report.md", len(files) // 2, len(plots))
    result = {"report": str(out / "report.md"), "files": sorted(files) + sorted(plots)}
    if rc.get("wandb"):
        from lra.report.wandb_push import push

        result["wandb_dir"] = push(out, result["files"], project=str(rc.get("wandb_project") or "lra-suite"))
        log.info("report pushed to W&B (%s)", result["wandb_dir"])
    return result
