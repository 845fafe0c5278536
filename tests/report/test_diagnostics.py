"""The ListOps diagnostics section (lra/report/diagnostics.py) on a small fabricated test set whose
answers are known by hand: the operator-only classifier and its bound, agreement, answers per operator,
the depth table, the one line when no description holds the runs, and determinism."""
from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import numpy as np
import pytest

from lra.records import description_file, write_description
from lra.report.build import build_tables
from tests.report.fabricate import Results

FP = "00000000feedbeef"
# 20 examples: 10 with outermost operator MAX, then 10 with MIN
OPS = ["MAX"] * 10 + ["MIN"] * 10
LABELS = [9] * 6 + [8] * 3 + [2] + [0] * 6 + [1] * 4
# the training set: MAX mostly 9, MIN mostly 1 (the test set's MIN is mostly 0)
TRAIN = {"MAX": [0, 0, 1, 0, 0, 0, 0, 0, 2, 7], "MIN": [3, 5, 0, 0, 0, 0, 0, 0, 0, 0]}
OPERATOR_FUNCTION = np.array([9] * 10 + [0] * 10)    # what softmax s0 answers: 9 for MAX, 0 for MIN


def description(res: Results, depth: list[int] | None = None, fingerprint: str = FP, **changes) -> dict:
    d = {"task": "listops", "split": "test", "data_fingerprint": fingerprint, "settings": {}, "n": res.n,
         "train_label_counts": TRAIN, "operator": OPS, "depth": depth or [2] * 5 + [3] * 15,
         "label": [int(x) for x in res.labels], "length": [int(x) for x in res.lengths]}
    d.update(changes)
    return d


def write_preds(res: Results, rec: dict, pred: np.ndarray) -> None:
    """Replace a fabricated run's predictions with ``pred`` (and its accuracy figures with theirs)."""
    correct = pred == res.labels
    np.savez(res.runs / f"{rec['run_id']}.preds.npz", pred=pred.astype(np.int16), correct=correct,
             label=res.labels.astype(np.int16), length=res.lengths.astype(np.int32))
    res.edit(rec, metrics={"test_acc": float(correct.mean()), "best_val_acc": float(correct.mean())},
             predictions={"file": f"{rec['run_id']}.preds.npz", "n": res.n, "accuracy": float(correct.mean())})


def folder(tmp_path: Path, fingerprint: str | None = FP, describe: bool = True, **kw) -> Results:
    """softmax s0 (the operator function), s1 (two MAX examples answered 0), linear s0 (always 0)."""
    res = Results(tmp_path / "results", n_test=20)
    res.labels = np.array(LABELS)
    fields = {"data_fingerprint": fingerprint} if fingerprint else {}
    s1 = OPERATOR_FUNCTION.copy()
    s1[[0, 7]] = 0
    for attention, seed, pred in (("softmax", 0, OPERATOR_FUNCTION), ("softmax", 1, s1), ("linear", 0, np.zeros(20, int))):
        write_preds(res, res.train(attention, seed, **fields), pred)
    if describe:
        write_description(res.root, description(res, **kw))
    return res


def notices(res: Results) -> list[str]:
    """The report's notices (the lines at its top), built without plots; the SMAT line these
    bench-less folders get (tests/report/test_smat_needs.py) left out."""
    return [n for n in build_tables(res.root, plots=False)[3] if not n.startswith("No SMAT table")]


def table(res: Results, kind: str) -> tuple[list[str], dict[str, dict[str, str]], object]:
    """The CSV rows of ``diagnostics_<kind>_quick`` by their first columns, and the table itself."""
    t = next(t for t in build_tables(res.root, plots=False)[0] if t.name == f"diagnostics_{kind}_quick")
    rows = list(csv.DictReader(io.StringIO(t.csv())))
    key = "seed" if kind == "answers" else "seeds"
    return t.header, {f"{r['attention']} {r[key]}": r for r in rows}, t


def test_operator_only_classifier_and_its_bound_score_what_the_hand_count_says(tmp_path):
    res = folder(tmp_path)
    header, rows, t = table(res, "operator")
    assert header[3:] == ["all (20)", "MAX (10)", "MIN (10)"]
    only, bound = rows["operator-only "], rows["operator-only bound "]
    # training modes MAX 9, MIN 1: right on the six 9s and the four 1s; test modes MAX 9, MIN 0: the six 9s and six 0s
    assert [float(only[f"{c}_acc"]) for c in ("all", "max", "min")] == pytest.approx([50, 60, 40])
    assert [float(bound[f"{c}_acc"]) for c in ("all", "max", "min")] == pytest.approx([60, 60, 60])
    assert only["all_low"] == "" and "MAX 9, MIN 1" in only["source"] and "MAX 9, MIN 0" in bound["source"]
    assert float(rows["softmax 0;1"]["all_acc"]) == pytest.approx(100 * (12 + 11) / 40)   # s1 loses the 9 at example 0
    assert [float(rows["linear 0"][f"{c}_acc"]) for c in ("max", "min")] == pytest.approx([0, 60])
    md = t.markdown()
    assert "| operator-only | the training set's most frequent label per operator: MAX 9, MIN 1 | — | 50.00 | 60.00 | 40.00 |" in md


def test_agreement_between_cells_and_within_a_cell(tmp_path):
    res = folder(tmp_path)
    header, rows, t = table(res, "agreement")
    assert header[3:] == ["softmax", "linear"]
    soft, lin = rows["softmax 0;1"], rows["linear 0"]
    assert float(soft["softmax_agree"]) == pytest.approx(90) and int(soft["softmax_pairs"]) == 1   # s0, s1 differ on 2 of 20
    # linear answers 0: softmax s0 answers 0 on the 10 MIN examples, s1 on 12; mean of the two pairs
    assert [float(soft["linear_agree"]), float(soft["linear_min"])] == pytest.approx([55, 50]) and int(soft["linear_pairs"]) == 2
    assert float(lin["softmax_agree"]) == pytest.approx(55)
    assert lin["linear_agree"] == "" and int(lin["linear_pairs"]) == 0                 # one seed: no diagonal
    assert "| softmax | run | 0, 1 | 90.00 | 55.00 |" in t.markdown() and "| linear | run | 0 | 55.00 | — |" in t.markdown()


def test_answers_per_operator_count_distinct_classes_and_say_whether_the_operator_fixes_them(tmp_path):
    res = folder(tmp_path)
    _, rows, t = table(res, "answers")
    s0, s1, lin = rows["softmax 0"], rows["softmax 1"], rows["linear 0"]
    assert (s0["max_distinct"], s0["max_answers"], s0["fixed_by_operator"], s0["distinct"]) == ("1", "9:10", "100.0", "2")
    assert (s1["max_distinct"], s1["max_answers"], s1["fixed_by_operator"]) == ("2", "9:8;0:2", "90.0")
    assert (lin["distinct"], lin["min_answers"], lin["fixed_by_operator"]) == ("1", "0:10", "100.0")
    assert "| softmax | run | 1 | 55.00 | 2 | 90.00 | 2: 9×8, 0×2 | 1: 0×10 |" in t.markdown()


def test_depth_table_only_where_depths_differ(tmp_path):
    res = folder(tmp_path)
    header, rows, _ = table(res, "depth")
    assert header[3:] == ["2 (5)", "3 (15)"]
    assert float(rows["operator-only "]["depth-2_acc"]) == pytest.approx(100)    # the first five: 9, 9, 9, 9, 9 under MAX
    flat = folder(tmp_path / "flat", depth=[9] * 20)
    names = [t.name for t in build_tables(flat.root, plots=False)[0]]
    assert "diagnostics_operator_quick" in names and "diagnostics_depth_quick" not in names
    operator = next(t for t in build_tables(flat.root, plots=False)[0] if t.name == "diagnostics_operator_quick")
    assert "Depth (operators on the longest root-to-leaf path): every test example has depth 9, so accuracy by depth " \
           "is the all column (no depth table)." in operator.notes


def test_without_a_description_one_line_names_the_command_and_no_table_is_drawn(tmp_path):
    res = folder(tmp_path, describe=False)
    tables, _, _, lines, *_ = build_tables(res.root, plots=False)
    lines = [n for n in lines if not n.startswith("No SMAT table")]   # tests/report/test_smat_needs.py
    assert lines == ["ListOps diagnostics (protocol quick): not drawn, this folder has no testsets/listops-*.json; run "
                     "`python -m lra.data.describe <results folder>` with the data the runs used (LRA_DATA_DIR) and keep "
                     "testsets/ with the records."]
    assert not [t for t in tables if t.name.startswith("diagnostics")]


def test_a_description_of_other_data_is_never_used(tmp_path):
    other = folder(tmp_path / "other", fingerprint=FP, describe=False)
    write_description(other.root, description(other, fingerprint="1111111111111111"))
    assert notices(other) == [
        "ListOps diagnostics (protocol quick): not drawn, none of the 1 test-set description(s) under testsets/ is of "
        "its runs' test set (no description of its data (fingerprint 00000000feedbeef)); run `python -m "
        "lra.data.describe <results folder>` with the data the runs used (LRA_DATA_DIR) and keep testsets/ with the records."]
    assert not [t for t in build_tables(other.root, plots=False)[0] if t.name.startswith("diagnostics")]
    # a record without a fingerprint: its labels must be the description's, example for example
    relabelled = folder(tmp_path / "relabelled", fingerprint=None, describe=False)
    write_description(relabelled.root, description(relabelled, label=[(x + 1) % 10 for x in LABELS]))
    assert "(no description has its test labels and lengths (its record carries no data fingerprint))" in notices(relabelled)[0]
    assert not [t for t in build_tables(relabelled.root, plots=False)[0] if t.name.startswith("diagnostics")]
    # the same data fingerprint but other labels: not that test set either
    same_fp = folder(tmp_path / "same_fp", describe=False)
    write_description(same_fp.root, description(same_fp, length=[int(x) + 1 for x in same_fp.lengths]))
    assert "(its labels or lengths differ from testsets/listops-00000000feedbeef.json)" in notices(same_fp)[0]


def test_runs_matched_one_by_one_and_the_others_named(tmp_path):
    res = folder(tmp_path, fingerprint=None)          # records without fingerprints, matched by labels and lengths
    rec = res.train("linear", 1, data_fingerprint="2222222222222222")
    write_preds(res, rec, np.zeros(20, int))
    _, rows, t = table(res, "operator")
    assert rows["linear 0"]["seeds"] == "0"           # linear s1's data has no description: left out, named
    notes = " ".join(t.notes)
    assert "Not in this table: linear seed 1 (no description of its data (fingerprint 2222222222222222))" in notes
    assert "by their record's data fingerprint: 0; by their prediction files' labels and lengths alone " \
           "(records without a fingerprint): 3" in notes


def test_a_malformed_description_is_named_and_not_used(tmp_path):
    res = folder(tmp_path, describe=False)
    path = description_file(res.root, "listops", FP)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(description(res, operator=OPS[:-1])))
    lines = notices(res)
    assert lines[0] == f"ListOps diagnostics: testsets/{path.name}: operator, depth, label, length must be lists of " \
                       "one length; that file is not used."
    assert "not drawn, this folder has no usable testsets/listops-*.json" in lines[1] and len(lines) == 2


def test_same_records_and_description_give_the_same_bytes(tmp_path):
    a, b = folder(tmp_path / "a"), folder(tmp_path / "b")
    assert description_file(a.root, "listops", FP).read_bytes() == description_file(b.root, "listops", FP).read_bytes()
    def rendered(res: Results) -> dict[str, str]:
        return {t.name: t.markdown() + "\n".join(t.notes) + t.csv() + t.latex()
                for t in build_tables(res.root, plots=False)[0] if t.name.startswith("diagnostics")}

    assert rendered(a) == rendered(b) == rendered(a)
    assert sorted(rendered(a)) == [f"diagnostics_{k}_quick" for k in ("agreement", "answers", "depth", "operator")]


def test_a_single_run_gets_no_agreement_table(tmp_path):
    res = Results(tmp_path / "results", n_test=20)
    res.labels = np.array(LABELS)
    write_preds(res, res.train("softmax", 0, data_fingerprint=FP), OPERATOR_FUNCTION)
    write_description(res.root, description(res))
    names = [t.name for t in build_tables(res.root, plots=False)[0] if t.name.startswith("diagnostics")]
    assert names == ["diagnostics_operator_quick", "diagnostics_depth_quick", "diagnostics_answers_quick"]


def test_a_description_in_a_report_also_folder_is_used_and_a_differing_copy_named(tmp_path):
    """The SPT folder's report reads the from-scratch folder's test-set description too (report.also);
    a second description under the same name that differs is named and not used."""
    res = folder(tmp_path)
    own = Results(tmp_path / "spt", n_test=20)
    own.labels = res.labels
    write_preds(own, own.train("adamra", 0, data_fingerprint=FP), OPERATOR_FUNCTION)
    tables = [t.name for t in build_tables(own.root, plots=False, also=[res.root])[0]]
    assert "diagnostics_operator_quick" in tables
    write_description(own.root, description(res, depth=[4] * 20))
    lines = [n for n in build_tables(own.root, plots=False, also=[res.root])[3] if n.startswith("ListOps")]
    assert lines[0] == (f"ListOps diagnostics: testsets/listops-{FP}.json of {res.root} differs from the first folder's "
                        "description; that file is not used."), lines
