"""``python run.py mode=report``: tables and plots from the run records alone.

Reads ``<report.results_dir>/runs/*.json`` and writes under ``<report.out_dir>``: ``report.md``,
``excluded.csv``, ``tables/<name>.{csv,tex}`` and ``plots/<name>.png``. Same records in, same files
out: no timestamps, stable ordering (softmax first, then variant names; tasks in LRA order), fixed
number formats.

Order of work, written down:

1. Validation before aggregation (:mod:`lra.report.screening`): every record file is checked; what
   fails is excluded and listed with its reason, at the top of ``report.md`` and in ``excluded.csv``.
2. Cells (:mod:`lra.report.cells`): runs pool only when their experiment identity (:mod:`lra.identity`,
   the resume key's definition, without the seed) and their test set are equal; superseded
   duplicates are listed.
3. Accuracy (:mod:`lra.report.accuracy`, tests and marks in :mod:`lra.report.comparisons`, length and
   curves in :mod:`lra.report.lengths`): per protocol, and per protocol's custom runs.
4. Efficiency and SMAT (:mod:`lra.report.efficiency`): per bench setup.
5. The bubble chart: the smat bench points; without a smat bench, the protocol runs' own training
   throughput (memory drawn only where it separates variants).

Tables with no runs are omitted.
"""
from __future__ import annotations

import csv
import io
import logging
import re
from pathlib import Path
from typing import Any, Sequence

from lra.files import write_bytes, write_text
from lra.report import reference as ref
from lra.report import stats
from lra.report.accuracy import (across_table, accuracy_table, avg_interval, cells_table, exploratory_table,
                                 run_pairs_table, significance_table)
from lra.report.arguments import check_compare_shape, check_metric, check_report_config
from lra.report.cells import AccuracyGroup, accuracy_groups, order, row_text
from lra.report.comparisons import ALPHA, SIGNIFICANT, declared_family, exploratory, run_pairs
from lra.report.diagnostics import diagnostics_section
from lra.report.efficiency import (MIN_FIT_MB, accuracy_label, accuracy_models, accuracy_variants, backbone_conflict,
                                   bench_groups, efficiency_reference_table, efficiency_table, model_sizes, ok_results,
                                   power_fits, smat_reference_table, smat_table, training_points)
from lra.report.approximation import admit, approximation_section
from lra.report.lengths import curves, length_data
from lra.report.screening import KINDS, NOT_FINISHED, NOT_USED, Exclusion, Ledger, screen
from lra.report.smat import TradeoffPoint
from lra.report.tables import Table, slug

log = logging.getLogger(__name__)
EXCLUDED_FIELDS = ("file", "kind", "reason", "run_id", "mode", "task", "attention", "seed", "status")


def _accuracy_section(groups: list[AccuracyGroup], metric: str, pair: tuple[str, str] | None, palette: Any
                      ) -> tuple[list[Table], dict[str, bytes], dict[str, dict[str, tuple[float, list[str]]]], list[str]]:
    from lra.report.plots import curve_plot, length_plot

    tables: list[Table] = []
    plots: dict[str, bytes] = {}
    averages: dict[str, dict[str, tuple[float, list[str]]]] = {}
    pair_found = False
    for g in groups:
        family = declared_family(g, metric)
        table, avgs = accuracy_table(g, metric, family)
        tables += [table, cells_table(g, metric), across_table(g, metric)]
        if not g.custom:
            averages[g.protocol] = avgs
        extra = [t for t in (significance_table(g, family), run_pairs_table(g, run_pairs(g, family))) if t is not None]
        tables += extra
        if pair is not None:
            comps = exploratory(g, pair, metric)
            if comps:
                pair_found = True
                tables.append(exploratory_table(g, pair, comps))
                pairs = run_pairs_table(g, run_pairs(g, comps))
                if pairs is not None:
                    pairs.name, pairs.title = f"{pairs.name}_compare", pairs.title + f" (report.compare=[{pair[0]},{pair[1]}])"
                    tables.append(pairs)
        styles = {row_text(k): palette.style(k[0], i) for k in g.row_keys()
                  for i in [sorted(kk[1] for kk in g.rows if kk[0] == k[0]).index(k[1])]} if palette is not None else {}
        for task in g.tasks:
            found = length_data(g, task)
            if found is not None:
                lt, labels, data = found
                tables.append(lt)
            if found is not None and palette is not None:
                plots[f"plots/{lt.name}.png"] = length_plot(
                    labels, {row_text(k): b for k, b in data.items()},
                    f"{task}: test accuracy by real length, {g.where}", styles)
            series = curves(g, task) if palette is not None else None
            if series:
                plots[f"plots/{g.file_name('curves')}_{slug(task)}.png"] = curve_plot(
                    {row_text(k): v for k, v in series.items()}, styles=styles,
                    title=f"{task}: validation accuracy, {g.where}")
    notices = []
    if pair is not None and not pair_found:
        notices.append(f"report.compare=[{pair[0]},{pair[1]}]: no accuracy table holds both variants on one task "
                       "with the same labels, so nothing was compared.")
    return tables, plots, averages, notices


def smat_notices(benches: list, smats_scored: bool, averages: dict[str, dict[str, tuple[float, list[str]]]],
                 groups: list[AccuracyGroup], smat_protocol: str, conflicts: list[str]) -> list[str]:
    """One line each on why the report has no (scored) SMAT table, naming the setting or the runs that
    would give one; and one per refused mix of backbones."""
    if not benches and not groups:
        return []
    others = sorted(p for p, avgs in averages.items() if p != smat_protocol and len(avgs) >= 2)
    switch = (f"; protocol {', '.join(others)} has complete accuracy rows: report.smat_protocol={others[0]}"
              if len(averages.get(smat_protocol, {})) < 2 and others else "")
    notices = [f"SMAT refused for {c}" for c in conflicts]
    if not any(g.protocol == "smat" for g in benches):
        need = ("" if len(averages.get(smat_protocol, {})) >= 2 else
                f" and complete accuracy rows (every task) of at least two variants in protocol {smat_protocol}")
        notices.append(f"No SMAT table: it needs smat bench records of at least two variants (python run.py -m mode=bench "
                       f"bench.protocol=smat attention=softmax,<variant>){need}{switch}.")
    elif not smats_scored:
        notices.append(f"The SMAT table scores no variant (each row says why): it needs two variants with speed, "
                       f"resolved memory and a complete accuracy row in protocol {smat_protocol} "
                       f"(report.smat_protocol){switch}.")
    return notices


def _bubble_intervals(points: list[TradeoffPoint], group: AccuracyGroup | None, metric: str) -> dict[str, tuple[float, float]]:
    """The 95% interval of each bubble's accuracy: its row's Avg interval in ``group`` (the across table's)."""
    found = {}
    for name, *_ in points if group is not None else []:
        got = avg_interval(group, (name, ()), metric)
        if got is not None:
            found[name] = got[1:]
    return found


def _efficiency_section(runs: list, ledger: Ledger, averages: dict[str, dict[str, tuple[float, list[str]]]],
                        groups: list[AccuracyGroup], smat_protocol: str, palette: Any, metric: str = "test_acc"
                        ) -> tuple[list[Table], dict[str, bytes], str | None, list[str]]:
    from lra.report.plots import bubble_chart, scaling_plot

    tables: list[Table] = []
    plots: dict[str, bytes] = {}
    benches = bench_groups(runs, ledger)
    for g in benches:
        if g.protocol != "smat":
            tables.append(efficiency_table(g))
        if palette is not None and len({n for b in g.members.values() for n in ok_results(b)}) > 1:
            ordered = sorted(g.members, key=order)
            series = {a: [(n, r["ms"], r["peak_mb"]) for n, r in sorted(ok_results(g.members[a]).items())] for a in ordered}
            plots[f"plots/scaling_{g.name}.png"] = scaling_plot(
                series, f"Time and memory against sequence length, {g.protocol}, {g.device}, batch {g.batch} (log-log)", fits={a: power_fits(ok_results(g.members[a])) for a in ordered},
                min_mb=MIN_FIT_MB, palette=palette)
    if any(g.protocol == "table2" for g in benches):
        tables.append(efficiency_reference_table())
    points: list[TradeoffPoint] = []
    title, ylabel, drawn = "this suite", "accuracy (%)", smat_protocol
    smat_avgs = averages.get(smat_protocol, {})
    smats = [g for g in benches if g.protocol == "smat"]
    acc_group = next((g for g in groups if g.protocol == smat_protocol and not g.custom), None)
    variants, models = accuracy_variants(acc_group), accuracy_models(acc_group)
    elsewhere = {a: [p for p in sorted(averages) if p != smat_protocol and a in averages[p]]
                 for p_avgs in averages.values() for a in p_avgs}
    conflicts = []
    for g in smats:  # the bubble chart shows the first setup with complete points
        t, pts, acc_label = smat_table(g, smat_avgs, smat_protocol, variants, models, elsewhere)
        tables.append(t)
        clash = sorted({c for a in g.members if a in smat_avgs and a in g.runs
                        and (c := backbone_conflict(model_sizes(g.runs[a].rec), models.get(a)))})
        conflicts += [f"{g.title}: {c}" for c in clash]
        if pts and not points:
            points, title, ylabel = pts, f"this suite: smat bench, {g.title}; accuracy = {acc_label}", acc_label
    if smats:
        tables.append(smat_reference_table())
    notices = smat_notices(benches, bool(points), averages, groups, smat_protocol, conflicts)
    if not points:  # no smat bench: the accuracy runs' own throughput
        by_protocol = {g.protocol: g for g in groups if not g.custom}
        for protocol in sorted(by_protocol, key=lambda p: (p != smat_protocol, p)):
            avgs = averages.get(protocol, {})
            pts, t_title = training_points(by_protocol[protocol], avgs)
            if pts and t_title:
                points, title, drawn = pts, t_title, protocol
                ylabel = accuracy_label(next(iter(avgs.values()))[1], protocol)
                break
    refs: list[TradeoffPoint] = [(m, s, mb, a) for m, (s, mb, a, _) in ref.ADAMRA_TABLE3.items()]
    if palette is None:
        return tables, plots, (title if points else None), notices
    colours = {p[0]: palette.style(p[0])["color"] for p in points}
    plots["plots/bubble.png"] = bubble_chart(points, refs, "this suite", ref.TABLE3_SOURCE, ylabel, colours,
                                             intervals=_bubble_intervals(points, next(
                                                 (g for g in groups if g.protocol == drawn and not g.custom), None), metric),
                                             variants=ref.VARIANT)
    return tables, plots, (title if points else None), notices


def excluded_csv(ledger: Ledger) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(EXCLUDED_FIELDS)
    for e in sorted(ledger.excluded, key=lambda e: (KINDS.index(e.kind), e.file)):
        w.writerow([getattr(e, f) for f in EXCLUDED_FIELDS])
    return buf.getvalue()


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ⏎ ")


def _what(e: Exclusion) -> str:
    return " ".join(x for x in (e.mode, e.task, e.attention, f"seed {e.seed}" if e.seed not in ("", "None") else "") if x)


def excluded_section(ledger: Ledger) -> list[str]:
    """Every excluded record with its reason; not-finished records grouped by status and full error text."""
    if not ledger.excluded:
        return []
    out = ["## Excluded records", "", "Every record file not used by a table, with the reason (also in `excluded.csv`).", ""]
    for kind in KINDS:
        items = sorted((e for e in ledger.excluded if e.kind == kind), key=lambda e: e.file)
        if not items:
            continue
        out += [f"### {kind.capitalize()} ({len(items)})", ""]
        if kind == NOT_FINISHED:
            grouped: dict[tuple[str, str], list[Exclusion]] = {}
            for e in items:
                grouped.setdefault((e.status, e.reason), []).append(e)
            for (status, error), es in sorted(grouped.items()):
                out += [f"- **{status}** × {len(es)}: " + ", ".join(f"`{e.run_id or e.file}`" for e in es), "",
                        "  ```", *[f"  {line}" for line in error.splitlines() or [""]], "  ```", ""]
            continue
        out += ["| file | run | reason |", "|---|---|---|"]
        out += [f"| `{_cell(e.file)}` | {_cell(_what(e))} | {_cell(e.reason)} |" for e in items] + [""]
    return out


RULES = [
    f"The unit of replication is the training seed: every seed is tested on the same examples. Accuracy cells "
    f"give mean ± sd [95% t-interval over seeds]; one seed has no interval.",
    f"Seed-level tests need ≥ {stats.MIN_SEEDS} seeds per side and are over the seeds the cells display: paired t "
    "when both cells hold the same seeds, else Welch's t over all seeds of each side (never a paired t over the common "
    "seeds alone), so a test's difference is the difference of the displayed means and a mark never contradicts them; "
    "standard deviations floored at one example of the set the metric is measured on (test set; validation set "
    "for best_val_acc).",
    f"{SIGNIFICANT}: significant at {ALPHA:g} after Holm over the declared family of its table (each variant against "
    "softmax, per task). `report.compare` pairs are exploratory: own table, own correction, no marks.",
    "McNemar (run pairs) compares two trained networks, not two architectures: its own table, uncorrected, no marks.",
    "Bold/underlined accuracy: significantly above the next row under the seed-level test (Holm over the table's "
    "ranking tests); otherwise no mark.",
    "Across tasks: Avg with a 95% t-interval on the stratified variance (Welch-Satterthwaite degrees of freedom; "
    "coverage 94.5-95.7% in simulation at 3 or 5 seeds per task); P(> softmax) as a point estimate (its bootstrap "
    "interval did not cover 95% at 3-5 seeds); convergence failures = test accuracy in the chance band.",
    "Markdown, CSV and LaTeX are renderings of the same cells: the LaTeX cell is the Markdown text, the CSV its "
    "unrounded figures.",
    "Runs pool into a cell only when their experiment identity (lra/identity.py: the resume key's definition, without "
    "the seed and the settings that follow it in that run) and their test set (label/length fingerprint) are "
    "equal and their code behaves alike (their behavioural fingerprints agree: lra/training/fingerprint.py); a run "
    "whose protocol-defining settings differ from its protocol's runs, on the command line or in its "
    "config, is a custom row; each cell's config hash, seeds, commits and test-set size are in its cells table.",
]


def _markdown(ledger: Ledger, notices: list[str], tables: list[Table], plots: dict[str, bytes], has_bench: bool,
              bubble_runs: str | None) -> str:
    from lra.report.plots import caption

    counts = ", ".join(f"{ledger.count(k)} {k}" for k in KINDS)
    out = ["# LRA benchmark report", "",
           f"Built from {ledger.files} record file(s) under {' and '.join(f'`{f}`' for f in ledger.folders)}: {ledger.used} used, {len(ledger.excluded)} excluded "
           f"({counts}); every excluded record is listed below with its reason. The same records always give the same "
           "report.", ""]
    out += [f"- {n}" for n in notices] + ([""] if notices else [])
    out += excluded_section(ledger)
    out += ["How to read the statistics: at the end of this page (every rule, with its tests: docs/report.md).", ""]
    if not has_bench:
        out += ["No finished bench records: run `python run.py -m mode=bench attention=...` for the efficiency tables.", ""]
    for t in tables:
        out += [f"## {t.title}", "", t.markdown(), ""] + [f"- {n}" for n in t.notes] + ["",
                f"Files: `tables/{t.name}.csv`, `tables/{t.name}.tex`"
                + (f" (notes: `tables/{t.name}.notes.tex`)" if t.notes else ""), ""]
    out += ["## Plots", "", f"Bubble chart, left panel: {bubble_runs or 'empty (no variant with both accuracy and efficiency figures)'}.", ""]
    for p in sorted(plots):
        out += [f"![{Path(p).stem}]({p})", ""] + ([caption(p), ""] if caption(p) else [])
    out += ["## How to read the statistics", ""] + [f"- {r}" for r in RULES] + [""]
    return "\n".join(out)


def build_report(results_dir: str | Path, *, metric: str = "test_acc", smat_protocol: str = "xiong2021",
                 compare: tuple[str, str] | list[str] | None = None, also: Sequence[str | Path] = ()
                 ) -> tuple[str, dict[str, str], dict[str, bytes]]:
    """report.md text, files (relative path -> text: tables and ``excluded.csv``) and plots (relative
    path -> PNG bytes). ``compare``: an extra pair of variants (``report.compare``), tested outside
    the declared family; ``also``: other results folders whose records join (``report.also``)."""
    tables, ledger, plots, notices, has_bench, bubble, extra_files = build_tables(
        results_dir, metric=metric, smat_protocol=smat_protocol, compare=compare, also=also)
    files = {f"tables/{t.name}.{ext}": (t.csv() if ext == "csv" else t.latex()) for t in tables for ext in ("csv", "tex")}
    files.update({f"tables/{t.name}.notes.tex": t.latex_notes() for t in tables if t.notes})
    files.update(extra_files)
    files["excluded.csv"] = excluded_csv(ledger)
    md = _markdown(ledger, notices, tables, plots, has_bench, bubble)
    return md, files, plots


def build_tables(results_dir: str | Path, *, metric: str = "test_acc", smat_protocol: str = "xiong2021",
                 compare: tuple[str, str] | list[str] | None = None, plots: bool = True,
                 also: Sequence[str | Path] = ()
                 ) -> tuple[list[Table], Ledger, dict[str, bytes], list[str], bool, str | None, dict[str, str]]:
    """The report's table models (each rendered as Markdown, CSV and LaTeX), its ledger, plots
    (none with ``plots=False``: the tables alone, for checks), notices, whether any bench record
    exists, the bubble chart's panel title and extra files (the approximation sweep's CSV)."""
    from lra.report.palette import Palette

    metric = check_metric(metric)
    pair = check_compare_shape(compare)
    runs, ledger = screen(results_dir, metric, also)
    groups = accuracy_groups(runs, ledger)
    palette = Palette() if plots else None
    tables, pngs, averages, notices = _accuracy_section(groups, metric, pair, palette)
    diagnostics, diagnostics_notices = diagnostics_section(groups, results_dir, also)   # ListOps: lra/report/diagnostics.py
    tables, notices = tables + diagnostics, notices + diagnostics_notices
    placed = {r.run_id for g in groups for r in g.runs()}
    eff_tables, eff_plots, bubble, smat_lines = _efficiency_section(runs, ledger, averages, groups, smat_protocol, palette,
                                                                    metric)
    notices += smat_lines
    tables += eff_tables
    pngs.update(eff_plots)
    approx_tables, approx_plots, approx_files = approximation_section(admit(results_dir, ledger), palette)
    tables += approx_tables
    if plots:
        pngs.update(approx_plots)
    excluded = {e.file for e in ledger.excluded}
    for run in runs:  # every admitted run is in a table or listed: nothing disappears silently
        if run.rec["mode"] == "train" and run.run_id not in placed and run.file not in excluded:
            ledger.exclude(run, NOT_USED, "in no table (please report this: the report lost a run)")
    return tables, ledger, pngs, notices, any(r.rec["mode"] == "bench" for r in runs), bubble, approx_files


def _clean(out: Path) -> None:
    """Remove the files a previous report wrote (and nothing else), so stale tables do not linger."""
    for sub, pattern in (("tables", r"^(accuracy|cells|across|significance|compare|runpairs|length|efficiency|smat|approximation|diagnostics)[\w.-]*\.(csv|tex)$"),
                         ("plots", r"^(bubble|scaling|length|curves|approximation)[\w.-]*\.png$")):
        for f in sorted((out / sub).glob("*")) if (out / sub).is_dir() else []:
            if re.match(pattern, f.name):
                f.unlink()


def run_report(cfg: Any) -> dict[str, Any]:
    """``run.py mode=report``."""
    check_report_config(cfg)
    rc = cfg.report
    out = Path(rc.out_dir)
    compare, also = rc.get("compare"), rc.get("also") or []
    md, files, plots = build_report(rc.results_dir, metric=str(rc.metric), smat_protocol=str(rc.smat_protocol),
                                    compare=list(compare) if compare else None, also=[str(a) for a in also])
    _clean(out)
    for rel, text in files.items():
        write_text(out / rel, text)
    for rel, data in plots.items():
        write_bytes(out / rel, data)
    write_text(out / "report.md", md)
    n_excluded = files["excluded.csv"].count("\n") - 1
    log.info("report: %s (%d tables, %d plots)", out / "report.md", sum(r.startswith("tables/") for r in files) // 2, len(plots))
    if n_excluded:
        log.warning("report: %d record(s) excluded; see 'Excluded records' in %s and %s", n_excluded, out / "report.md",
                    out / "excluded.csv")
    result = {"report": str(out / "report.md"), "files": sorted(files) + sorted(plots)}
    if rc.get("wandb"):
        from lra.report.wandb_push import push

        result["wandb_dir"] = push(out, result["files"], project=str(rc.get("wandb_project") or "lra-suite"))
        log.info("report pushed to W&B (%s)", result["wandb_dir"])
    return result
