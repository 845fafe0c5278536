"""ListOps diagnostics: what the runs learned, from their prediction files and a description of the test set.

The prediction files hold per test example the prediction, the label and the length; the outermost
operator and the tree depth come from the folder's test-set description
(``testsets/listops-<data fingerprint>.json``, written by ``python -m lra.data.describe <results
folder>`` from the data the runs used, :mod:`lra.data.describe`), so the report still reads no data.

Rules, written down:

* A run is described by a description only when both agree: its record's ``data_fingerprint`` is the
  description's (a record from before fingerprints has none: then its prediction file's labels and
  lengths must equal the description's, example for example, as the report's cells pool on) and its
  labels and lengths are the description's. A run no description holds is left out and named; a table
  whose runs none holds is not drawn, and one line says so and names the command: never a table of
  another test set.
* Accuracy by outermost operator and by depth (operators on the longest root-to-leaf path): per cell,
  mean over its seeds with the length table's interval (95% two-level percentile bootstrap over seeds
  and examples, 2000 resamples, seed 0). A depth that every example shares makes no table (one line).
* The operator-only classifier (a reference row): for each outermost operator, the training set's most
  frequent label among examples with it (ties: the smallest label); its bound: the same with the test
  set's own most frequent label, the most any classifier that sees only that operator scores here.
* Agreement: the share of test examples on which two runs give the same answer. Between two cells, the
  mean over every pair of one seed of each; within a cell (the diagonal), the mean over its pairs of
  seeds, with the lowest pair (no table for a single run).
* Answers: per run and outermost operator, how many distinct classes it predicts and which; and the
  share of examples whose answer is the run's most frequent one for their operator (100%: the run's
  answer is a function of the outermost operator alone). Per operator rather than per true label: the
  question these answer is whether a model computed the expression or only read its first operator.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from lra.records import TEST_SETS, load_descriptions
from lra.report import stats
from lra.report.cells import AccuracyGroup, ExperimentCell, RowKey, row_text, source_column, source_text
from lra.report.screening import Run
from lra.report.tables import MISSING, Table, TableCell, slug

TASK = "listops"
COMMAND = "python -m lra.data.describe <results folder>"
NUM_CLASSES = 10
OPERATOR_ONLY, BOUND = "operator-only", "operator-only bound"
TOP_ANSWERS = 3
COLUMNS = ("operator", "depth", "label", "length")


@dataclass(frozen=True)
class TestSet:
    """A checked test-set description (see :mod:`lra.data.describe` for its fields)."""
    file: str
    fingerprint: str
    operator: np.ndarray
    depth: np.ndarray
    label: np.ndarray
    length: np.ndarray
    train_counts: dict[str, list[int]]

    @property
    def n(self) -> int:
        return int(self.label.size)

    @property
    def operators(self) -> list[str]:
        return sorted(set(self.operator.tolist()))

    def train_mode(self) -> dict[str, int]:
        """The operator-only classifier: operator -> the training set's most frequent label (ties: smallest)."""
        return {op: int(np.argmax(self.train_counts[op])) for op in self.operators}

    def test_mode(self) -> dict[str, int]:
        """Its bound: operator -> this test set's most frequent label (ties: smallest)."""
        return {op: int(np.argmax(np.bincount(self.label[self.operator == op], minlength=NUM_CLASSES)))
                for op in self.operators}

    def answers(self, mode: dict[str, int]) -> np.ndarray:
        return np.array([mode[op] for op in self.operator.tolist()], dtype=np.int64)

    def holds(self, preds: dict[str, np.ndarray]) -> bool:
        """The prediction file's labels and lengths are this description's, example for example."""
        label, length = np.asarray(preds["label"]), np.asarray(preds["length"])
        return label.shape == self.label.shape and length.shape == self.length.shape and \
            bool((label == self.label).all() and (length == self.length).all())


def parse_test_set(name: str, content: dict[str, Any]) -> TestSet:
    """A description file's content, checked; ``ValueError`` with the reason otherwise."""
    if content.get("task") != TASK or content.get("split") != "test":
        raise ValueError(f"not a {TASK} test-set description (task {content.get('task')!r}, split {content.get('split')!r})")
    fp = content.get("data_fingerprint")
    if not isinstance(fp, str) or not fp:
        raise ValueError("no data_fingerprint")
    cols = {k: content.get(k) for k in COLUMNS}
    if not all(isinstance(v, list) for v in cols.values()) or len({len(v) for v in cols.values()}) != 1:
        raise ValueError(f"{', '.join(COLUMNS)} must be lists of one length")
    if not all(isinstance(x, int) and not isinstance(x, bool) for k in ("depth", "label", "length") for x in cols[k]):
        raise ValueError("depth, label and length must hold integers")
    if not all(0 <= x < NUM_CLASSES for x in cols["label"]):
        raise ValueError(f"labels outside 0-{NUM_CLASSES - 1}")
    counts = content.get("train_label_counts")
    ops = sorted({str(x) for x in cols["operator"]})
    if not isinstance(counts, dict) or not all(
            isinstance(counts.get(op), list) and len(counts[op]) == NUM_CLASSES and sum(counts[op]) > 0 for op in ops):
        raise ValueError(f"train_label_counts must give {NUM_CLASSES} label counts for each of {', '.join(ops)}")
    return TestSet(name, fp, np.array([str(x) for x in cols["operator"]]), np.array(cols["depth"], dtype=np.int64),
                   np.array(cols["label"], dtype=np.int64), np.array(cols["length"], dtype=np.int64),
                   {op: [int(x) for x in counts[op]] for op in ops})


def match(run: Run, sets: list[TestSet]) -> tuple[TestSet | None, str]:
    """The description that holds this run (module rules), or None and why not."""
    fp = run.rec.get("data_fingerprint")
    if isinstance(fp, str) and fp:
        same = [s for s in sets if s.fingerprint == fp]
        if not same:
            return None, f"no description of its data (fingerprint {fp})"
        if not same[0].holds(run.preds):
            return None, f"its labels or lengths differ from {TEST_SETS}/{same[0].file}"
        return same[0], ""
    held = [s for s in sets if s.holds(run.preds)]
    if not held:
        return None, "no description has its test labels and lengths (its record carries no data fingerprint)"
    return held[0], ""


def _mode_text(mode: dict[str, int]) -> str:
    return ", ".join(f"{op} {label}" for op, label in mode.items())


def _acc_cell(col: str, correct: np.ndarray | None, exact: float | None = None) -> TableCell:
    """A bootstrap cell over ``correct[seed, example]``, or an exact figure (a reference row)."""
    if exact is not None:
        return TableCell(f"{exact:.2f}", exact, data={f"{col}_acc": exact, f"{col}_low": None, f"{col}_high": None})
    if correct is None or correct.shape[1] == 0:
        return TableCell(MISSING, data={f"{col}_acc": None, f"{col}_low": None, f"{col}_high": None})
    m, lo, hi = (100 * x for x in stats.seeds_examples_bootstrap(correct))
    return TableCell(f"{m:.2f} [{lo:.2f}, {hi:.2f}]", m, data={f"{col}_acc": m, f"{col}_low": lo, f"{col}_high": hi})


def _lead(attention: str, source: str, seeds: list[int] | None) -> list[TableCell]:
    return [TableCell(attention, data={"attention": attention}), TableCell(source, data={"source": source}),
            TableCell(", ".join(map(str, seeds)) if seeds else MISSING,
                      data={"seeds": ";".join(map(str, seeds)) if seeds else None})]


def _split_table(name: str, title: str, g: AccuracyGroup, ts: TestSet, rows: list[tuple[RowKey, list[Run]]],
                 columns: list[tuple[str, str, np.ndarray]]) -> Table:
    """Accuracy per column (slug, header, example mask): one row per cell, then the two references."""
    table = Table(name, title, ["attention", source_column(g.custom), "seeds"] + [h for _, h, _ in columns])
    for key, runs in rows:
        correct = np.stack([r.preds["correct"] for r in runs]).astype(bool)
        table.rows.append(_lead(key[0], source_text(key, g.custom), [r.seed for r in runs])
                          + [_acc_cell(c, correct[:, mask]) for c, _, mask in columns])
    for label, mode, source in ((OPERATOR_ONLY, ts.train_mode(), "the training set's most frequent label per operator"),
                                (BOUND, ts.test_mode(), "the test set's most frequent label per operator")):
        right = ts.answers(mode) == ts.label
        table.rows.append(_lead(label, f"{source}: {_mode_text(mode)}", None)
                          + [_acc_cell(c, None, 100 * float(right[mask].mean()) if mask.any() else None)
                             for c, _, mask in columns])
    return table


def _common_notes(ts: TestSet, rows: list[tuple[RowKey, list[Run]]], left_out: list[str]) -> list[str]:
    runs = [r for _, rs in rows for r in rs]
    by_fp = sum(isinstance(r.rec.get("data_fingerprint"), str) and bool(r.rec["data_fingerprint"]) for r in runs)
    notes = [f"Test set: {TEST_SETS}/{ts.file} ({ts.n} examples, data fingerprint {ts.fingerprint}; built by {COMMAND}). "
             f"Runs matched by their record's data fingerprint: {by_fp}; by their prediction files' labels and "
             f"lengths alone (records without a fingerprint): {len(runs) - by_fp}."]
    if left_out:
        notes.append("Not in this table: " + "; ".join(left_out) + ".")
    return notes


def _answers_table(g: AccuracyGroup, ts: TestSet, rows: list[tuple[RowKey, list[Run]]], notes: list[str]) -> Table:
    ops = ts.operators
    table = Table(g.file_name("diagnostics_answers"),
                  f"ListOps answers per outermost operator, {g.where}: distinct classes a run predicts, and which",
                  ["attention", source_column(g.custom), "seed", "test %", "distinct answers", "fixed by operator (%)"]
                  + [f"{op} ({int((ts.operator == op).sum())})" for op in ops])
    for key, runs in rows:
        for r in runs:
            pred = np.asarray(r.preds["pred"]).astype(np.int64)
            acc = 100 * float(np.asarray(r.preds["correct"]).mean())
            fixed = sum(Counter(pred[ts.operator == op].tolist()).most_common(1)[0][1] for op in ops)
            share = 100 * fixed / ts.n
            row = [TableCell(key[0], data={"attention": key[0]}),
                   TableCell(source_text(key, g.custom), data={"source": source_text(key, g.custom)}),
                   TableCell(str(r.seed), data={"seed": r.seed}), TableCell(f"{acc:.2f}", acc, data={"test_acc": acc}),
                   TableCell(str(len(set(pred.tolist()))), data={"distinct": len(set(pred.tolist()))}),
                   TableCell(f"{share:.2f}", share, data={"fixed_by_operator": share})]
            for op in ops:
                counts = sorted(Counter(pred[ts.operator == op].tolist()).items(), key=lambda kv: (-kv[1], kv[0]))
                more = len(counts) - TOP_ANSWERS
                shown = ", ".join(f"{c}×{n}" for c, n in counts[:TOP_ANSWERS]) + (f" (+{more} more)" if more > 0 else "")
                row.append(TableCell(f"{len(counts)}: {shown}", data={f"{slug(op)}_distinct": len(counts),
                                                                    f"{slug(op)}_answers": ";".join(f"{c}:{n}" for c, n in counts)}))
            table.rows.append(row)
    table.notes += [f"Per outermost operator: the number of distinct classes the run predicts, then the most frequent "
                    f"({TOP_ANSWERS} at most, as class×examples; +k more: the other classes, all in the CSV). fixed by operator = the share of test "
                    "examples whose answer is the run's most frequent one for their operator: 100% means the run's answer "
                    "is a function of the outermost operator alone. (n) = test examples with that operator.",
                    f"The operator-only classifier answers {_mode_text(ts.train_mode())}."] + notes
    return table


def _agreement(a: list[np.ndarray], b: list[np.ndarray] | None) -> tuple[float, float, int] | None:
    """(mean, lowest, pairs) of the percentage of equal answers over seed pairs; ``b`` None: within ``a``."""
    pairs = [(x, y) for i, x in enumerate(a) for y in a[i + 1:]] if b is None else [(x, y) for x in a for y in b]
    if not pairs:
        return None
    shares = [100 * float((x == y).mean()) for x, y in pairs]
    return float(np.mean(shares)), min(shares), len(pairs)


def _agreement_table(g: AccuracyGroup, ts: TestSet, rows: list[tuple[RowKey, list[Run]]], notes: list[str]) -> Table:
    names = [row_text(k) for k, _ in rows]
    slugs: list[str] = []
    for name in names:
        s = slug(name)
        slugs.append(s if s not in slugs else f"{s}-{len(slugs)}")
    preds = [[np.asarray(r.preds["pred"]).astype(np.int64) for r in runs] for _, runs in rows]
    table = Table(g.file_name("diagnostics_agreement"),
                  f"ListOps agreement (%), {g.where}: test examples on which two runs give the same answer",
                  ["attention", source_column(g.custom), "seeds"] + names)
    for i, (key, runs) in enumerate(rows):
        row = _lead(key[0], source_text(key, g.custom), [r.seed for r in runs])
        for j, col in enumerate(slugs):
            found = _agreement(preds[i], None if j == i else preds[j])
            data = {f"{col}_agree": None, f"{col}_min": None, f"{col}_pairs": 0}
            if found is None:
                row.append(TableCell(MISSING, data=data))
                continue
            mean, low, n = found
            data.update({f"{col}_agree": mean, f"{col}_min": low, f"{col}_pairs": n})
            text = f"{mean:.2f} (min {low:.2f})" if j == i and n > 1 else f"{mean:.2f}"
            row.append(TableCell(text, mean, data=data))
        table.rows.append(row)
    table.notes += ["Between two rows: the mean over every pair of one seed of each; on the diagonal: the mean over "
                    "the row's pairs of seeds (min = the pair that agrees least; — = one seed). Whether a run's "
                    "answer is a function of the outermost operator alone: the answers table. A statement about these "
                    f"trained networks on these {ts.n} examples, not a test."] + notes
    return table


def _group_tables(g: AccuracyGroup, ts: TestSet, rows: list[tuple[RowKey, list[Run]]], left_out: list[str]) -> list[Table]:
    notes = _common_notes(ts, rows, left_out)
    everything = np.ones(ts.n, dtype=bool)
    op_cols = [("all", f"all ({ts.n})", everything)] + [
        (slug(op), f"{op} ({int((ts.operator == op).sum())})", ts.operator == op) for op in ts.operators]
    by_op = _split_table(g.file_name("diagnostics_operator"),
                         f"ListOps accuracy (%) by outermost operator, {g.where}: mean over seeds [95% two-level "
                         "percentile bootstrap, 2000 resamples, seed 0 over seeds and examples]", g, ts, rows, op_cols)
    depths = sorted(set(ts.depth.tolist()))
    by_op.notes += [
        "Outermost operator: the root's (the first in reading order); (n) = test examples with it.",
        f"{OPERATOR_ONLY}: answers, for each outermost operator, the training set's most frequent label with it: what a "
        f"model that found the outermost operator and nothing else scores. {BOUND}: the same with this test set's own "
        "most frequent label per operator, the most any classifier that sees only the outermost operator scores here. "
        "Both exact (no interval)."]
    tables = [by_op]
    if len(depths) == 1:
        by_op.notes.append(f"Depth (operators on the longest root-to-leaf path): every test example has depth "
                           f"{depths[0]}, so accuracy by depth is the all column (no depth table).")
    else:
        tables.append(_split_table(
            g.file_name("diagnostics_depth"),
            f"ListOps accuracy (%) by tree depth, {g.where}: mean over seeds [95% two-level percentile bootstrap, 2000 "
            "resamples, seed 0 over seeds and examples]", g, ts, rows,
            [(f"depth-{d}", f"{d} ({int((ts.depth == d).sum())})", ts.depth == d) for d in depths]))
        tables[-1].notes.append("Depth: operators on the longest root-to-leaf path (the root counts 1); (n) = test "
                                "examples of that depth. Reference rows as in the table by outermost operator.")
    for t in tables:
        t.notes += notes
    tables.append(_answers_table(g, ts, rows, notes))
    if sum(len(runs) for _, runs in rows) > 1:   # one run agrees with nothing
        tables.append(_agreement_table(g, ts, rows, notes))
    return tables


def diagnostics_section(groups: list[AccuracyGroup], results_dir: str | Path, also: Sequence[str | Path] = ()
                        ) -> tuple[list[Table], list[str]]:
    """The ListOps diagnostics tables of every accuracy table with ListOps runs, and the report's notices
    (one line per accuracy table no description holds, one per unreadable description file). The test-set
    descriptions are those of ``results_dir`` and of the ``also`` folders (``report.also``)."""
    listops = [(g, [(k, g.rows[k][TASK]) for k in g.row_keys() if TASK in g.rows[k]]) for g in groups]
    listops = [(g, cells) for g, cells in listops if any(c.with_predictions for _, c in cells)]
    if not listops:
        return [], []
    found, problems = _descriptions([results_dir, *also])
    sets: list[TestSet] = []
    for name, content in found:
        try:
            sets.append(parse_test_set(name, content))
        except ValueError as e:
            problems.append(f"{TEST_SETS}/{name}: {e}")
    notices = [f"ListOps diagnostics: {p}; that file is not used." for p in problems]
    tables: list[Table] = []
    for g, cells in listops:
        built = _group(g, cells, sets, bool(problems))
        if isinstance(built, str):
            notices.append(built)
        else:
            tables += built
    return tables, notices


def _descriptions(folders: list[str | Path]) -> tuple[list[tuple[str, dict]], list[str]]:
    """The ListOps descriptions of every folder, each file name once: a folder that describes a test set
    under the same name but otherwise is a problem, named, and its copy is not used."""
    found: dict[str, dict] = {}
    problems: list[str] = []
    for folder in folders:
        more, unreadable = load_descriptions(folder, TASK)
        problems += unreadable
        for name, content in more:
            if found.setdefault(name, content) != content:
                problems.append(f"{TEST_SETS}/{name} of {folder} differs from the first folder's description")
    return sorted(found.items()), problems


def _group(g: AccuracyGroup, cells: list[tuple[RowKey, ExperimentCell]], sets: list[TestSet], unusable: bool
           ) -> list[Table] | str:
    """One accuracy table's diagnostics, or the line saying why there are none (``unusable``: a
    description file was there but could not be used)."""
    matched: dict[RowKey, list[tuple[Run, TestSet]]] = {}
    left_out: list[str] = []
    reasons: list[str] = []
    for key, cell in cells:
        missing = cell.n - len(cell.with_predictions)
        if missing:
            left_out.append(f"{row_text(key)}: {missing} seed(s) without a prediction file")
        for run in cell.with_predictions:
            ts, why = match(run, sets)
            if ts is None:
                left_out.append(f"{row_text(key)} seed {run.seed} ({why})")
                reasons.append(why)
            else:
                matched.setdefault(key, []).append((run, ts))
    uses = Counter(ts.file for pairs in matched.values() for _, ts in pairs)
    if not uses:
        have = (f"none of the {len(sets)} test-set description(s) under {TEST_SETS}/ is of its runs' test set "
                f"({sorted(set(reasons))[0]})" if sets else
                f"this folder has no {'usable ' if unusable else ''}{TEST_SETS}/{TASK}-*.json")
        return (f"ListOps diagnostics ({g.where}): not drawn, {have}; run `{COMMAND}` "
                f"with the data the runs used (LRA_DATA_DIR) and keep {TEST_SETS}/ with the records.")
    chosen = min(uses, key=lambda f: (-uses[f], f))
    ts = next(s for s in sets if s.file == chosen)
    rows: list[tuple[RowKey, list[Run]]] = []
    for key, _ in cells:
        runs = [r for r, s in matched.get(key, []) if s.file == chosen]
        left_out += [f"{row_text(key)} seed {r.seed} (described by {TEST_SETS}/{s.file}, another test set)"
                     for r, s in matched.get(key, []) if s.file != chosen]
        if runs:
            rows.append((key, runs))
    return _group_tables(g, ts, rows, left_out)
