"""Bugs against issue 34's report rules: a comparison over what it displays, Holm over the declared
family, the across-task interval, one table model, the spread floor of the metric's own set."""
from tests.mutants import Mutant

DISPLAY = "tests/report/test_display.py"
STATS = "tests/report/test_report_stats.py"
FINDINGS = "tests/report/test_findings.py"

MUTANTS = [
    Mutant("report-display-paired-over-common", "lra/report/comparisons.py",
           "    if common == a.seeds == b.seeds:  # paired", "    if len(common) >= stats.MIN_SEEDS:  # paired",
           "a paired t over the common seeds beside cells whose means include seeds it left out (case 2)",
           (f"{DISPLAY}::test_case_2_a_test_never_leaves_out_displayed_seeds",)),
    Mutant("report-display-paired-two-common", "lra/report/comparisons.py",
           "    if common == a.seeds == b.seeds:  # paired", "    if len(common) >= 2:  # paired",
           "a paired t over two common seeds (one degree of freedom) instead of Welch below three",
           (f"{DISPLAY}::test_two_common_seeds_are_not_paired",)),
    Mutant("report-display-holm-per-task", "lra/report/comparisons.py",
           "              if k[0] != baseline_name(k[0]) and (baseline_name(k[0]), k[1]) in group.rows]\n"
           "    return _holm(_pairs(group, wanted, metric))",
           "              if k[0] != baseline_name(k[0]) and (baseline_name(k[0]), k[1]) in group.rows]\n"
           "    pairs = _pairs(group, wanted, metric)\n"
           "    return [c for t in group.tasks for c in _holm([c for c in pairs if c.task == t])]",
           "Holm applied per task instead of over the table's declared family",
           (f"{DISPLAY}::test_holm_runs_over_the_declared_family_not_per_task",)),
    Mutant("report-display-val-floor-from-test-set", "lra/report/comparisons.py",
           '    if metric == "test_acc":\n        return run.n_test', '    if True:\n        return run.n_test',
           "best_val_acc's spread floor taken from the test set's size (case 11d)",
           (f"{DISPLAY}::test_best_val_acc_floors_at_one_validation_example",)),
    Mutant("report-display-across-normal-quantile", "lra/report/stats.py",
           "half = float(_st.t.ppf(0.5 + level / 2, dof)) * math.sqrt(total) / len(xs)",
           "half = 1.959964 * math.sqrt(total) / len(xs)",
           "a normal quantile for the across-task mean of a few seeds per task: under-covers",
           (f"{STATS}::test_across_task_interval_covers_95_percent",)),
    Mutant("report-display-across-no-satterthwaite", "lra/report/stats.py",
           "dof = total ** 2 / sum(vk ** 2 / (x.size - 1) for vk, x in zip(v, xs))",
           "dof = sum(x.size for x in xs) - len(xs)",
           "pooled degrees of freedom (sum n_k - K) where the strata's variances differ",
           (f"{STATS}::test_stratified_t_interval_by_hand_and_probability_of_improvement",)),
    Mutant("report-display-across-range", "lra/report/stats.py",
           "    return mean, mean - half, mean + half\n\n\ndef _improvement",
           "    lo = float(np.mean([x.min() for x in xs]))\n    hi = float(np.mean([x.max() for x in xs]))\n"
           "    return mean, lo, hi\n\n\ndef _improvement",
           "the across-task interval as the seeds' range (what a percentile bootstrap of 3 seeds gives)",
           (f"{STATS}::test_across_task_interval_covers_95_percent", f"{FINDINGS}::test_best_validation_names_its_step")),
    Mutant("report-display-latex-drops-flags", "lra/report/tables.py",
           "            t = latex_escape(c.text)\n", "            t = latex_escape(c.text.split(\" (\")[0])\n",
           "a compact LaTeX cell that drops the Markdown cell's flags ((2 commits), (1 dof)) (case 7)",
           (f"{DISPLAY}::test_case_7_latex_and_csv_say_what_the_markdown_says", f"{FINDINGS}::test_6_only_one_experiment_pools_into_a_cell")),
    Mutant("report-display-csv-other-figure", "lra/report/accuracy.py",
           'cells.append(TableCell(text, raw["mean"], marks.get((t, key), 0), {f"{t}_{k}": raw[k] for k in TASK_FIELDS}))',
           'cells.append(TableCell(text, raw["mean"], marks.get((t, key), 0), {f"{t}_{k}": raw["high"] - raw["mean"] '
           'if k == "std" and raw["high"] is not None else raw[k] for k in TASK_FIELDS}))',
           "the CSV's std column holding the interval's half-width while the cell shows the sd (case 7)",
           (f"{FINDINGS}::test_1_zero_spread_is_floored_and_two_seeds_are_not_tested",)),
    Mutant("report-display-one-model-bold", "lra/report/tables.py",
           "    if len(values) < 2:\n        return\n", "    if not values:\n        return\n",
           "a one-model (or all-tied) column ranked: bold with nothing to beat (case 11c)",
           (f"{DISPLAY}::test_a_ranking_of_one_gets_no_bold",)),
]
