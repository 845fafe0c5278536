"""Accuracy side of the report: tables with intervals and significance marks, paired comparisons,
accuracy by length and learning curves (statistics in :mod:`lra.report.stats`, protocol rules in
:mod:`lra.report.protocols`).

Rules, written down:

* A table is one training protocol's runs, or the "custom" runs of a protocol (overridden
  protocol-defining settings; each row lists its overrides and never fills a protocol cell). A row
  is (attention, overrides); a cell is one task; a seed run twice counts once (the newest record).
* Cell: ``report.metric`` x 100, ``mean ± sample std [95% low, high] n=<seeds>``: a t-interval over
  seeds when n >= 2, a bootstrap over test examples when n = 1 (only for ``test_acc``: the examples
  are the test set's).
* Comparisons: every variant against softmax (same table, same overrides), per task, plus the pair
  named by ``report.compare``. Paired t over common seeds when >= 2, otherwise McNemar mid-p on the
  test examples of one run each (only if both runs saw the same test set: equal label sequences).
  Holm over all comparisons of the table; † marks a variant cell whose difference from softmax
  survives Holm at 5%.
* Accuracy by length: test examples split at the quartiles of their real length (for two-document
  tasks the sum of both documents), accuracy pooled over seeds.
* Learning curves: validation accuracy at each evaluation from the records; mean over seeds with a
  min-max band.
"""
from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lra.report import reference as ref
from lra.report import stats
from lra.report.protocols import protocol_overrides
from lra.records import load_predictions
from lra.report.tables import MISSING, Cell, Table, emphasise, slug

OWN = "run"
SIGNIFICANT = "†"
ALPHA = 0.05

RowKey = tuple[str, tuple[str, ...]]  # (attention, protocol-defining overrides)


def order(name: str) -> tuple[int, str]:
    return (0 if name == "softmax" else 1, name)


def task_order(task: str) -> tuple[int, str]:
    return (ref.LRA_TASKS.index(task), "") if task in ref.LRA_TASKS else (len(ref.LRA_TASKS), task)


def chrono(rec: dict[str, Any]) -> tuple[str, str]:
    return (str(rec.get("started_at") or ""), str(rec["run_id"]))


@dataclass
class AccuracyGroup:
    """One accuracy table's runs: row -> task -> seed -> record (the newest per seed)."""
    protocol: str
    custom: bool
    rows: dict[RowKey, dict[str, dict[Any, dict[str, Any]]]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        return f"accuracy_{'custom_' if self.custom else ''}{slug(self.protocol)}"

    @property
    def tasks(self) -> list[str]:
        return sorted({t for per in self.rows.values() for t in per}, key=task_order)

    def row_keys(self) -> list[RowKey]:
        return sorted(self.rows, key=lambda k: (order(k[0]), k[1]))


def accuracy_groups(records: list[dict[str, Any]], metric: str) -> list[AccuracyGroup]:
    latest: dict[tuple, dict[str, Any]] = {}
    for rec in records:
        value = (rec.get("metrics") or {}).get(metric)
        if rec.get("mode") != "train" or rec.get("status") != "finished" or not isinstance(value, (int, float)):
            continue
        over = protocol_overrides(rec)
        key = (str(rec.get("protocol")), bool(over), (rec["attention"], over), rec["task"], rec.get("seed"))
        if key not in latest or chrono(rec) > chrono(latest[key]):
            latest[key] = rec
    groups: dict[tuple[str, bool], AccuracyGroup] = {}
    for (protocol, custom, row, task, seed), rec in latest.items():
        g = groups.setdefault((protocol, custom), AccuracyGroup(protocol, custom))
        g.rows.setdefault(row, {}).setdefault(task, {})[seed] = rec
    return [groups[k] for k in sorted(groups)]


def _value(rec: dict[str, Any], metric: str) -> float:
    return 100.0 * float(rec["metrics"][metric])


class Predictions:
    """Loads each record's per-example arrays once."""

    def __init__(self, results_dir: str | Path) -> None:
        self.results_dir, self.cache = Path(results_dir), {}

    def __call__(self, rec: dict[str, Any]) -> dict[str, np.ndarray] | None:
        rid = rec["run_id"]
        if rid not in self.cache:
            self.cache[rid] = load_predictions(self.results_dir, rec)
        return self.cache[rid]


@dataclass
class CellStats:
    mean: float
    std: float | None
    n: int
    low: float | None
    high: float | None
    kind: str  # "t (seeds)" | "bootstrap (examples)" | "none"


def cell_stats(runs: dict[Any, dict[str, Any]], metric: str, preds: Predictions) -> CellStats:
    seeds = sorted(runs, key=str)
    values = [_value(runs[s], metric) for s in seeds]
    if len(values) >= 2:
        mean, lo, hi = stats.t_interval(values)
        return CellStats(mean, statistics.stdev(values), len(values), lo, hi, "t (seeds)")
    p = preds(runs[seeds[0]]) if metric == "test_acc" else None
    if p is not None and p["correct"].size:
        _, lo, hi = stats.bootstrap_interval(p["correct"])
        return CellStats(values[0], None, 1, 100 * lo, 100 * hi, "bootstrap (examples)")
    return CellStats(values[0], None, 1, None, None, "none")


@dataclass
class ComparisonRow:
    task: str
    variant: RowKey
    baseline: RowKey
    result: stats.Comparison | None
    reason: str = ""
    p_holm: float | None = None

    @property
    def significant(self) -> bool:
        return self.p_holm is not None and self.p_holm < ALPHA


def compare(variant: dict[Any, dict], baseline: dict[Any, dict], metric: str, preds: Predictions) -> tuple[stats.Comparison | None, str]:
    common = sorted(set(variant) & set(baseline), key=str)
    if len(common) >= 2:
        return stats.paired_t([_value(variant[s], metric) for s in common], [_value(baseline[s], metric) for s in common]), ""
    if metric != "test_acc":
        return None, f"one common seed and metric {metric}: no per-example test"
    vs = common[0] if common else min(variant, key=str)
    bs = common[0] if common else min(baseline, key=str)
    pv, pb = preds(variant[vs]), preds(baseline[bs])
    if pv is None or pb is None:
        return None, "no per-example predictions in the record"
    if pv["label"].shape != pb["label"].shape or not np.array_equal(pv["label"], pb["label"]):
        return None, "different test sets"
    c = stats.paired_examples(pv["correct"], pb["correct"])
    return stats.Comparison(c.kind, c.n, 100 * c.diff, 100 * c.low, 100 * c.high, c.p), ""


def comparisons(group: AccuracyGroup, metric: str, preds: Predictions, pair: tuple[str, str] | None) -> list[ComparisonRow]:
    """Every variant against softmax (same overrides), then the named pair; Holm over the table."""
    out: list[ComparisonRow] = []
    wanted: list[tuple[RowKey, RowKey]] = []
    for key in group.row_keys():
        base = ("softmax", key[1])
        if key[0] != "softmax" and base in group.rows:
            wanted.append((key, base))
    if pair:
        for over in sorted({k[1] for k in group.rows}):
            a, b = (pair[0], over), (pair[1], over)
            if a in group.rows and b in group.rows and (a, b) not in wanted:
                wanted.append((a, b))
    for task in group.tasks:
        for a, b in wanted:
            if task in group.rows[a] and task in group.rows[b]:
                result, reason = compare(group.rows[a][task], group.rows[b][task], metric, preds)
                out.append(ComparisonRow(task, a, b, result, reason))
    tested = [c for c in out if c.result is not None]
    for c, p in zip(tested, stats.holm([c.result.p for c in tested])):
        c.p_holm = p
    return out


def row_text(key: RowKey) -> str:
    """A row's name in plots and comparisons: the variant, with its overrides if any."""
    return key[0] + (f" ({' '.join(key[1])})" if key[1] else "")


def _fmt_ci(lo: float | None, hi: float | None, digits: int = 2) -> str:
    return f"[{lo:.{digits}f}, {hi:.{digits}f}]" if lo is not None and hi is not None else "[—]"


def _row_label(key: RowKey, custom: bool) -> list[Cell]:
    return [Cell(key[0]), Cell(" ".join(key[1]) if custom else OWN)]


def accuracy_table(group: AccuracyGroup, metric: str, preds: Predictions, comps: list[ComparisonRow]) -> tuple[Table, dict[str, float]]:
    """The table, and each complete row's average (protocol tables feed SMAT and the bubble chart)."""
    tasks = group.tasks
    second = "overrides" if group.custom else "source"
    header = ["attention", second] + tasks + ["Avg"]
    csv_header = ["attention", second] + [f"{t}_{k}" for t in tasks for k in
                                          ("mean", "std", "n", "low", "high", "ci", "p_holm_vs_softmax")] + ["avg"]
    title = (f"Accuracy (%), custom runs of protocol {group.protocol} (overridden settings), metric {metric}"
             if group.custom else f"Accuracy (%), protocol {group.protocol}, metric {metric}")
    table = Table(group.name, title, header, csv_header=csv_header)
    marks = {(c.task, c.variant): c for c in comps if c.baseline[0] == "softmax" and c.baseline[1] == c.variant[1]}
    averages: dict[str, float] = {}
    own_rows = []
    kinds = set()
    for key in group.row_keys():
        cells, raw, means = _row_label(key, group.custom), [key[0], " ".join(key[1]) if group.custom else OWN], []
        for t in tasks:
            runs = group.rows[key].get(t)
            if not runs:
                cells.append(Cell(MISSING))
                raw += [None, None, 0, None, None, None, None]
                continue
            s = cell_stats(runs, metric, preds)
            kinds.add(s.kind)
            means.append(s.mean)
            comp = marks.get((t, key))
            mark = f" {SIGNIFICANT}" if comp is not None and comp.significant else ""
            text = f"{s.mean:.2f}" + (f" ± {s.std:.2f}" if s.std is not None else "") + f" {_fmt_ci(s.low, s.high)} n={s.n}{mark}"
            cells.append(Cell(text, s.mean))
            raw += [s.mean, s.std, s.n, s.low, s.high, s.kind, comp.p_holm if comp is not None else None]
        avg = statistics.fmean(means) if len(means) == len(tasks) else None
        if avg is not None and not group.custom:
            averages[key[0]] = avg
        cells.append(Cell(f"{avg:.2f}" if avg is not None else MISSING, avg))
        own_rows.append(cells)
        table.csv_rows.append(raw + [avg])
    if not group.custom:  # a custom table's rows differ in recipe: no ranking
        for col in range(2, len(header)):
            emphasise([r[col] for r in own_rows])
    table.rows += own_rows
    for source in ([] if group.custom else ref.accuracy_sources(group.protocol)):
        for model, vals in ref.ACCURACY_SOURCES[source].items():
            shown = [vals.get(t) for t in tasks]
            avg = statistics.fmean(shown) if all(v is not None for v in shown) else None
            table.rows.append([Cell(ref.label(model)), Cell(source)]
                              + [Cell(f"{v:.2f}" if v is not None else MISSING) for v in shown]
                              + [Cell(f"{avg:.2f}" if avg is not None else MISSING)])
            table.csv_rows.append([ref.label(model), source] + [x for v in shown for x in (v, None, None, None, None, None, None)] + [avg])
    table.notes += [
        f"Cells: {metric} x 100, mean ± sample std over seeds, [95% interval], n = seeds; {MISSING} = no finished run. "
        "Interval: t-interval over seeds when n ≥ 2, bootstrap over the test examples when n = 1"
        f" (kinds here: {', '.join(sorted(kinds)) or 'none'}; per cell in the CSV column *_ci).",
        f"{SIGNIFICANT} = different from softmax at 5% after Holm correction (see the significance table).",
        f"Avg = mean over the {len(tasks)} task column(s) shown, only for rows with all of them"
        + ("" if tasks == list(ref.LRA_TASKS) else " (not the five-task LRA average)") + ".",
    ]
    if group.custom:
        table.notes.append("Runs whose command line overrode protocol-defining settings (listed per row; lra/report/protocols.py): "
                           "not results of the protocol, never ranked against it.")
    else:
        refs = ref.accuracy_sources(group.protocol)
        table.notes.append("Bold = best, underlined = second best among this suite's runs"
                           + (f"; reference rows: {', '.join(refs)} (same protocol)." if refs else
                              "; no published figures follow this protocol."))
    return table, averages


def significance_table(group: AccuracyGroup, comps: list[ComparisonRow]) -> Table | None:
    if not comps:
        return None
    name = f"significance_{'custom_' if group.custom else ''}{slug(group.protocol)}"
    label = row_text
    header = ["task", "variant", "baseline", "test", "n", "diff (pp)", "95% CI", "p", "p (Holm)", "significant"]
    table = Table(name, f"Paired comparisons, {'custom runs of ' if group.custom else ''}protocol {group.protocol}", header,
                  csv_header=["task", "variant", "baseline", "test", "n", "diff", "low", "high", "p", "p_holm", "significant"])
    for c in comps:
        r = c.result
        if r is None:
            table.rows.append([Cell(c.task), Cell(label(c.variant)), Cell(label(c.baseline)), Cell(f"not tested: {c.reason}")]
                              + [Cell(MISSING)] * 6)
            table.csv_rows.append([c.task, label(c.variant), label(c.baseline), c.reason] + [None] * 7)
            continue
        sig = "yes" if c.significant else "no"
        table.rows.append([Cell(c.task), Cell(label(c.variant)), Cell(label(c.baseline)), Cell(r.kind), Cell(str(r.n)),
                           Cell(f"{r.diff:+.2f}"), Cell(_fmt_ci(r.low, r.high)), Cell(f"{r.p:.3g}"),
                           Cell(f"{c.p_holm:.3g}"), Cell(sig)])
        table.csv_rows.append([c.task, label(c.variant), label(c.baseline), r.kind, r.n, r.diff, r.low, r.high, r.p,
                               c.p_holm, sig])
    table.notes += [
        "diff = variant - baseline in accuracy points. Paired t over the seeds both ran (n = seed pairs), or, with one "
        "seed, McNemar's exact mid-p test on the same test examples with a paired bootstrap interval (n = examples).",
        f"p (Holm) = Holm-corrected over the {sum(c.result is not None for c in comps)} comparison(s) of this table; "
        "significant = p (Holm) < 0.05.",
    ]
    return table


def _lengths(p: dict[str, np.ndarray]) -> np.ndarray:
    length = np.asarray(p["length"])
    return length.reshape(length.shape[0], -1).sum(axis=1)  # two-document tasks: both documents


def length_data(group: AccuracyGroup, task: str, preds: Predictions) -> tuple[np.ndarray, dict[RowKey, list[tuple[float, int]]]] | None:
    """Bucket edges and, per row, (accuracy %, examples) per bucket, pooled over seeds."""
    per_row = {}
    for key in group.row_keys():
        loaded = [p for p in (preds(r) for r in group.rows[key].get(task, {}).values()) if p is not None and p["correct"].size]
        if loaded:
            per_row[key] = loaded
    if not per_row:
        return None
    first = next(iter(per_row.values()))[0]
    edges = stats.length_buckets(_lengths(first))
    out = {}
    for key, loaded in per_row.items():
        correct = np.concatenate([p["correct"] for p in loaded])
        bucket = np.concatenate([stats.bucket_of(_lengths(p), edges) for p in loaded])
        out[key] = [(100 * float(correct[bucket == i].mean()) if (bucket == i).any() else float("nan"), int((bucket == i).sum()))
                    for i in range(len(edges) - 1)]
    return edges, out


def bucket_labels(edges: np.ndarray) -> list[str]:
    k = len(edges) - 1
    return [f"{int(edges[i])}-{int(edges[i + 1]) - (1 if i < k - 1 else 0)}" for i in range(k)]


def length_table(group: AccuracyGroup, task: str, edges: np.ndarray, data: dict[RowKey, list[tuple[float, int]]]) -> Table:
    labels = bucket_labels(edges)
    header = ["attention", "overrides" if group.custom else "source"] + [f"len {lab}" for lab in labels]
    name = f"length_{'custom_' if group.custom else ''}{slug(group.protocol)}_{slug(task)}"
    table = Table(name, f"Accuracy (%) by real length, {task}, {'custom runs of ' if group.custom else ''}protocol {group.protocol}",
                  header, csv_header=header[:2] + [f"{lab}_{k}" for lab in labels for k in ("acc", "n")])
    for key, buckets in data.items():
        table.rows.append(_row_label(key, group.custom) + [Cell(f"{a:.2f} (n={n})" if n else MISSING, a if n else None)
                                                           for a, n in buckets])
        table.csv_rows.append([key[0], " ".join(key[1]) if group.custom else OWN] + [x for a, n in buckets for x in (a if n else None, n)])
    table.notes.append("Buckets: quartiles of the real length of the test examples (real tokens"
                       + (", both documents" if task == "retrieval" else "") + "); accuracy pooled over seeds, "
                       "n = examples in the bucket summed over seeds.")
    return table


def curves(group: AccuracyGroup, task: str) -> dict[str, list[tuple[int, float, float, float]]]:
    """row label -> [(step, mean, min, max)] of validation accuracy (%) over seeds."""
    out = {}
    for key in group.row_keys():
        by_step: dict[int, list[float]] = defaultdict(list)
        for rec in group.rows[key].get(task, {}).values():
            for step, value in rec.get("learning_curve") or []:
                by_step[int(step)].append(100.0 * float(value))
        if by_step:
            out[row_text(key)] = [(s, statistics.fmean(v), min(v), max(v)) for s, v in sorted(by_step.items())]
    return out
