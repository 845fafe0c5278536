"""Accuracy side of the report: per protocol, the accuracy table (AdaMRA Table 1's layout), its cells'
provenance, the seed-level tests against softmax, the exploratory ``report.compare`` pair, run
pairs, and the across-task aggregates. Which runs form a cell: :mod:`lra.report.cells`; which tests
run and which marks they earn: :mod:`lra.report.comparisons`; accuracy by length and learning
curves: :mod:`lra.report.lengths`.

Rules, written down (the tables repeat them in their titles and notes):

* A table is one training protocol's runs, or the "custom" runs of a protocol (overridden
  protocol-defining settings, or another identity than the protocol row's); custom rows list what
  differs and are never ranked.
* Cell: ``report.metric`` x 100, ``mean ± sample sd [95% t-interval over seeds] n=<seeds>``; one seed:
  no interval; two seeds: the interval has one degree of freedom and says so. One interval kind per
  table, named in its title.
* Avg (accuracy table): the mean over the table's task columns, for rows with all of them, without
  an interval or a mark; its interval (a t-interval on the stratified variance, Welch-Satterthwaite
  degrees of freedom) and the probability of improvement over softmax (a point estimate) are in the
  across-task table, with the convergence-failure rate.
* One table model: Markdown, CSV and LaTeX render the same cells (:mod:`lra.report.tables`); each
  displayed cell carries the unrounded figures it shows as its CSV columns.
* With ``report.metric=best_val_acc`` each cell names the step of its best validation
  (``metrics.best_val_step``) where the records have it.
"""
from __future__ import annotations

import statistics
from typing import Any

from lra.report import reference as ref
from lra.report import stats
from lra.report.cells import AccuracyGroup, ExperimentCell, RowKey, row_text, source_column, source_text
from lra.report.comparisons import ALPHA, SIGNIFICANT, ComparisonRow, RunPair, measured_on, ranking_marks
from lra.report.tables import MISSING, Table, TableCell

T_TITLE = "mean ± sd [95% t-interval over seeds]"
ACROSS_TITLE = "Avg with its 95% t-interval on the stratified variance (Welch-Satterthwaite degrees of freedom)"
TASK_FIELDS = ("mean", "std", "n", "low", "high", "seeds", "values", "config", "commits", "n_test", "best_val_steps",
               "test_vs_softmax", "p_vs_softmax", "p_holm_vs_softmax", "significant")


def _row_label(key: RowKey, custom: bool) -> list[TableCell]:
    return [TableCell(key[0], data={"attention": key[0]}), _plain(source_column(custom), source_text(key, custom))]


def _plain(column: str, text: str, value: Any = None) -> TableCell:
    """A cell showing one CSV field (``value``; default: the text itself)."""
    return TableCell(text, data={column: text if value is None else value})


def fmt_ci(lo: float | None, hi: float | None, digits: int = 2) -> str:
    return f"[{lo:.{digits}f}, {hi:.{digits}f}]" if lo is not None and hi is not None else "[—]"


def _steps(cell: ExperimentCell) -> list[int | None]:
    return [cell.runs[s].best_val_step() for s in cell.seeds]


def cell_text(cell: ExperimentCell, metric: str, mark: str = "") -> tuple[str, dict[str, Any]]:
    """(text, raw figures) of one accuracy cell."""
    values = cell.values(metric)
    mean = statistics.fmean(values)
    raw: dict[str, Any] = {"mean": mean, "std": None, "n": cell.n, "low": None, "high": None}
    if cell.n >= 2:
        _, lo, hi = stats.t_interval(values)
        raw.update(std=statistics.stdev(values), low=lo, high=hi)
        text = f"{mean:.2f} ± {raw['std']:.2f} {fmt_ci(lo, hi)} n={cell.n}" + (" (1 dof)" if cell.n == 2 else "")
    else:
        text = f"{mean:.2f} n=1 (no interval)"
    if mark:
        text += f" {mark}"
    steps = _steps(cell)
    if metric == "best_val_acc" and any(s is not None for s in steps):
        known = sorted({s for s in steps if s is not None})
        text += f" @step {known[0]}" if len(known) == 1 and None not in steps else " @steps " + "/".join(
            "?" if s is None else str(s) for s in steps)
    if len(cell.commits) > 1:
        text += f" ({len(cell.commits)} commits)"
    return text, raw


def accuracy_table(group: AccuracyGroup, metric: str, family: list[ComparisonRow]) -> tuple[Table, dict[str, tuple[float, list[str]]]]:
    """The table, and each complete own row's (Avg, tasks) (protocol tables feed SMAT and the bubble chart)."""
    tasks = group.tasks
    second = source_column(group.custom)
    header = ["attention", second] + tasks + ["Avg"]
    table = Table(group.name, f"Accuracy (%), {group.where}, metric {metric}: {T_TITLE}", header)
    against = {(c.task, c.variant): c for c in family}
    marks, ranking = ({}, []) if group.custom else ranking_marks(group, metric)
    averages: dict[str, tuple[float, list[str]]] = {}
    mixed = False
    for key in group.row_keys():
        cells, means = _row_label(key, group.custom), []
        for t in tasks:
            cell = group.rows[key].get(t)
            if cell is None:
                cells.append(TableCell(MISSING, data={f"{t}_{k}": 0 if k == "n" else None for k in TASK_FIELDS}))
                continue
            comp = against.get((t, key))
            tested = comp is not None and comp.result is not None
            text, raw = cell_text(cell, metric, SIGNIFICANT if comp is not None and comp.significant else "")
            mixed |= len(cell.commits) > 1
            means.append(raw["mean"])
            steps = _steps(cell)
            raw.update(seeds=";".join(map(str, cell.seeds)), values=";".join(repr(v) for v in cell.values(metric)),
                       config=cell.config_hash, commits=";".join(cell.commits), n_test=";".join(map(str, cell.n_tests)),
                       best_val_steps=";".join("" if s is None else str(s) for s in steps)
                       if any(s is not None for s in steps) else None,
                       test_vs_softmax=comp.result.kind if tested else (comp.reason if comp else None),
                       p_vs_softmax=comp.result.p if tested else None,
                       p_holm_vs_softmax=comp.p_holm if comp is not None else None,
                       significant=("yes" if comp.significant else "no") if tested else None)
            cells.append(TableCell(text, raw["mean"], marks.get((t, key), 0), {f"{t}_{k}": raw[k] for k in TASK_FIELDS}))
        avg = statistics.fmean(means) if len(means) == len(tasks) else None
        if avg is not None and not group.custom:
            averages[key[0]] = (avg, tasks)
        cells.append(TableCell(f"{avg:.2f}" if avg is not None else MISSING, data={"avg": avg}))
        table.rows.append(cells)
    for source in ([] if group.custom else ref.accuracy_sources(group.protocol)):
        for model, vals in ref.ACCURACY_SOURCES[source].items():
            shown = [vals.get(t) for t in tasks]
            avg = statistics.fmean(shown) if all(v is not None for v in shown) else None
            table.rows.append([_plain("attention", ref.label(model)), _plain(second, source)]
                              + [TableCell(f"{v:.2f}" if v is not None else MISSING,
                                           data={f"{t}_{k}": v if k == "mean" else None for k in TASK_FIELDS})
                                 for t, v in zip(tasks, shown)]
                              + [TableCell(f"{avg:.2f}" if avg is not None else MISSING, data={"avg": avg})])
    tested = sum(c.result is not None for c in ranking)
    table.notes += [
        f"Cells: {metric} x 100, mean ± sample sd, [95% t-interval of the mean over seeds], n = seeds (the unit of "
        "replication: every seed is tested on the same examples); n=1: no interval; n=2: the interval has one degree "
        f"of freedom (half-width 12.7 sd/√2), flagged (1 dof). {MISSING} = no finished run. The LaTeX and CSV exports hold "
        "these same cells (the CSV unrounded, with each cell's seeds and tests).",
        f"{SIGNIFICANT} = the seed-level test against softmax is significant at {ALPHA:g} after Holm over this table's "
        f"declared family (table {group.file_name('significance')} lists its members); "
        f"seed-level tests need ≥ {stats.MIN_SEEDS} seeds per side.",
        f"Avg = mean over the {len(tasks)} task column(s) shown, only for rows with all of them"
        + ("" if tasks == list(ref.LRA_TASKS) else " (not the five-task LRA average)")
        + "; its interval, P(> softmax) and convergence failures: the across-task table. No marks on Avg.",
        f"Per-seed values, seed lists, config hash, commits and test-set size of every cell: the CSV and table "
        f"{group.file_name('cells')}.",
    ]
    if mixed:
        table.notes.append("(k commits): the cell's runs ran on k code versions (every stretch between resumes "
                           "counted; +hash: uncommitted edits), whose behavioural fingerprints agree.")
    if group.custom:
        table.notes.append("Runs whose command line overrode protocol-defining settings, or whose configuration differs "
                           "from the protocol row's (listed per row with its config hash; lra/report/cells.py): "
                           "not results of the protocol, never ranked.")
    else:
        refs = ref.accuracy_sources(group.protocol)
        table.notes.append(
            f"Bold = the column's best mean is significantly above the runner-up (seed-level test; Holm over this "
            f"table's ranking tests: {tested} of {len(ranking)} could be run); underlined = the runner-up is also significantly "
            "above the third. No mark: not shown to differ (always so where the best has < 3 seeds)."
            + (f" Reference rows: {', '.join(refs)} (same protocol; published means, no intervals)." if refs else
               " No published figures follow this protocol."))
    return table, averages


def cells_table(group: AccuracyGroup, metric: str) -> Table:
    """Where each cell comes from: its experiment identity, seeds, per-seed values, commits, test set."""
    name = group.file_name("cells")
    header = ["attention", source_column(group.custom), "task", "config", "seeds", f"{metric} x 100 per seed",
              "commits", "test examples"]
    table = Table(name, f"Cells of the accuracy table, {group.where}: one experiment each", header)
    for key in group.row_keys():
        for task in group.tasks:
            cell = group.rows[key].get(task)
            if cell is None:
                continue
            steps = _steps(cell)
            per_seed = [f"{v:.2f}" + (f"@{st}" if metric == "best_val_acc" and st is not None else "")
                        for v, st in zip(cell.values(metric), steps)]
            commits = ", ".join(cell.commits) + (" (mixed)" if len(cell.commits) > 1 else "")
            table.rows.append(_row_label(key, group.custom) + [
                _plain("task", task), _plain("config", cell.config_hash),
                TableCell(", ".join(map(str, cell.seeds)), data={"seeds": ";".join(map(str, cell.seeds))}),
                TableCell(", ".join(per_seed), data={"values": ";".join(repr(v) for v in cell.values(metric)),
                                                     "best_val_steps": ";".join("" if s is None else str(s) for s in steps)}),
                TableCell(commits, data={"commits": ";".join(cell.commits)}),
                TableCell(", ".join(map(str, cell.n_tests)) or "unknown",
                          data={"n_test": ";".join(map(str, cell.n_tests)),
                                "run_ids": ";".join(cell.runs[s].run_id for s in cell.seeds)})])
    table.notes += [
        "config = SHA-1 of the run's experiment identity without its seed (lra.identity.identity applied to the "
        "record's config: the resume key's definition); runs pool only when it is equal.",
        "commits = the code versions (git; +hash: with uncommitted edits) that every stretch of the runs ran on, "
        "pooled only where the runs' behavioural fingerprints agree; test examples = size of the test set of the "
        "prediction files."
        + (" @N = step of the best validation (metrics.best_val_step)." if metric == "best_val_acc" else ""),
    ]
    return table


def _comparison_rows(table: Table, comps: list[ComparisonRow]) -> None:
    for c in comps:
        r = c.result
        vm, bm = c.means if c.means is not None else (None, None)
        cells = [_plain("task", c.task), _plain("variant", row_text(c.variant)), _plain("baseline", row_text(c.baseline))]
        means = [TableCell(MISSING if m is None else f"{m:.2f}", data={k: m})
                 for k, m in (("variant_mean", vm), ("baseline_mean", bm))]
        if r is None:
            table.rows.append(cells + [TableCell(f"not tested: {c.reason}", data={"test": c.reason}),
                                       TableCell(MISSING, data={"n": None, "n_baseline": None}), *means,
                                       TableCell(MISSING, data={"diff": None}), TableCell(MISSING, data={"low": None, "high": None}),
                                       TableCell(MISSING, data={"p": None}), TableCell(MISSING, data={"p_holm": None}),
                                       TableCell(MISSING, data={"significant": None})])
            continue
        seeds = f"{r.n} pairs" if r.n_baseline is None else f"{r.n} / {r.n_baseline}"
        sig = "yes" if c.significant else "no"
        table.rows.append(cells + [_plain("test", r.kind), TableCell(seeds, data={"n": r.n, "n_baseline": r.n_baseline}),
                                   *means, TableCell(f"{r.diff:+.2f}", data={"diff": r.diff}),
                                   TableCell(fmt_ci(r.low, r.high), data={"low": r.low, "high": r.high}),
                                   TableCell(f"{r.p:.3g}", data={"p": r.p}), TableCell(f"{c.p_holm:.3g}", data={"p_holm": c.p_holm}),
                                   _plain("significant", sig)])


def _seed_test_notes(n_tested: int, members: str) -> list[str]:
    return [
        f"Seed-level tests need ≥ {stats.MIN_SEEDS} seeds per side and cells one experiment apart from the attention. "
        "Each test is over the seeds its cells display: paired t when both cells hold the same seeds (seeds = "
        "pairs), else Welch's t over all seeds of each side (seeds = variant / baseline), never a paired t over the "
        "common seeds alone. Standard deviations are floored at one example (100 / examples points, of the set the "
        "metric is measured on): accuracies move in steps of one example, so a smaller spread is rounding, not agreement.",
        f"diff = variant mean - baseline mean (the displayed means) in accuracy points with its 95% t-interval. Holm "
        f"over the {n_tested} tested member(s): {members or 'none'}.",
    ]


COMPARISON_HEADER = ["task", "variant", "baseline", "test", "seeds", "variant mean", "baseline mean", "diff (pp)", "95% CI",
                     "p", "p (Holm)", "significant"]


def significance_table(group: AccuracyGroup, family: list[ComparisonRow]) -> Table | None:
    if not family:
        return None
    name = group.file_name("significance")
    table = Table(name, f"Seed-level tests against softmax, {group.where}: the declared family, Holm-corrected", COMPARISON_HEADER)
    _comparison_rows(table, family)
    tested = [c for c in family if c.result is not None]
    table.notes += _seed_test_notes(len(tested), "; ".join(f"{row_text(c.variant)} vs {row_text(c.baseline)} on {c.task}"
                                                              for c in tested))
    table.notes.append(f"The family: every variant against the softmax row with the same labels, per task, in this "
                       f"table only. significant = p (Holm) < {ALPHA:g}: what earns {SIGNIFICANT} in the accuracy table.")
    return table


def exploratory_table(group: AccuracyGroup, pair: tuple[str, str], comps: list[ComparisonRow]) -> Table:
    name = group.file_name("compare")
    table = Table(name, f"Exploratory comparison report.compare=[{pair[0]},{pair[1]}], {group.where}", COMPARISON_HEADER)
    _comparison_rows(table, comps)
    tested = [c for c in comps if c.result is not None]
    table.notes += _seed_test_notes(len(tested), "; ".join(f"{c.task}" for c in tested))
    table.notes.append(f"Asked for on the command line, after the fact: corrected among themselves only, outside the "
                       f"declared family, never marked {SIGNIFICANT} or bold.")
    return table


def run_pairs_table(group: AccuracyGroup, pairs: list[RunPair]) -> Table | None:
    if not pairs:
        return None
    name = group.file_name("runpairs")
    header = ["task", "variant", "baseline", "seed", "runs", "examples", "diff (pp)", "95% CI", "p"]
    table = Table(name, f"Run pairs, {group.where}: McNemar mid-p on the same test examples, 95% paired "
                        f"{stats.BOOTSTRAP_METHOD} over examples", header)
    for p in pairs:
        r = p.result
        table.rows.append([_plain("task", p.task), _plain("variant", row_text(p.variant)), _plain("baseline", row_text(p.baseline)),
                           TableCell(str(p.seed), data={"seed": p.seed}),
                           TableCell(f"{p.runs[0]} vs {p.runs[1]}", data={"run_variant": p.runs[0], "run_baseline": p.runs[1]}),
                           TableCell(str(r.n), data={"n": r.n}), TableCell(f"{r.diff:+.2f}", data={"diff": r.diff}),
                           TableCell(fmt_ci(r.low, r.high), data={"low": r.low, "high": r.high}),
                           TableCell(f"{r.p:.3g}", data={"p": r.p})])
    table.notes += [
        "These test whether two trained networks (one run each) differ on this test set: a statement about this pair "
        "of runs, not about the architectures (two seeds of one architecture differ this way too). Uncorrected, outside "
        f"the declared family, never marked. Shown only where no seed-level test could be run (< {stats.MIN_SEEDS} seeds).",
    ]
    return table


def _failures(cell: ExperimentCell) -> tuple[int, int]:
    """(runs in the chance band, runs with predictions) of a cell, judged on their test accuracy."""
    bad = 0
    runs = cell.with_predictions
    for r in runs:
        _, edge = stats.chance_band(r.preds["label"])
        bad += float(r.preds["correct"].mean()) <= edge
    return bad, len(runs)


def _floor(cell: ExperimentCell, metric: str) -> float:
    """The cell's spread floor (one example of the set its metric is measured on); 0 where unknown."""
    sizes = {measured_on(r, metric) for r in cell.runs.values()}
    return stats.spread_floor(sizes.pop()) if len(sizes) == 1 and None not in sizes else 0.0


def avg_interval(group: AccuracyGroup, key: Any, metric: str) -> tuple[float, float, float] | None:
    """A row's Avg over the group's tasks with its 95% interval (the stratified t-interval, sd floored
    at one example per task), or None where a task is missing or has fewer than MIN_SEEDS seeds: the
    across table's figure, which the bubble chart draws as its error bar."""
    per = group.rows.get(key, {})
    if any(t not in per or per[t].n < stats.MIN_SEEDS for t in group.tasks) or not group.tasks:
        return None
    values = [per[t].values(metric) for t in group.tasks]
    return stats.stratified_t_interval(values, [_floor(per[t], metric) for t in group.tasks])


def across_table(group: AccuracyGroup, metric: str) -> Table:
    """Avg with its stratified t-interval, P(row > softmax) and convergence failures."""
    name = group.file_name("across")
    tasks = group.tasks
    header = ["attention", source_column(group.custom), "tasks", "Avg [95% CI]", "P(> softmax)", "convergence failures"]
    table = Table(name, f"Across tasks, {group.where}, metric {metric}: {ACROSS_TITLE}", header)
    for key in group.row_keys():
        per = group.rows[key]
        row_tasks = [t for t in tasks if t in per]
        values = [per[t].values(metric) for t in row_tasks]
        replicated = all(len(v) >= stats.MIN_SEEDS for v in values)
        avg = TableCell(MISSING, data={"avg": None, "avg_low": None, "avg_high": None})
        if row_tasks == tasks:
            if replicated:
                mean, lo, hi = avg_interval(group, key, metric)
                avg = TableCell(f"{mean:.2f} {fmt_ci(lo, hi)}", mean, data={"avg": mean, "avg_low": lo, "avg_high": hi})
            else:
                mean = statistics.fmean(statistics.fmean(v) for v in values)
                avg = TableCell(f"{mean:.2f} (no interval: < {stats.MIN_SEEDS} seeds in a task)", mean,
                                data={"avg": mean, "avg_low": None, "avg_high": None})
        base = group.rows.get(("softmax", key[1]))
        poi = TableCell(MISSING, data={"p_improve": None, "p_improve_tasks": None})
        if base is not None and key[0] != "softmax":
            common = [t for t in row_tasks if t in base]
            if common and all(per[t].n >= stats.MIN_SEEDS and base[t].n >= stats.MIN_SEEDS for t in common):
                p = stats.probability_of_improvement([per[t].values(metric) for t in common],
                                                     [base[t].values(metric) for t in common])
                poi = TableCell(f"{p:.2f} ({len(common)} task{'s' * (len(common) > 1)})", p,
                                data={"p_improve": p, "p_improve_tasks": ";".join(common)})
            elif common:
                poi = TableCell(f"— (needs ≥ {stats.MIN_SEEDS} seeds per side per task)",
                                data={"p_improve": None, "p_improve_tasks": None})
        bad = [_failures(per[t]) for t in row_tasks]
        failed, judged = sum(b for b, _ in bad), sum(n for _, n in bad)
        fail = TableCell(f"{failed}/{judged}" if judged else "unknown (no predictions)",
                         data={"failed_runs": failed, "runs_with_predictions": judged})
        table.rows.append(_row_label(key, group.custom) + [_plain("tasks", ", ".join(row_tasks), ";".join(row_tasks)),
                                                           avg, poi, fail])
    table.notes += [
        f"Avg = mean over the table's {len(tasks)} task(s) ({', '.join(tasks)})"
        + ("" if tasks == list(ref.LRA_TASKS) else ": not the five-task LRA average")
        + f"; its interval needs ≥ {stats.MIN_SEEDS} seeds in every task: mean ± t_dof · √(Σ s_k²/n_k) / K over the K "
        "tasks, s_k each task's sd over seeds (floored at one example where the set size is known), dof by "
        "Welch-Satterthwaite; with one task, the cell's t-interval with its sd floored at one example (wider than the "
        "cell's interval where the seeds differ by less than one example). Its coverage in simulation: 94.5-95.7% at 3 or 5 seeds "
        "per task (the stratified percentile bootstrap used before: 74-87%).",
        "P(> softmax) = probability of improvement (rliable, Agarwal et al. 2021): over the tasks both rows ran, the "
        "mean of P(a seed of this row scores above a seed of softmax), ties 1/2; 0.5 = no difference. A description, "
        "without an interval: its stratified bootstrap covered 85-93% at 3-5 seeds per side. The seed-level tests "
        "are the inference.",
        "Convergence failures = runs (with prediction files) whose test accuracy lies in the chance band: at or below "
        "the majority-class accuracy of the test set plus 1.96 of its binomial standard errors (a known LRA failure "
        "mode, e.g. Pathfinder).",
    ]
    return table
