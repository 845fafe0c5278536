"""Issue 34, the report's half: every comparison is over what it displays (case 2), Holm over the
declared family, Welch below three common seeds, the spread floor of the metric's own set (case 11d),
no bold for a ranking of one (case 11c), and exports that are renderings of one table model (case 7;
the cell-by-cell check of every test's folder: tests/report/conftest.py)."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as st

from lra.report import stats
from lra.report.accuracy import accuracy_table, significance_table
from lra.report.cells import accuracy_groups
from lra.report.comparisons import declared_family
from lra.report.screening import screen
from lra.report.tables import TableCell, emphasise
from tests.report.fabricate import Results


def group(res: Results, metric: str = "test_acc"):
    runs, ledger = screen(res.root, metric)
    return {(g.protocol, g.custom): g for g in accuracy_groups(runs, ledger)}["quick", False]


def family(g, metric: str = "test_acc") -> dict[tuple[str, str], object]:
    return {(c.variant[0], c.task): c for c in declared_family(g, metric)}


def row(md: str, name: str) -> str:
    return next(ln for ln in md.splitlines() if ln.startswith(f"| {name} |"))


def case_2(tmp_path) -> Results:
    """softmax seeds 0-4; adamra seeds 0-2, each one point above softmax on the same seed."""
    res = Results(tmp_path, n_test=500)
    res.sweep("softmax", [217, 222, 226, 265, 275])       # 43.4 44.4 45.2 53.0 55.0: mean 48.2
    res.sweep("adamra", [222, 227, 231])                  # +1 point on seeds 0-2: mean 45.33
    return res


def test_case_2_a_test_never_leaves_out_displayed_seeds(tmp_path):
    g = group(case_2(tmp_path))
    comp = family(g)["adamra", "listops"]
    shown = [float(np.mean(g.rows[k, ()]["listops"].values("test_acc"))) for k in ("adamra", "softmax")]
    # not a paired t over the three common seeds (+1.00, p 0.013): Welch over the seeds each cell shows
    assert comp.result.kind == "Welch t (seeds)" and (comp.result.n, comp.result.n_baseline) == (3, 5)
    assert comp.result.diff == pytest.approx(shown[0] - shown[1]) and comp.means == pytest.approx(tuple(shown))
    ref = st.ttest_ind([44.4, 45.4, 46.2], [43.4, 44.4, 45.2, 53.0, 55.0], equal_var=False)
    assert comp.result.p == pytest.approx(ref.pvalue, rel=1e-9) and not comp.significant
    md = accuracy_table(g, "test_acc", list(family(g).values()))[0].markdown()
    assert "†" not in row(md, "adamra") and "45.33 ± " in row(md, "adamra") and "48.20 ± " in row(md, "softmax")
    sig = significance_table(g, list(family(g).values())).markdown()
    assert "| listops | adamra | softmax | Welch t (seeds) | 3 / 5 | 45.33 | 48.20 | -2.87 |" in sig


def test_case_2_a_dagger_agrees_with_the_displayed_means(tmp_path):
    res = case_2(tmp_path)
    res.train("adamra", 3, 270)
    res.train("adamra", 4, 280)                           # now every displayed seed has its pair: +1 point each
    g = group(res)
    comp = family(g)["adamra", "listops"]
    assert comp.result.kind == "paired t (seeds)" and comp.result.n == 5 and comp.significant
    assert comp.result.diff == pytest.approx(comp.means[0] - comp.means[1]) == pytest.approx(1.0)
    md = accuracy_table(g, "test_acc", list(family(g).values()))[0].markdown()
    assert "49.20 ± 5.38 [42.52, 55.88] n=5 †" in row(md, "adamra") and "†" not in row(md, "softmax")


def test_two_common_seeds_are_not_paired(tmp_path):
    res = Results(tmp_path, n_test=500)
    res.sweep("softmax", [200, 215, 222])
    for seed, k in ((0, 230), (1, 241), (5, 252)):        # seeds 0 and 1 common: two pairs, one degree of freedom
        res.train("adamra", seed, k)
    comp = family(group(res))["adamra", "listops"]
    ref = st.ttest_ind([46.0, 48.2, 50.4], [40.0, 43.0, 44.4], equal_var=False)
    assert comp.result.kind == "Welch t (seeds)" and comp.result.p == pytest.approx(ref.pvalue, rel=1e-9)


def test_holm_runs_over_the_declared_family_not_per_task(tmp_path):
    res = Results(tmp_path, n_test=500)
    for task in ("listops", "text"):
        res.sweep("softmax", [200, 210, 220], task=task)
        res.sweep("adamra", [204, 216, 223], task=task)
        res.sweep("linear", [203, 209, 228], task=task)
    comps = declared_family(group(res), "test_acc")
    assert len(comps) == 4 and all(c.result is not None for c in comps)
    whole = stats.holm([c.result.p for c in comps])
    per_task = [p for t in ("listops", "text") for p in stats.holm([c.result.p for c in comps if c.task == t])]
    assert whole != pytest.approx(per_task)  # the two corrections differ here
    assert [c.p_holm for c in comps] == pytest.approx(whole, rel=1e-12)


def test_best_val_acc_floors_at_one_validation_example(tmp_path):
    res = Results(tmp_path, n_test=500)                   # one test example: 0.2 points
    for attn, ks in (("softmax", (40, 42, 44)), ("adamra", (41, 43, 45))):  # validation: +1 of 100 on every seed
        for seed, k in enumerate(ks):
            rec = res.train(attn, seed, 200)
            res.edit(rec, metrics={"best_val_acc": k / 100, "n_val": 100})
    comp = family(group(res, "best_val_acc"), "best_val_acc")["adamra", "listops"]
    # the floor is one validation example (1 point): t = 1 / (1 / sqrt 3), not 1 / (0.2 / sqrt 3)
    assert comp.result.p == pytest.approx(2 * st.t.sf(math.sqrt(3), 2), rel=1e-9)
    # without the validation-set size there is no floor, so no test
    res2 = Results(tmp_path / "unknown", n_test=500)
    for attn, ks in (("softmax", (40, 42, 44)), ("adamra", (41, 43, 45))):
        for seed, k in enumerate(ks):
            res2.edit(res2.train(attn, seed, 200), metrics={"best_val_acc": k / 100})
    comp = family(group(res2, "best_val_acc"), "best_val_acc")["adamra", "listops"]
    assert comp.result is None and comp.reason.startswith("validation-set size unknown (the records lack metrics.n_val)")


def test_a_ranking_of_one_gets_no_bold():
    one = [TableCell("40.0", 40.0), TableCell("—")]
    emphasise(one)
    assert [c.emph for c in one] == [0, 0]
    tied = [TableCell("40.0", 40.0), TableCell("40.0", 40.0)]
    emphasise(tied)
    assert [c.emph for c in tied] == [0, 0]
    two = [TableCell("40.0", 40.0), TableCell("30.0", 30.0), TableCell("20.0", 20.0)]
    emphasise(two, higher_is_better=False)
    assert [c.emph for c in two] == [0, 2, 1]


@pytest.mark.slow
def test_case_7_latex_and_csv_say_what_the_markdown_says(tmp_path):
    res = Results(tmp_path, n_test=500)
    for seed, (k, commit) in enumerate(((217, "a"), (222, "a"), (226, "b"), (265, "b"), (275, "b"))):
        res.train("softmax", seed, k, commit=commit * 12)
    md, files, _ = res.report()
    cell = row(md, "softmax").split(" | ")[2]
    assert cell == "48.20 ± 5.38 [41.52, 54.88] n=5 (2 commits)"
    tex = files["tables/accuracy_quick.tex"]  # the same cell: ± sd (not ± the half-width), the commit flag kept
    assert "48.20 $\\pm$ 5.38 [41.52, 54.88] n=5 (2 commits)" in tex and "mean $\\pm$ sd [95\\% t-interval" in tex
    assert "\\toprule" in tex and "\\item" in files["tables/accuracy_quick.notes.tex"]
    fields = files["tables/accuracy_quick.csv"].splitlines()[1].split(",")
    assert fields[:3] == ["softmax", "run", "48.2"] and float(fields[3]) == pytest.approx(5.3796, abs=1e-4)
    assert fields[10] == "aaaaaaaaaa;bbbbbbbbbb"  # the two commits behind the flag
