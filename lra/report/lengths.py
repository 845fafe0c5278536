"""Accuracy by real length and learning curves, per accuracy table and task.

Rules, written down:

* Accuracy by length: the test examples split at the quartiles of their real length (the number of
  real tokens; for two-document tasks both documents). Lengths are counted after truncation at
  ``task.max_len``: an example at the cap was cut there or is exactly ``max_len`` long (its real
  length is at least ``max_len``); it sits in the top bucket, whose label says how many are at
  max_len (never "cut": the stored length cannot tell). A fixed-length task has none.
* One test set per table: the runs' prediction files share it when their labels and lengths are
  equal (the most common set; runs on another are left out and named in the notes).
* Bucket accuracy: the mean over the row's seeds, with a 95% two-level percentile bootstrap interval
  (seeds, then the bucket's examples; 2000 resamples, seed 0): a bucket of ~100 examples moves by
  about +-4 points on examples alone. The header gives each bucket's examples once; the row, its seeds.
* Learning curves: validation accuracy at each evaluation; mean over seeds with a min-max band;
  single-seed lines are dashed and say "(1 seed)".
"""
from __future__ import annotations

import statistics
from collections import defaultdict

import numpy as np

from lra.report import stats
from lra.report.cells import AccuracyGroup, RowKey, row_text, source_column, source_text
from lra.report.screening import Run
from lra.report.tables import MISSING, Table, TableCell, slug

LengthRows = dict[RowKey, list[tuple[float, float, float] | None]]  # per bucket (acc, low, high)


def real_lengths(p: dict[str, np.ndarray]) -> np.ndarray:
    length = np.asarray(p["length"])
    return length.reshape(length.shape[0], -1).sum(axis=1)  # two-document tasks: both documents


def cut_examples(p: dict[str, np.ndarray], max_len: int | None) -> np.ndarray:
    """Examples that may have been truncated: stored lengths are capped at ``max_len``, so a
    document AT the cap was cut or is exactly ``max_len`` long; none is known to be cut. When every
    example is at the cap (a fixed-length task: images), nothing was cut."""
    length = np.asarray(p["length"])
    at_cap = np.zeros(length.shape[0], dtype=bool) if not max_len else (length.reshape(length.shape[0], -1) >= max_len).any(axis=1)
    return np.zeros_like(at_cap) if at_cap.all() else at_cap


def reference_test_set(runs: list[Run]) -> str | None:
    """The most common test-set fingerprint among runs with predictions (ties: the smallest)."""
    counts: dict[str, int] = defaultdict(int)
    for r in runs:
        if r.test_set is not None:
            counts[r.test_set] += 1
    return min(counts, key=lambda k: (-counts[k], k)) if counts else None


def bucket_labels(edges: np.ndarray, cut: int = 0) -> list[str]:
    k = len(edges) - 1
    labels = [f"{int(edges[i])}-{int(edges[i + 1]) - (1 if i < k - 1 else 0)}" for i in range(k)]
    if cut:
        labels[-1] += f" ({cut} at max_len)"
    return labels


def length_data(group: AccuracyGroup, task: str) -> tuple[Table, list[str], LengthRows] | None:
    """The table, its bucket labels and per row the bucket accuracies with intervals (None: no predictions)."""
    cells = {k: per[task] for k, per in ((k, group.rows[k]) for k in group.row_keys()) if task in per}
    everyone = [r for c in cells.values() for r in c.runs.values()]
    ref_set = reference_test_set(everyone)
    if ref_set is None:
        return None
    first = next(r for r in everyone if r.test_set == ref_set)
    max_len = ((first.rec.get("config") or {}).get("task") or {}).get("max_len")
    lengths = real_lengths(first.preds)
    edges = stats.length_buckets(lengths)
    bucket = stats.bucket_of(lengths, edges)
    cut = int(cut_examples(first.preds, max_len if isinstance(max_len, int) else None).sum())
    labels = bucket_labels(edges, cut)
    counts = [int((bucket == i).sum()) for i in range(len(labels))]
    header = ["attention", source_column(group.custom), "seeds"] + [f"len {lab} ({n} ex)" for lab, n in zip(labels, counts)]
    name = f"{group.file_name('length')}_{slug(task)}"
    table = Table(name, f"Accuracy (%) by real length, {task}, {group.where}: mean over seeds [95% two-level "
                        f"{stats.BOOTSTRAP_METHOD} over seeds and examples]", header,
                  csv_header=header[:3] + [f"{lab}_{k}" for lab in labels for k in ("acc", "low", "high", "examples")])
    data: LengthRows = {}
    left_out: list[str] = []
    for key, cell in cells.items():
        runs = [r for r in cell.with_predictions if r.test_set == ref_set]
        left_out += [f"{row_text(key)} seed {r.seed}" for r in cell.with_predictions if r.test_set != ref_set]
        missing = cell.n - len(cell.with_predictions)
        if missing:
            left_out.append(f"{row_text(key)}: {missing} seed(s) without a prediction file")
        if not runs:
            continue
        correct = np.stack([r.preds["correct"] for r in runs])
        row = [stats.seeds_examples_bootstrap(correct[:, bucket == i]) if counts[i] else None for i in range(len(labels))]
        data[key] = [None if b is None else (100 * b[0], 100 * b[1], 100 * b[2]) for b in row]
        label = source_text(key, group.custom)
        table.rows.append([TableCell(key[0]), TableCell(label), TableCell(str(len(runs)))]
                          + [TableCell(f"{x[0]:.2f} [{x[1]:.2f}, {x[2]:.2f}]", x[0]) if x else TableCell(MISSING) for x in data[key]])
        table.csv_rows.append([key[0], label, len(runs)] + [v for x, n in zip(data[key], counts)
                                                            for v in ((*x, n) if x is not None else (None, None, None, n))])
    table.notes.append("Buckets: quartiles of the real length of the test examples (real tokens"
                       + (", both documents" if (first.rec.get("config") or {}).get("task", {}).get("dual") else "")
                       + "); (n ex) = examples in the bucket, the same for every seed; seeds = runs pooled in the row.")
    if cut:
        table.notes.append(f"Lengths are counted after truncation at task.max_len={max_len}: {cut} example(s) "
                           f"({100 * cut / lengths.size:.1f}%) are at max_len: cut, or exactly {max_len} long (the "
                           f"stored length cannot tell), so their real length is ≥ {max_len}; they are in the top bucket.")
    if left_out:
        table.notes.append("Not in this table: " + "; ".join(left_out) + " (another test set or no prediction file).")
    return table, labels, data


def curves(group: AccuracyGroup, task: str) -> dict[RowKey, tuple[int, list[tuple[int, float, float, float]]]]:
    """row -> (seeds, [(step, mean, min, max)]) of validation accuracy (%) over seeds."""
    out = {}
    for key in group.row_keys():
        cell = group.rows[key].get(task)
        if cell is None:
            continue
        by_step: dict[int, list[float]] = defaultdict(list)
        seeds = 0
        for run in cell.runs.values():
            curve = run.rec.get("learning_curve") or []
            seeds += bool(curve)
            for step, value in curve:
                by_step[int(step)].append(100.0 * float(value))
        if by_step:
            out[key] = (seeds, [(s, statistics.fmean(v), min(v), max(v)) for s, v in sorted(by_step.items())])
    return out
