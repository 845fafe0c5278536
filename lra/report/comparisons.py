"""Which tests the report runs, on what, and which marks they earn.

Rules, written down (statistics in :mod:`lra.report.stats`):

* Seed-level test of two cells (:func:`seed_test`): both cells need >= 3 seeds (below that the cells
  show their intervals and no test is run); both must be one experiment apart from the attention
  (their seedless identities differ only in ``attention``/``attention_name``) and share the number
  of examples the metric was measured on (it sets the spread floor): the test set's for
  ``test_acc``, the validation set's for ``best_val_acc`` (``metrics.n_val``; unknown: no test).
* Every comparison is over what it displays: its difference is the difference of the two cells'
  displayed means. Paired t when both cells hold the same seeds (every displayed seed has its
  pair); when their seeds differ, Welch's t over all seeds of each side, never a paired t over the
  common seeds alone (that would test a difference no cell shows: a dagger could sit beside the
  lower mean). Standard deviations floored at one example. So a mark never contradicts the means.
* The declared family of a protocol table (:func:`declared_family`): every variant against softmax
  (the softmax row with the same labels), per task, nothing else; Holm over the members that were
  tested. Only these earn the dagger. Adding ``report.compare`` or another table's runs does not
  change it.
* ``report.compare=[a,b]`` (:func:`exploratory`): reported in a table of its own with its own Holm
  correction, never marked.
* Run pairs (:func:`run_pairs`): where a seed-level test cannot be run, McNemar on each common seed's
  two runs (same test set): "this pair of runs", with the run ids, uncorrected and never marked.
* Ranking marks (:func:`ranking_marks`, protocol tables only): per task column, bold when the best
  mean is significantly above the runner-up under the seed-level test, underlined (the runner-up)
  when, in addition, it is significantly above the third; Holm over the table's ranking tests.
  Otherwise no mark: a tie is not a win.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lra.report import stats
from lra.report.cells import ATTENTION_SECTIONS, AccuracyGroup, ExperimentCell, RowKey, baseline_name, differences
from lra.report.screening import Run

ALPHA = 0.05
SIGNIFICANT = "†"
VAL_SIZE = "n_val"  # metrics field: validation examples behind best_val_acc (its spread floor)


@dataclass
class ComparisonRow:
    task: str
    variant: RowKey
    baseline: RowKey
    result: stats.Comparison | None
    reason: str = ""
    p_holm: float | None = None
    means: tuple[float, float] | None = None  # the displayed means (variant, baseline) the test compares

    @property
    def significant(self) -> bool:
        return self.p_holm is not None and self.p_holm < ALPHA


def measured_on(run: Run, metric: str) -> int | None:
    """Examples behind ``metric``: the spread floor's denominator (None: unknown)."""
    if metric == "test_acc":
        return run.n_test
    n = (run.rec.get("metrics") or {}).get(VAL_SIZE)
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None


def seed_test(a: ExperimentCell, b: ExperimentCell, metric: str) -> tuple[stats.Comparison | None, str]:
    """The declared seed-level test of cell ``a`` against cell ``b``, or why none is run."""
    if min(a.n, b.n) < stats.MIN_SEEDS:
        return None, f"needs ≥ {stats.MIN_SEEDS} seeds per side (has {a.n} and {b.n})"
    other = differences(b.flat, a.flat, skip=ATTENTION_SECTIONS)  # the variant's settings where they differ
    if other:
        return None, f"not one experiment apart from the attention (differ in {', '.join(other[:3])})"
    sizes = {measured_on(r, metric) for c in (a, b) for r in c.runs.values()}
    where = "test" if metric == "test_acc" else "validation"
    if len(sizes - {None}) > 1:
        return None, f"different {where}-set sizes: no spread floor"
    if None in sizes:
        unknown = "no prediction files" if metric == "test_acc" else f"the records lack metrics.{VAL_SIZE}"
        return None, f"{where}-set size unknown ({unknown}): no spread floor"
    floor = stats.spread_floor(sizes.pop())
    common = [s for s in a.seeds if s in b.runs]
    if common == a.seeds == b.seeds:  # paired only when it covers every displayed seed
        return stats.paired_t([a.runs[s].value(metric) for s in common], [b.runs[s].value(metric) for s in common], floor), ""
    return stats.welch_t(a.values(metric), b.values(metric), floor), ""


def _row(task: str, a: RowKey, b: RowKey, ca: ExperimentCell, cb: ExperimentCell, metric: str) -> ComparisonRow:
    means = (float(np.mean(ca.values(metric))), float(np.mean(cb.values(metric))))
    return ComparisonRow(task, a, b, *seed_test(ca, cb, metric), means=means)


def _holm(rows: list[ComparisonRow]) -> list[ComparisonRow]:
    tested = [c for c in rows if c.result is not None]
    for c, p in zip(tested, stats.holm([c.result.p for c in tested])):
        c.p_holm = p
    return rows


def _pairs(group: AccuracyGroup, wanted: list[tuple[RowKey, RowKey]], metric: str) -> list[ComparisonRow]:
    out = []
    for task in group.tasks:
        for a, b in wanted:
            if task in group.rows[a] and task in group.rows[b]:
                out.append(_row(task, a, b, group.rows[a][task], group.rows[b][task], metric))
    return out


def declared_family(group: AccuracyGroup, metric: str) -> list[ComparisonRow]:
    """Every variant against the softmax row with the same labels (and the same training: from scratch,
    or self-pretrained the same way), per task; Holm over the tested."""
    wanted = [(k, (baseline_name(k[0]), k[1])) for k in group.row_keys()
              if k[0] != baseline_name(k[0]) and (baseline_name(k[0]), k[1]) in group.rows]
    return _holm(_pairs(group, wanted, metric))


def exploratory(group: AccuracyGroup, pair: tuple[str, str], metric: str) -> list[ComparisonRow]:
    """The ``report.compare`` pair in every row label both variants have; its own Holm correction."""
    labels = sorted({k[1] for k in group.rows})
    wanted = [((pair[0], lab), (pair[1], lab)) for lab in labels if (pair[0], lab) in group.rows and (pair[1], lab) in group.rows]
    return _holm(_pairs(group, wanted, metric))


@dataclass
class RunPair:
    task: str
    variant: RowKey
    baseline: RowKey
    seed: int
    runs: tuple[str, str]
    result: stats.Comparison


def run_pairs(group: AccuracyGroup, comps: list[ComparisonRow]) -> list[RunPair]:
    """McNemar on the runs of each common seed, for the comparisons that no seed-level test covers."""
    out = []
    for c in comps:
        if c.result is not None:
            continue
        a, b = group.rows[c.variant][c.task], group.rows[c.baseline][c.task]
        for s in sorted(set(a.runs) & set(b.runs)):
            ra, rb = a.runs[s], b.runs[s]
            if ra.preds is None or rb.preds is None or ra.test_set != rb.test_set:
                continue
            r = stats.paired_examples(ra.preds["correct"], rb.preds["correct"])
            out.append(RunPair(c.task, c.variant, c.baseline, s, (ra.run_id, rb.run_id),
                               stats.Comparison(r.kind, r.n, 100 * r.diff, 100 * r.low, 100 * r.high, r.p)))
    return out


def ranking_marks(group: AccuracyGroup, metric: str) -> tuple[dict[tuple[str, RowKey], int], list[ComparisonRow]]:
    """(task, row) -> 1 (bold) or 2 (underlined), and the ranking tests behind them (Holm-corrected)."""
    per_task: dict[str, list[ComparisonRow]] = {}
    for task in group.tasks:
        ranked = sorted((k for k, per in group.rows.items() if task in per),
                        key=lambda k: (-float(np.mean(group.rows[k][task].values(metric))), k))
        per_task[task] = [_row(task, a, b, group.rows[a][task], group.rows[b][task], metric)
                          for a, b in zip(ranked[:2], ranked[1:3])]
    tests = _holm([c for rows in per_task.values() for c in rows])
    marks: dict[tuple[str, RowKey], int] = {}
    for task, rows in per_task.items():
        won = [c.significant and c.result is not None and c.result.diff > 0 for c in rows]
        if won and won[0]:
            marks[(task, rows[0].variant)] = 1
            if len(won) > 1 and won[1]:
                marks[(task, rows[1].variant)] = 2
    return marks, tests
