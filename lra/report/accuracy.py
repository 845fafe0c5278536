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
  an interval or a mark; its interval and the probability of improvement over softmax are in the
  across-task table (stratified bootstrap), with the convergence-failure rate.
* With ``report.metric=best_val_acc`` each cell names the step of its best validation
  (``metrics.best_val_step``) where the records have it.
"""
from __future__ import annotations

import statistics
from typing import Any

from lra.report import reference as ref
from lra.report import stats
from lra.report.cells import AccuracyGroup, Cell, RowKey, labels_text, row_text
from lra.report.comparisons import ALPHA, SIGNIFICANT, ComparisonRow, RunPair, ranking_marks
from lra.report.tables import MISSING, Cell as TCell, Table, slug

OWN = "run"
T_TITLE = "mean ± sd [95% t-interval over seeds]"
BOOT_TITLE = f"95% stratified {stats.BOOTSTRAP_METHOD} (seeds resampled within each task)"


def _labels(key: RowKey, custom: bool) -> str:
    return labels_text(key[1]) if custom else OWN


def _row_label(key: RowKey, custom: bool) -> list[TCell]:
    return [TCell(key[0]), TCell(_labels(key, custom))]


def fmt_ci(lo: float | None, hi: float | None, digits: int = 2) -> str:
    return f"[{lo:.{digits}f}, {hi:.{digits}f}]" if lo is not None and hi is not None else "[—]"


def _steps(cell: Cell) -> list[int | None]:
    return [cell.runs[s].best_val_step() for s in cell.seeds]


def cell_text(cell: Cell, metric: str, mark: str = "") -> tuple[str, str, dict[str, Any]]:
    """(markdown text, LaTeX text, raw figures) of one accuracy cell."""
    values = cell.values(metric)
    mean = statistics.fmean(values)
    raw: dict[str, Any] = {"mean": mean, "std": None, "n": cell.n, "low": None, "high": None}
    if cell.n >= 2:
        _, lo, hi = stats.t_interval(values)
        raw.update(std=statistics.stdev(values), low=lo, high=hi)
        text = f"{mean:.2f} ± {raw['std']:.2f} {fmt_ci(lo, hi)} n={cell.n}" + (" (1 dof)" if cell.n == 2 else "")
        tex = f"{mean:.1f}$\\pm${(hi - lo) / 2:.1f}"
    else:
        text, tex = f"{mean:.2f} n=1 (no interval)", f"{mean:.1f}"
    if cell.n < stats.MIN_SEEDS:
        tex += f"$_{{n={cell.n}}}$"
    if mark:
        text, tex = text + f" {mark}", tex + "$^\\dagger$"
    steps = _steps(cell)
    if metric == "best_val_acc" and any(s is not None for s in steps):
        known = sorted({s for s in steps if s is not None})
        text += f" @step {known[0]}" if len(known) == 1 and None not in steps else " @steps " + "/".join(
            "?" if s is None else str(s) for s in steps)
    if len(cell.commits) > 1:
        text += f" ({len(cell.commits)} commits)"
    return text, tex, raw


def accuracy_table(group: AccuracyGroup, metric: str, family: list[ComparisonRow]) -> tuple[Table, dict[str, tuple[float, list[str]]]]:
    """The table, and each complete own row's (Avg, tasks) (protocol tables feed SMAT and the bubble chart)."""
    tasks = group.tasks
    second = "differs in" if group.custom else "source"
    header = ["attention", second] + tasks + ["Avg"]
    csv_header = ["attention", second] + [f"{t}_{k}" for t in tasks for k in (
        "mean", "std", "n", "low", "high", "seeds", "values", "config", "commits", "n_test", "best_val_steps",
        "test_vs_softmax", "p_vs_softmax", "p_holm_vs_softmax", "significant")] + ["avg"]
    table = Table(group.name, f"Accuracy (%), {group.where}, metric {metric}: {T_TITLE}", header, csv_header=csv_header)
    against = {(c.task, c.variant): c for c in family}
    marks, ranking = ({}, []) if group.custom else ranking_marks(group, metric)
    averages: dict[str, tuple[float, list[str]]] = {}
    mixed = False
    for key in group.row_keys():
        cells, raw_row, means = _row_label(key, group.custom), [key[0], _labels(key, group.custom)], []
        for t in tasks:
            cell = group.rows[key].get(t)
            if cell is None:
                cells.append(TCell(MISSING))
                raw_row += [None, None, 0] + [None] * 12
                continue
            comp = against.get((t, key))
            text, tex, raw = cell_text(cell, metric, SIGNIFICANT if comp is not None and comp.significant else "")
            mixed |= len(cell.commits) > 1
            means.append(raw["mean"])
            cells.append(TCell(text, raw["mean"], marks.get((t, key), 0), tex))
            steps = _steps(cell)
            raw_row += [raw["mean"], raw["std"], raw["n"], raw["low"], raw["high"], ";".join(map(str, cell.seeds)),
                        ";".join(repr(v) for v in cell.values(metric)), cell.config_hash, ";".join(cell.commits),
                        ";".join(map(str, cell.n_tests)), ";".join("" if s is None else str(s) for s in steps)
                        if any(s is not None for s in steps) else None,
                        comp.result.kind if comp is not None and comp.result is not None else (comp.reason if comp else None),
                        comp.result.p if comp is not None and comp.result is not None else None,
                        comp.p_holm if comp is not None else None,
                        ("yes" if comp.significant else "no") if comp is not None and comp.result is not None else None]
        avg = statistics.fmean(means) if len(means) == len(tasks) else None
        if avg is not None and not group.custom:
            averages[key[0]] = (avg, tasks)
        cells.append(TCell(f"{avg:.2f}" if avg is not None else MISSING, tex=f"{avg:.1f}" if avg is not None else "--"))
        table.rows.append(cells)
        table.csv_rows.append(raw_row + [avg])
    for source in ([] if group.custom else ref.accuracy_sources(group.protocol)):
        for model, vals in ref.ACCURACY_SOURCES[source].items():
            shown = [vals.get(t) for t in tasks]
            avg = statistics.fmean(shown) if all(v is not None for v in shown) else None
            table.rows.append([TCell(ref.label(model)), TCell(source)]
                              + [TCell(f"{v:.2f}" if v is not None else MISSING) for v in shown]
                              + [TCell(f"{avg:.2f}" if avg is not None else MISSING)])
            table.csv_rows.append([ref.label(model), source] + [x for v in shown for x in (v, *([None] * 14))] + [avg])
    tested = sum(c.result is not None for c in ranking)
    table.notes += [
        f"Cells: {metric} x 100, mean ± sample sd, [95% t-interval of the mean over seeds], n = seeds (the unit of "
        "replication: every seed is tested on the same examples); n=1: no interval; n=2: the interval has one degree "
        f"of freedom (half-width 12.7 sd/√2), flagged (1 dof). {MISSING} = no finished run. LaTeX cells: mean ± half-width "
        "of the interval, subscript n where n < 3.",
        f"{SIGNIFICANT} = the seed-level test against softmax is significant at {ALPHA:g} after Holm over this table's "
        f"declared family (table significance_{'custom_' if group.custom else ''}{slug(group.protocol)} lists its members); "
        f"seed-level tests need ≥ {stats.MIN_SEEDS} seeds per side.",
        f"Avg = mean over the {len(tasks)} task column(s) shown, only for rows with all of them"
        + ("" if tasks == list(ref.LRA_TASKS) else " (not the five-task LRA average)")
        + "; its interval, P(> softmax) and convergence failures: the across-task table. No marks on Avg.",
        f"Per-seed values, seed lists, config hash, commits and test-set size of every cell: the CSV and table "
        f"cells_{'custom_' if group.custom else ''}{slug(group.protocol)}.",
    ]
    if mixed:
        table.notes.append("(k commits): the cell pools runs of one configuration made by k code versions.")
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
    name = f"cells_{'custom_' if group.custom else ''}{slug(group.protocol)}"
    header = ["attention", "differs in" if group.custom else "source", "task", "config", "seeds", f"{metric} x 100 per seed",
              "commits", "test examples"]
    table = Table(name, f"Cells of the accuracy table, {group.where}: one experiment each", header,
                  csv_header=header[:3] + ["config", "seeds", "values", "best_val_steps", "commits", "n_test", "run_ids"])
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
                TCell(task), TCell(cell.config_hash), TCell(", ".join(map(str, cell.seeds))), TCell(", ".join(per_seed)),
                TCell(commits), TCell(", ".join(map(str, cell.n_tests)) or "unknown")])
            table.csv_rows.append([key[0], _labels(key, group.custom), task, cell.config_hash, ";".join(map(str, cell.seeds)),
                                   ";".join(repr(v) for v in cell.values(metric)),
                                   ";".join("" if s is None else str(s) for s in steps), ";".join(cell.commits),
                                   ";".join(map(str, cell.n_tests)), ";".join(cell.runs[s].run_id for s in cell.seeds)])
    table.notes += [
        "config = SHA-1 of the run's experiment identity without its seed (lra.identity.identity applied to the "
        "record's config: the resume key's definition); runs pool only when it is equal.",
        "commits = the code versions (git) that made the runs; test examples = size of the test set of the prediction files."
        + (" @N = step of the best validation (metrics.best_val_step)." if metric == "best_val_acc" else ""),
    ]
    return table


def _comparison_rows(table: Table, comps: list[ComparisonRow]) -> None:
    for c in comps:
        r = c.result
        base = [TCell(c.task), TCell(row_text(c.variant)), TCell(row_text(c.baseline))]
        if r is None:
            table.rows.append(base + [TCell(f"not tested: {c.reason}")] + [TCell(MISSING)] * 6)
            table.csv_rows.append([c.task, row_text(c.variant), row_text(c.baseline), c.reason] + [None] * 8)
            continue
        seeds = f"{r.n} pairs" if r.n_baseline is None else f"{r.n} / {r.n_baseline}"
        table.rows.append(base + [TCell(r.kind), TCell(seeds), TCell(f"{r.diff:+.2f}"), TCell(fmt_ci(r.low, r.high)),
                                  TCell(f"{r.p:.3g}"), TCell(f"{c.p_holm:.3g}"), TCell("yes" if c.significant else "no")])
        table.csv_rows.append([c.task, row_text(c.variant), row_text(c.baseline), r.kind, r.n, r.n_baseline, r.diff,
                               r.low, r.high, r.p, c.p_holm, "yes" if c.significant else "no"])


def _seed_test_notes(n_tested: int, members: str) -> list[str]:
    return [
        f"Seed-level tests need ≥ {stats.MIN_SEEDS} seeds per side and cells one experiment apart from the attention. "
        f"Paired t over the common seeds when ≥ {stats.MIN_SEEDS} are common (seeds = pairs), else Welch's t over "
        "all seeds (seeds = variant / baseline). Standard deviations are floored at one test example (100 / test "
        "examples points): accuracies move in steps of one example, so a smaller spread is rounding, not agreement.",
        f"diff = variant - baseline in accuracy points with its 95% t-interval. Holm over the {n_tested} tested "
        f"member(s): {members or 'none'}.",
    ]


COMPARISON_HEADER = ["task", "variant", "baseline", "test", "seeds", "diff (pp)", "95% CI", "p", "p (Holm)", "significant"]
COMPARISON_CSV = ["task", "variant", "baseline", "test", "n", "n_baseline", "diff", "low", "high", "p", "p_holm", "significant"]


def significance_table(group: AccuracyGroup, family: list[ComparisonRow]) -> Table | None:
    if not family:
        return None
    name = f"significance_{'custom_' if group.custom else ''}{slug(group.protocol)}"
    table = Table(name, f"Seed-level tests against softmax, {group.where}: the declared family, Holm-corrected", COMPARISON_HEADER,
                  csv_header=COMPARISON_CSV)
    _comparison_rows(table, family)
    tested = [c for c in family if c.result is not None]
    table.notes += _seed_test_notes(len(tested), "; ".join(f"{row_text(c.variant)} vs {row_text(c.baseline)} on {c.task}"
                                                              for c in tested))
    table.notes.append(f"The family: every variant against the softmax row with the same labels, per task, in this "
                       f"table only. significant = p (Holm) < {ALPHA:g}: what earns {SIGNIFICANT} in the accuracy table.")
    return table


def exploratory_table(group: AccuracyGroup, pair: tuple[str, str], comps: list[ComparisonRow]) -> Table:
    name = f"compare_{'custom_' if group.custom else ''}{slug(group.protocol)}"
    table = Table(name, f"Exploratory comparison report.compare=[{pair[0]},{pair[1]}], {group.where}", COMPARISON_HEADER,
                  csv_header=COMPARISON_CSV)
    _comparison_rows(table, comps)
    tested = [c for c in comps if c.result is not None]
    table.notes += _seed_test_notes(len(tested), "; ".join(f"{c.task}" for c in tested))
    table.notes.append(f"Asked for on the command line, after the fact: corrected among themselves only, outside the "
                       f"declared family, never marked {SIGNIFICANT} or bold.")
    return table


def run_pairs_table(group: AccuracyGroup, pairs: list[RunPair]) -> Table | None:
    if not pairs:
        return None
    name = f"runpairs_{'custom_' if group.custom else ''}{slug(group.protocol)}"
    header = ["task", "variant", "baseline", "seed", "runs", "examples", "diff (pp)", "95% CI", "p"]
    table = Table(name, f"Run pairs, {group.where}: McNemar mid-p on the same test examples, 95% paired "
                        f"{stats.BOOTSTRAP_METHOD} over examples", header,
                  csv_header=["task", "variant", "baseline", "seed", "run_variant", "run_baseline", "n", "diff", "low", "high", "p"])
    for p in pairs:
        r = p.result
        table.rows.append([TCell(p.task), TCell(row_text(p.variant)), TCell(row_text(p.baseline)), TCell(str(p.seed)),
                           TCell(f"{p.runs[0]} vs {p.runs[1]}"), TCell(str(r.n)), TCell(f"{r.diff:+.2f}"),
                           TCell(fmt_ci(r.low, r.high)), TCell(f"{r.p:.3g}")])
        table.csv_rows.append([p.task, row_text(p.variant), row_text(p.baseline), p.seed, *p.runs, r.n, r.diff, r.low, r.high, r.p])
    table.notes += [
        "These test whether two trained networks (one run each) differ on this test set: a statement about this pair "
        "of runs, not about the architectures (two seeds of one architecture differ this way too). Uncorrected, outside "
        f"the declared family, never marked. Shown only where no seed-level test could be run (< {stats.MIN_SEEDS} seeds).",
    ]
    return table


def _failures(cell: Cell) -> tuple[int, int]:
    """(runs in the chance band, runs with predictions) of a cell, judged on their test accuracy."""
    bad = 0
    runs = cell.with_predictions
    for r in runs:
        _, edge = stats.chance_band(r.preds["label"])
        bad += float(r.preds["correct"].mean()) <= edge
    return bad, len(runs)


def across_table(group: AccuracyGroup, metric: str) -> Table:
    """Avg with its stratified bootstrap interval, P(row > softmax) and convergence failures."""
    name = f"across_{'custom_' if group.custom else ''}{slug(group.protocol)}"
    tasks = group.tasks
    header = ["attention", "differs in" if group.custom else "source", "tasks", "Avg [95% CI]", "P(> softmax) [95% CI]",
              "convergence failures"]
    table = Table(name, f"Across tasks, {group.where}, metric {metric}: {BOOT_TITLE}", header,
                  csv_header=["attention", header[1], "tasks", "avg", "avg_low", "avg_high", "p_improve", "p_improve_low",
                              "p_improve_high", "p_improve_tasks", "failed_runs", "runs_with_predictions"])
    for key in group.row_keys():
        per = group.rows[key]
        row_tasks = [t for t in tasks if t in per]
        values = [per[t].values(metric) for t in row_tasks]
        replicated = all(len(v) >= stats.MIN_SEEDS for v in values)
        avg_text, avg_raw = MISSING, [None, None, None]
        if row_tasks == tasks:
            if replicated:
                mean, lo, hi = stats.stratified_bootstrap_mean(values)
                avg_text, avg_raw = f"{mean:.2f} {fmt_ci(lo, hi)}", [mean, lo, hi]
            else:
                mean = statistics.fmean(statistics.fmean(v) for v in values)
                avg_text, avg_raw = f"{mean:.2f} (no interval: < {stats.MIN_SEEDS} seeds in a task)", [mean, None, None]
        base = group.rows.get(("softmax", key[1]))
        poi_text, poi_raw = MISSING, [None, None, None, None]
        if base is not None and key[0] != "softmax":
            common = [t for t in row_tasks if t in base]
            if common and all(per[t].n >= stats.MIN_SEEDS and base[t].n >= stats.MIN_SEEDS for t in common):
                p, lo, hi = stats.probability_of_improvement([per[t].values(metric) for t in common],
                                                             [base[t].values(metric) for t in common])
                poi_text, poi_raw = f"{p:.2f} {fmt_ci(lo, hi)} ({len(common)} task{'s' * (len(common) > 1)})", [p, lo, hi, ";".join(common)]
            elif common:
                poi_text = f"— (needs ≥ {stats.MIN_SEEDS} seeds per side per task)"
        bad = [_failures(per[t]) for t in row_tasks]
        failed, judged = sum(b for b, _ in bad), sum(n for _, n in bad)
        fail_text = f"{failed}/{judged}" if judged else "unknown (no predictions)"
        table.rows.append(_row_label(key, group.custom) + [TCell(", ".join(row_tasks)), TCell(avg_text), TCell(poi_text),
                                                           TCell(fail_text)])
        table.csv_rows.append([key[0], _labels(key, group.custom), ";".join(row_tasks), *avg_raw, *poi_raw, failed, judged])
    table.notes += [
        f"Avg = mean over the table's {len(tasks)} task(s) ({', '.join(tasks)})"
        + ("" if tasks == list(ref.LRA_TASKS) else ": not the five-task LRA average")
        + f"; its interval needs ≥ {stats.MIN_SEEDS} seeds in every task.",
        "P(> softmax) = probability of improvement (rliable, Agarwal et al. 2021): over the tasks both rows ran, the "
        "mean of P(a seed of this row scores above a seed of softmax), ties 1/2; 0.5 = no difference. Same bootstrap, "
        "both sides resampled.",
        "Convergence failures = runs (with prediction files) whose test accuracy lies in the chance band: at or below "
        "the majority-class accuracy of the test set plus 1.96 of its binomial standard errors (a known LRA failure "
        "mode, e.g. Pathfinder).",
    ]
    return table
