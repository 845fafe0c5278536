"""The accuracy table's bold and underline come from ranking tests Holm-corrected over the whole
table's family (every task's ranking tests together), not task by task: two tasks whose leader
wins at p = 0.039 each are not significant once both are counted (Holm 0.078), so neither is bold."""
from __future__ import annotations

import pytest

from lra.report.cells import accuracy_groups
from lra.report.comparisons import ranking_marks
from lra.report.screening import screen
from tests.report.fabricate import Results

B_CORRECT = [200, 210, 220]
A_AHEAD = [3, 4, 6]     # examples of 500 on seeds 0-2: +0.87 points, paired t = 4.91 on 2 df, p = 0.039


def two_tasks(tmp_path, tasks=("listops", "text")) -> Results:
    res = Results(tmp_path, n_test=500)
    for task in tasks:
        res.sweep("linear", B_CORRECT, task=task)
        res.sweep("adamra", [b + d for b, d in zip(B_CORRECT, A_AHEAD)], task=task)
    return res


def marks_and_tests(res: Results):
    runs, ledger = screen(res.root, "test_acc")
    (g,) = [g for g in accuracy_groups(runs, ledger) if g.protocol == "quick" and not g.custom]
    return ranking_marks(g, "test_acc")


def test_one_task_alone_is_significant(tmp_path) -> None:
    marks, tests = marks_and_tests(two_tasks(tmp_path, ("listops",)))
    (t,) = tests
    assert t.result.p == pytest.approx(0.039, abs=5e-4) and t.p_holm == t.result.p
    assert marks == {("listops", ("adamra", ())): 1}


def test_holm_counts_every_task_of_the_table(tmp_path) -> None:
    marks, tests = marks_and_tests(two_tasks(tmp_path))
    assert len(tests) == 2
    assert all(t.result.p == pytest.approx(0.039, abs=5e-4) for t in tests)
    assert all(t.p_holm == pytest.approx(2 * t.result.p) for t in tests)   # m = 2 tests, not 1 per task
    assert marks == {}
