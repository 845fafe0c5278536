"""Issue 22's ten findings, each from an adversarial results folder built here: what the report may
say, and what it must say it leaves out. (Arithmetic against independent computations:
test_report_stats.py and test_report.py.)"""
from __future__ import annotations

import csv
import io
import math
import shutil

import numpy as np
import pytest
from scipy import stats as st

from lra.footprint import CUDA
from lra.report import stats
from lra.report.accuracy import accuracy_table, across_table, significance_table
from lra.report.build import excluded_csv, excluded_section
from lra.report.cells import AccuracyGroup, accuracy_groups
from lra.report.comparisons import declared_family, exploratory, run_pairs
from lra.report.efficiency import bench_groups, covered_from_step, device_label, smat_table, training_points
from lra.report.lengths import curves, length_data
from lra.report.screening import screen
from lra.report.smat import smat_scores
from tests.report.fabricate import Results


def tables(res: Results, metric: str = "test_acc"):
    runs, ledger = screen(res.root, metric)
    groups = {(g.protocol, g.custom): g for g in accuracy_groups(runs, ledger)}
    return runs, ledger, groups


def reasons(ledger) -> dict[str, str]:
    """file name without .json (the run id, for records not renamed) -> reason"""
    return {e.file.removesuffix(".json"): e.reason for e in ledger.excluded}


def line(md: str, start: str) -> str:
    return next(ln for ln in md.splitlines() if ln.startswith(start))


def family(group: AccuracyGroup) -> dict[str, object]:
    return {c.variant[0]: c for c in declared_family(group, "test_acc")}


# 1 -------------------------------------------------------------------------------------------
def test_1_zero_spread_is_floored_and_two_seeds_are_not_tested(tmp_path):
    res = Results(tmp_path, n_test=500)
    res.sweep("softmax", [200, 210, 220])
    res.sweep("adamra", [201, 211, 221])      # +0.2 points on every seed: zero spread of the differences
    res.sweep("linear", [260, 262])            # two seeds: far ahead, but one degree of freedom
    _, _, groups = tables(res)
    g = groups["quick", False]
    fam = family(g)
    r = fam["adamra"].result
    # the sd of the differences is floored at one example (0.2 points): t = 0.2 / (0.2 / sqrt 3)
    assert r.kind == "paired t (seeds)" and r.diff == pytest.approx(0.2)
    assert r.p == pytest.approx(2 * st.t.sf(math.sqrt(3), 2), rel=1e-9) and r.low < 0 < r.high
    assert not fam["adamra"].significant
    assert fam["linear"].result is None and fam["linear"].reason == "needs ≥ 3 seeds per side (has 2 and 3)"
    md = accuracy_table(g, "test_acc", list(fam.values()))[0].markdown()
    assert "†" not in md and "**" not in md and "(1 dof)" in line(md, "| linear |")


# 2 -------------------------------------------------------------------------------------------
def test_2_nan_and_percentage_accuracies_are_excluded_with_reasons(tmp_path):
    res = Results(tmp_path)
    res.sweep("softmax", [80, 90, 100])
    nan = res.edit(res.train("softmax", 3, 95), metrics={"test_acc": float("nan")})
    pct = res.edit(res.train("adamra", 0, 92, preds=False), metrics={"test_acc": 46.0})
    txt = res.edit(res.train("adamra", 1, 92, preds=False), metrics={"test_acc": "0.46"})
    runs, ledger, groups = tables(res)
    why = reasons(ledger)
    assert why[nan["run_id"]] == "metrics.test_acc=nan is not finite"
    assert why[pct["run_id"]] == "metrics.test_acc=46.0 is outside [0, 1] (a percentage? records store fractions)"
    assert why[txt["run_id"]] == "metrics.test_acc='0.46' is not a number"
    g = groups["quick", False]
    assert list(g.rows) == [("softmax", ())] and g.rows["softmax", ()]["listops"].seeds == [0, 1, 2]
    assert "4600" not in accuracy_table(g, "test_acc", [])[0].markdown()


# 3 -------------------------------------------------------------------------------------------
def test_3_prediction_files_are_checked_against_their_record(tmp_path):
    res = Results(tmp_path)
    soft = res.sweep("softmax", [80, 90, 100])
    res.sweep("linear", [85, 95, 105])
    # another run's file with the same accuracy: only its name gives it away
    other = res.train("adamra", 0, 90)
    other = res.edit(other, predictions={**other["predictions"], "file": soft[1]["predictions"]["file"]})
    # `correct` contradicting pred == label, with the accuracy unchanged
    liar = res.train("adamra", 1, 90)
    path = res.runs / liar["predictions"]["file"]
    with np.load(path) as z:
        arrays = {k: z[k].copy() for k in z.files}
    right, wrong = np.flatnonzero(arrays["correct"])[0], np.flatnonzero(~arrays["correct"])[0]
    arrays["correct"][right], arrays["correct"][wrong] = False, True
    np.savez(path, **arrays)
    # a torn file, and a complete file of a shorter test set whose record still says 200
    torn = res.train("adamra", 2, 90)
    data = (res.runs / torn["predictions"]["file"]).read_bytes()
    (res.runs / torn["predictions"]["file"]).write_bytes(data[: len(data) // 2])
    short = res.train("adamra", 3, 50)
    np.savez(res.runs / short["predictions"]["file"], pred=res.labels[:100], correct=np.ones(100, bool),
             label=res.labels[:100], length=np.full(100, 7))
    # a record whose test_acc disagrees with its own file
    off = res.edit(res.train("adamra", 4, 90), metrics={"test_acc": 0.5})
    runs, ledger, groups = tables(res)
    why = reasons(ledger)
    assert why[other["run_id"]].startswith(f"its predictions file {soft[1]['predictions']['file']} belongs to another run")
    assert why[liar["run_id"]] == "its predictions contradict themselves: correct != (pred == label) on 2 examples"
    assert "unreadable" in why[torn["run_id"]] and "truncated?" in why[torn["run_id"]]
    assert why[short["run_id"]] == "its predictions file holds 100 examples, the record says 200"
    assert why[off["run_id"]] == "its predictions give accuracy 0.4500, the record's metrics.test_acc is 0.5"
    g = groups["quick", False]
    assert ("adamra", ()) not in g.rows
    table, labels, _ = length_data(g, "listops")
    edges = stats.length_buckets(res.lengths)  # the buckets of the real test set, untouched by the short file
    assert [lab.split(" ")[0] for lab in labels] == [f"{int(edges[i])}-{int(edges[i + 1]) - (i < len(edges) - 2)}"
                                                     for i in range(len(edges) - 1)]
    assert sum(int(h.split("(")[-1].split(" ")[0]) for h in table.header[3:]) == res.n


# 4 -------------------------------------------------------------------------------------------
def test_4_mcnemar_never_stands_in_for_a_seed_level_test(tmp_path):
    res = Results(tmp_path)
    res.sweep("softmax", [80, 90, 100])
    for seed, k in zip((3, 4, 5), (96, 104, 110)):  # disjoint seeds, n >= 3 each: Welch's t over seeds
        res.train("linear", seed, k)
    res.train("adamra", 0, 170)                  # one seed, far better on the same examples
    res.train("performer", 7, 20)                # one seed, no common seed
    _, _, groups = tables(res)
    g = groups["quick", False]
    fam = family(g)
    welch = st.ttest_ind([48.0, 52.0, 55.0], [40.0, 45.0, 50.0], equal_var=False)
    assert fam["linear"].result.kind == "Welch t (seeds)" and fam["linear"].result.p == pytest.approx(welch.pvalue, rel=1e-9)
    assert (fam["linear"].result.n, fam["linear"].result.n_baseline) == (3, 3)
    assert fam["adamra"].result is None and fam["performer"].result is None
    pairs = run_pairs(g, list(fam.values()))
    assert [(p.variant[0], p.seed) for p in pairs] == [("adamra", 0)]  # performer shares no seed: no pair at all
    assert pairs[0].result.kind.startswith("McNemar") and pairs[0].result.p < 1e-10 and pairs[0].result.n == res.n
    # the run pair's tiny p earns nothing: no dagger, and the seed-level table says "not tested"
    md = accuracy_table(g, "test_acc", list(fam.values()))[0].markdown()
    assert "†" not in md
    sig = significance_table(g, list(fam.values()))
    row = next(r for r in sig.rows if r[1].text == "adamra")
    assert row[3].text == "not tested: needs ≥ 3 seeds per side (has 1 and 3)"
    assert "Holm over the 1 tested member(s): linear vs softmax on listops" in " ".join(sig.notes)


# 5 -------------------------------------------------------------------------------------------
def test_5_the_holm_family_is_declared_not_whatever_is_in_results(tmp_path):
    res = Results(tmp_path)
    res.sweep("softmax", [80, 90, 100])
    res.sweep("adamra", [88, 99, 104])
    res.sweep("linear", [81, 92, 101])
    _, _, groups = tables(res)
    before = {k: c.p_holm for k, c in family(groups["quick", False]).items()}
    # what a results folder accumulates: a two-seed variant, a custom run, another protocol's runs
    res.sweep("performer", [60, 120])
    res.train("nystromformer", 0, 100, overrides=["experiment=quick", "optim.lr=0.01"], changes={"optim__lr": 0.01})
    res.sweep("softmax", [70, 71, 72], protocol="xiong2021")
    res.sweep("adamra", [120, 121, 122], protocol="xiong2021")
    _, _, groups = tables(res)
    g = groups["quick", False]
    after = family(g)
    assert {k: after[k].p_holm for k in before} == pytest.approx(before, rel=1e-12)
    assert after["performer"].result is None
    members = sorted((c.variant[0], c.baseline[0], c.result is not None) for c in declared_family(g, "test_acc"))
    assert members == [("adamra", "softmax", True), ("linear", "softmax", True), ("performer", "softmax", False)]
    p_ada, p_lin = after["adamra"].result.p, after["linear"].result.p
    assert after["adamra"].p_holm == pytest.approx(min(1.0, max(2 * min(p_ada, p_lin), p_ada if p_ada > p_lin else 0)))
    # report.compare is exploratory: its own table and correction, never in the family
    comps = exploratory(g, ("adamra", "linear"), "test_acc")
    assert [(c.variant[0], c.baseline[0]) for c in comps] == [("adamra", "linear")]
    assert comps[0].p_holm == pytest.approx(comps[0].result.p)  # alone in its own family
    assert {k: family(g)[k].p_holm for k in before} == pytest.approx(before, rel=1e-12)


# 6 -------------------------------------------------------------------------------------------
def test_6_only_one_experiment_pools_into_a_cell(tmp_path):
    res = Results(tmp_path)
    res.sweep("softmax", [80, 90, 100])
    res.train("softmax", 3, 150, changes={"optim__lr": 0.001}, commit="bbbbbbbbbbbb")  # an lr edited in the YAML
    res.train("softmax", 4, 84, commit="cccccccccccc")                                  # same config, other commit
    as_text = res.train("softmax", "0", 95)
    no_seed = res.train("softmax", 5, 95)
    no_seed.pop("seed")
    res.write(no_seed)
    no_protocol = res.edit(res.train("softmax", 6, 95), protocol=None)
    mismatch = res.edit(res.train("softmax", 7, 95), seed=8)
    runs, ledger, groups = tables(res)
    why = reasons(ledger)
    assert why[as_text["run_id"]] == "seed='0' is not a non-negative int"
    assert why[no_seed["run_id"]] == "no seed: runs of unknown seed cannot be told apart"
    assert why[no_protocol["run_id"]].startswith("protocol=None")
    assert why[mismatch["run_id"]] == "seed=8 disagrees with its config (seed=7): edited by hand?"
    proto, custom = groups["quick", False], groups["quick", True]
    cell = proto.rows["softmax", ()]["listops"]
    assert cell.seeds == [0, 1, 2, 4] and cell.commits == ["aaaaaaaaaa", "cccccccccc"]
    assert "(2 commits)" in accuracy_table(proto, "test_acc", [])[0].markdown()
    ((key, per),) = custom.rows.items()
    assert key[0] == "softmax" and key[1][0].endswith(": optim.lr=0.001") and per["listops"].seeds == [3]
    assert per["listops"].config_hash != cell.config_hash and per["listops"].config_hash in key[1][0]
    # a variant whose own runs all used another learning rate is not the protocol (issue 34, case 6):
    # a custom row of its own, never tested against softmax
    res.sweep("linear", [85, 95, 105], changes={"optim__lr": 0.01})
    _, _, groups = tables(res)
    assert "linear" not in family(groups["quick", False])
    (key,) = [k for k in groups["quick", True].rows if k[0] == "linear"]
    assert key[1][0].startswith("config ") and key[1][0].endswith(": optim.lr=0.01")


def test_6_an_override_row_tests_only_variants_one_experiment_apart(tmp_path):
    """A row of protocol-defining overrides takes each variant's runs as they come (no protocol
    reference to match), so the seed-level test itself must see that linear's YAML edited its lr."""
    res = Results(tmp_path)
    for attention, ks, changes in (("softmax", [80, 90, 100], {}), ("linear", [85, 95, 105], {"optim__lr": 0.01})):
        for seed, k in enumerate(ks):
            res.train(attention, seed, k, changes={"task__max_len": 128, **changes},
                      overrides=["experiment=quick", f"attention={attention}", f"seed={seed}", "task.max_len=128"])
    _, _, groups = tables(res)
    row = family(groups["quick", True])["linear"]
    assert row.baseline == ("softmax", ("task.max_len=128",)) and row.result is None
    assert row.reason == "not one experiment apart from the attention (differ in optim.lr=0.01)"


def test_6_bench_groups_keep_models_apart(tmp_path):
    res = Results(tmp_path)
    for model, ms in (("tiny", 10.0), ("xiong", 40.0)):
        for attn, scale in (("softmax", 1.0), ("linear", 0.5)):
            rec = {"schema": 1, "run_id": f"b-{model}-{attn}", "mode": "bench", "task": "text", "attention": attn, "seed": 0,
                   "protocol": "table2", "status": "finished", "stamp": {"cpu": "Test CPU"}, "started_at": f"2026-01-0{1 + (model == 'xiong')}",
                   "config": {"model": {"d_model": 32 if model == "tiny" else 64, "n_layers": 1 if model == "tiny" else 2,
                                        "n_heads": 2, "d_ffn": 64 if model == "tiny" else 128}},
                   "efficiency": {"threads": 1, "bench": {"protocol": "table2", "batch_size": 16, "device": "cpu", "results": [
                       {"length": 1024, "status": "ok", "ms": ms * scale, "peak_mb": 100.0, "examples_per_s": 1.0}]}}}
            res.write(rec)
    runs, ledger = screen(res.root, "test_acc")
    groups = bench_groups(runs, ledger)
    assert sorted(g.model for g in groups) == ["L1 d32 h2 ffn64", "L2 d64 h2 ffn128"]
    assert all(set(g.members) == {"softmax", "linear"} for g in groups) and not ledger.excluded
    assert len({g.name for g in groups}) == 2  # two tables, two file names


# 7 -------------------------------------------------------------------------------------------
def test_7_every_dropped_record_is_listed_with_its_reason(tmp_path):
    res = Results(tmp_path)
    res.sweep("softmax", [80, 90, 100])
    ada = res.sweep("adamra", [85, 95, 105])
    no_metrics = res.train("adamra", 3, 90)
    no_metrics["metrics"] = {}
    res.write(no_metrics)
    null = res.edit(res.train("adamra", 4, 90), metrics={"test_acc": None})
    newer = res.train("adamra", 0, 120)                                   # the same seed again: newest counts
    gone = res.train("linear", 0, 90)
    (res.runs / gone["predictions"]["file"]).unlink()
    shutil.copy(res.runs / f"{ada[1]['run_id']}.json", res.runs / "copy-of-a-record.json")
    error = "RuntimeError: CUDA error at /very/long/path/" + "x" * 200 + "/kernel.cu:42\nsecond line of the trace"
    res.edit(res.train("linear", 1, 90), status="failed", error=error)
    (res.runs / "broken.json").write_text("{not json")
    runs, ledger, groups = tables(res)
    why = reasons(ledger)
    assert why[no_metrics["run_id"]] == "no metrics" and why[null["run_id"]] == "metrics.test_acc is null (the run recorded no test_acc)"
    assert why[ada[0]["run_id"]] == f"a newer record of the same experiment and seed counts: {newer['run_id']}"
    assert why[gone["run_id"]] == f"its predictions file {gone['predictions']['file']} is missing"
    assert why["copy-of-a-record"].startswith("the file name copy-of-a-record.json does not match its run_id")
    assert why["broken"].startswith("unreadable record")
    assert ledger.files == 13 and ledger.used == 6 and len(ledger.excluded) == 7
    g = groups["quick", False]
    assert g.rows["adamra", ()]["listops"].seeds == [0, 1, 2] and ("linear", ()) not in g.rows
    md = "\n".join(excluded_section(ledger))
    assert error.splitlines()[0] in md and "  second line of the trace" in md  # uncut, every line
    assert "### Failed a check (4)" in md and "### Superseded duplicate (1)" in md and "### Not finished (1)" in md
    rows = list(csv.reader(io.StringIO(excluded_csv(ledger))))
    assert len(rows) == 8 and all(r[1] and r[2] for r in rows[1:]) and error in [r[2] for r in rows]


@pytest.mark.slow
def test_7_header_counts_every_file(tmp_path):
    res = Results(tmp_path)
    res.sweep("softmax", [80, 90, 100])
    res.edit(res.train("softmax", 3, 90), metrics={"test_acc": None})
    md, files, _ = res.report()
    assert ("Built from 4 record file(s) under `runs/`: 3 used, 1 excluded (0 malformed, 0 not finished, 1 failed a "
            "check, 0 superseded duplicate, 0 not used)") in md
    assert md.index("## Excluded records") < md.index("## Accuracy")
    assert "metrics.test_acc is null" in files["excluded.csv"]


# 8 -------------------------------------------------------------------------------------------
def test_8_marks_only_for_significant_leads_and_one_interval_kind(tmp_path):
    res = Results(tmp_path)
    res.sweep("softmax", [80, 82, 84])
    res.sweep("linear", [81, 84, 85])
    res.train("performer", 0, 98)                 # one seed, the highest mean: no test, so no mark for anyone
    res.sweep("local", [60, 62])                  # two seeds
    _, _, groups = tables(res)
    g = groups["quick", False]
    table = accuracy_table(g, "test_acc", declared_family(g, "test_acc"))[0]
    md = table.markdown()
    assert "**" not in md and "<u>" not in md
    assert line(md, "| performer |") == "| performer | run | 49.00 n=1 (no interval) | 49.00 |"
    assert "(1 dof)" in line(md, "| local |") and "bootstrap" not in md
    assert table.title.endswith("mean ± sd [95% t-interval over seeds]")
    sig = significance_table(g, declared_family(g, "test_acc"))
    assert {r[4].text for r in sig.rows if not r[3].text.startswith("not tested")} == {"3 pairs"}
    # far ahead of a single-seed runner-up: still untestable, still no mark
    res.sweep("adamra", [150, 152, 155])
    _, _, groups = tables(res)
    g = groups["quick", False]
    assert "**" not in accuracy_table(g, "test_acc", declared_family(g, "test_acc"))[0].markdown()
    # a lead the seed-level test supports is bold; the runner-up is underlined only if it leads the third
    res = Results(tmp_path / "second")
    res.sweep("softmax", [80, 82, 84])
    res.sweep("linear", [81, 84, 85])
    res.sweep("adamra", [150, 152, 155])
    _, _, groups = tables(res)
    g = groups["quick", False]
    md = accuracy_table(g, "test_acc", declared_family(g, "test_acc"))[0].markdown()
    assert line(md, "| adamra |").startswith("| adamra | run | **76.17 ± 1.26") and "<u>" not in md


# 9 -------------------------------------------------------------------------------------------
def _smat_bench(res: Results, attn: str, speed: float, mb: float) -> None:
    res.write({"schema": 1, "run_id": f"smat-{attn}", "mode": "bench", "task": "listops", "attention": attn, "seed": 0,
               "protocol": "smat", "status": "finished", "stamp": {"cpu": "Test CPU"}, "started_at": "2026-01-01",
               "config": {"model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "d_ffn": 64}},
               "efficiency": {"threads": 1, "bench": {"protocol": "smat", "batch_size": 8, "device": "cpu", "results": [
                   {"length": 64, "status": "ok", "ms": 8000 / speed, "peak_mb": mb, "examples_per_s": speed}]}}})


def test_9_smat_is_exact_and_labelled_with_its_protocol(tmp_path):
    res = Results(tmp_path)
    for attn, ks, speed, mb in (("softmax", [80, 90, 100], 14.5, 6645.0), ("bigbird", [85, 91, 99], 36.4, 2917.0),
                                ("linear", [70, 75, 80], 200.0, 1353.0)):
        res.sweep(attn, ks)
        _smat_bench(res, attn, speed, mb)
    runs, ledger, groups = tables(res)
    g = groups["quick", False]
    _, averages = accuracy_table(g, "test_acc", [])
    (bench,) = [b for b in bench_groups(runs, ledger) if b.protocol == "smat"]
    table, points, label = smat_table(bench, averages, "quick")
    exact = smat_scores([p[1] for p in points], [p[2] for p in points], [p[3] for p in points], round_to=None)
    rounded = smat_scores([p[1] for p in points], [p[2] for p in points], [p[3] for p in points])
    assert any(abs(e["smat"] - r["smat"]) > 1e-9 for e, r in zip(exact, rounded))  # rounding would show
    csv_rows = [r.split(",") for r in table.csv().splitlines()[1:]]
    assert [float(r[8]) for r in csv_rows] == [e["smat"] for e in exact] == [float(r[9]) for r in csv_rows]
    assert "N=64" in table.title and "batch 8" in table.title and "model L1 d32 h2 ffn64" in table.title
    assert "task listops" in table.title and "not the LRA average" in table.title
    assert table.header[4] == "Avg listops" and any("Not AdaMRA Table 3's protocol" in n for n in table.notes)
    assert label == "mean accuracy over listops (protocol quick; not the LRA average)"


def test_9_bubble_fallback_claims_no_lra_average_and_no_process_memory(tmp_path):
    from lra.report.plots import bubble_figure

    res = Results(tmp_path)
    eff = {"throughput": {"train": {"examples_per_s": 50.0}}, "peak_memory": {"train_mb": 440.0, "method": "cpu-vmhwm-reset"}}
    res.sweep("softmax", [80, 90, 100], efficiency=eff)
    res.sweep("linear", [70, 75, 80], efficiency=eff)
    _, _, groups = tables(res)
    g = groups["quick", False]
    _, averages = accuracy_table(g, "test_acc", [])
    points, title = training_points(g, averages)
    assert [p[2] for p in points] == [None, None]  # no circle sizes from the process peak
    assert "not the LRA average" in title and "circle size: not memory" in title
    assert "after a resume" not in title  # unresumed runs: their throughput is the whole run's
    fig = bubble_figure(points, [], title, "ref", "mean accuracy over listops (protocol quick; not the LRA average)")
    assert "LRA average" not in fig.axes[0].get_ylabel().replace("not the LRA average", "")


def test_9_bubble_fallback_says_which_throughputs_cover_part_of_a_run(tmp_path):
    """A resumed run's throughput covers its steps from ``throughput.from_step``; a record from before
    that field kept only its last stretch (the last wall segment's start). The title counts them."""
    res = Results(tmp_path)
    tp = {"train": {"examples_per_s": 50.0}}

    def eff(**kw):
        return {"throughput": {**tp, **kw.pop("throughput", {})}, **kw}

    whole = res.train("softmax", 0, 80, efficiency=eff(throughput={"from_step": 0}), resume_count=3)
    old = res.train("softmax", 1, 90, efficiency=eff(wall={"segments": [{"from_step": 0}, {"from_step": 1500}]}),
                    resume_count=2)
    late = res.train("softmax", 2, 100, efficiency=eff(throughput={"from_step": 2000}), resume_count=1)
    unknown = {"efficiency": eff(), "resume_count": 1}
    res.sweep("linear", [70, 75, 80], efficiency=eff())  # never resumed, pre-field records: the whole run
    assert [covered_from_step(r, "throughput") for r in (whole, old, late, unknown)] == [0, 1500, 2000, None]
    _, _, groups = tables(res)
    _, averages = accuracy_table(groups["quick", False], "test_acc", [])
    _, title = training_points(groups["quick", False], averages)
    assert "throughput of 2 of 6 runs covers only their steps after a resume" in title
    assert "peak memory of" not in title  # a CPU chart draws no memory, so it claims none


def test_9_bubble_says_which_cuda_memory_peaks_cover_part_of_a_run(tmp_path):
    """On CUDA the circles are ``peak_memory.train_mb``; a peak resumed from a checkpoint older than
    ``peak_memory.from_step`` covers only the last stretch, and the title counts those runs."""
    res = Results(tmp_path)

    def eff(mem: dict) -> dict:
        return {"throughput": {"train": {"examples_per_s": 50.0}, "from_step": 0},
                "peak_memory": {"train_mb": 440.0, "method": CUDA, **mem},
                "wall": {"segments": [{"from_step": 0}, {"from_step": 1200}]}}

    runs = [res.train("softmax", 0, 80, efficiency=eff({"from_step": 0}), resume_count=1),
            res.train("softmax", 1, 90, efficiency=eff({}), resume_count=1),  # before the field: last stretch
            res.train("softmax", 2, 100, efficiency=eff({"from_step": 300}), resume_count=1)]
    res.sweep("linear", [70, 75, 80], efficiency=eff({}))  # never resumed: the whole run
    assert [covered_from_step(r, "peak_memory") for r in runs] == [0, 1200, 300]
    _, _, groups = tables(res)
    _, averages = accuracy_table(groups["quick", False], "test_acc", [])
    points, title = training_points(groups["quick", False], averages)
    assert all(p[2] == 440.0 for p in points)  # CUDA peaks are drawn
    assert "peak memory of 2 of 6 runs covers only their steps after a resume" in title
    assert "; throughput of" not in title  # every throughput covers its whole run


# 10 ------------------------------------------------------------------------------------------
def test_10_length_table_has_intervals_and_counts_examples_once(tmp_path):
    lengths = np.concatenate([np.arange(5, 55), np.full(50, 30), np.arange(10, 60), np.full(50, 64)])  # 50 cut at 64
    res = Results(tmp_path, lengths=lengths)
    res.sweep("softmax", [80, 90, 100])
    res.train("linear", 0, 90)
    _, _, groups = tables(res)
    g = groups["quick", False]
    table, labels, data = length_data(g, "listops")
    assert labels[-1].endswith("(50 at max_len)") and any("task.max_len=64: 50 example(s) (25.0%) are at max_len" in n for n in table.notes)
    counts = [int(h.split("(")[-1].split(" ")[0]) for h in table.header[3:]]
    assert sum(counts) == res.n  # each example once, not once per seed
    softmax = data["softmax", ()]
    correct = np.stack([res.correct(k) for k in (80, 90, 100)])
    edges = stats.length_buckets(lengths)
    bucket = stats.bucket_of(lengths, edges)
    for i, (acc, lo, hi) in enumerate(softmax):
        assert acc == pytest.approx(100 * correct[:, bucket == i].mean()) and lo < acc < hi
    assert [r[2].text for r in table.rows] == ["3", "1"]  # seeds per row


def test_10_plots_mark_single_seeds_and_keep_colours(tmp_path):
    from lra.report.plots import Palette, curve_figure, length_figure, scaling_figure

    res = Results(tmp_path)
    res.sweep("softmax", [80, 90, 100])
    res.train("adamra", 0, 90)
    _, _, groups = tables(res)
    g = groups["quick", False]
    palette = Palette()
    styles = {"softmax": palette.style("softmax"), "adamra": palette.style("adamra")}
    fig = curve_figure({("softmax" if k[0] == "softmax" else "adamra"): v for k, v in curves(g, "listops").items()}, "t", styles)
    lines = {ln.get_label(): ln for ln in fig.axes[0].get_lines()}
    assert set(lines) == {"softmax (3 seeds)", "adamra (1 seed)"} and lines["adamra (1 seed)"].get_linestyle() == "--"
    _, labels, data = length_data(g, "listops")
    fig = length_figure(labels, {k[0]: v for k, v in data.items()}, "t", styles)
    assert len(fig.axes[0].containers) == 2  # error bars for both rows
    colours = {c.get_label(): c.lines[0].get_color() for c in fig.axes[0].containers}
    # the scaling plot of adamra alone gives it the report's colour, not the first colour of its own plot
    fig = scaling_figure({"adamra": [(256, 15.0, 5.0), (1024, 600.0, 50.0)]}, "t", palette=palette)
    assert fig.axes[0].get_lines()[0].get_color() == colours["adamra"] == palette.style("adamra")["color"] != "C0"
    ticks = [t for t in fig.axes[0].get_yticks() if 15 <= t <= 600]
    assert len(ticks) >= 3  # matplotlib alone labels only 100 on this axis


# the report side of issue 28 ---------------------------------------------------------------------
def test_report_settings_are_checked_before_anything_is_created(tmp_path):
    from omegaconf import OmegaConf

    from lra.badinput import ConfigError, DataMissingError
    from lra.report.arguments import check_report_config

    res = Results(tmp_path / "results")
    res.sweep("adamra", [80, 90, 100])

    def check(**report):
        check_report_config(OmegaConf.create({"report": {"results_dir": str(res.root), "metric": "test_acc", "compare": None, **report}}))

    check()
    with pytest.raises(ConfigError, match=r"report.metric='acc' is not a metric of the run records; valid: test_acc, best_val_acc"):
        check(metric="acc")
    with pytest.raises(ConfigError, match=r"report.compare=\['adamra'\] must name two different variants"):
        check(compare=["adamra"])
    with pytest.raises(ConfigError, match="names foo, which no finished training record .* has; variants with finished runs: adamra"):
        check(compare=["adamra", "foo"])
    with pytest.raises(DataMissingError, match="results folder .*/typo does not exist; point LRA_RESULTS_DIR"):
        check(results_dir=str(tmp_path / "typo"))
    assert not (tmp_path / "typo").exists()
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataMissingError, match="holds no run records"):
        check(results_dir=str(tmp_path / "empty"))


def test_threads_override_keeps_a_protocol_run():
    from lra.report.protocols import protocol_overrides

    assert protocol_overrides({"overrides": ["experiment=quick", "attention=linear", "seed=1", "threads=1"]}) == ()


def test_best_validation_names_its_step(tmp_path):
    res = Results(tmp_path)
    for seed, (k, step) in enumerate(((80, 500), (90, 600), (100, 600))):
        res.edit(res.train("softmax", seed, k), metrics={"best_val_step": step})
    res.train("linear", 0, 90)  # an older record without the field
    _, _, groups = tables(res, "best_val_acc")
    g = groups["quick", False]
    md = accuracy_table(g, "best_val_acc", [])[0].markdown()
    assert "@steps 500/600/600" in line(md, "| softmax |") and "@step" not in line(md, "| linear |")
    across = across_table(g, "best_val_acc").markdown()
    _, lo, hi = stats.t_interval([40.0, 45.0, 50.0])  # one task: the cell's own t-interval, not the seeds' range
    assert f"| softmax | run | listops | 45.00 [{lo:.2f}, {hi:.2f}] |" in across and f"{lo:.2f}" == "32.58"


def test_9_bubble_draws_one_device_and_names_the_rows_measured_elsewhere(tmp_path):
    """A row's throughput is the mean of its runs on the chart's device, its accuracy every seed's.
    A run's throughput was measured where its last stretch ran (the monitor sums stretches on one
    machine only), not where its stamp says it started; a GPU training record without stretches was
    measured on the stamp's GPU unless its trainer was told to use the CPU."""
    res = Results(tmp_path)

    def eff(*cpus: str) -> dict:
        return {"throughput": {"train": {"examples_per_s": 50.0}},
                "wall": {"segments": [{"from_step": 100 * i, "device": "cpu", "cpu": c} for i, c in enumerate(cpus)]}}

    res.sweep("softmax", [80, 90, 100], efficiency=eff("CPU B"))
    res.sweep("linear", [70, 75, 80], efficiency=eff("CPU A", "CPU B"))  # its last stretches ran on CPU B
    moved = res.sweep("bigbird", [70, 90, 80], efficiency=eff("CPU B"))
    resumed = eff("CPU B", "CPU A")  # resumed on CPU A: its throughput is CPU A's
    resumed["throughput"]["train"]["examples_per_s"] = 500.0
    res.edit(moved[1], efficiency=resumed)
    res.sweep("local", [70, 75, 80], efficiency=eff("CPU A"))
    _, _, groups = tables(res)
    _, averages = accuracy_table(groups["quick", False], "test_acc", [])
    points, title = training_points(groups["quick", False], averages)
    drawn = {p[0]: p for p in points}
    assert sorted(drawn) == ["bigbird", "linear", "softmax"]  # two rows entirely on CPU B, one on CPU A
    assert drawn["bigbird"][1] == 50.0  # its CPU B runs' throughput alone, not the CPU A run's 500
    # accuracy: every seed's mean (80 correct), whatever the device, not the CPU B seeds' (75)
    assert drawn["bigbird"][3] == averages["bigbird"][0] == pytest.approx(100 * 80 / res.n)
    assert "runs on CPU B;" in title
    assert title.endswith("; throughput from the runs on CPU B only: bigbird (2 of 3 runs; the rest on CPU A)"
                          "; left out, throughput measured on another device: local (CPU A)")

    gpu = {"stamp": {"cpu": "Host CPU", "gpu": "GPU X"}, "efficiency": {}}
    assert device_label({**gpu, "config": {"trainer": {"accelerator": "gpu"}}}) == "GPU X"
    assert device_label({**gpu, "config": {"trainer": {"accelerator": "cpu"}}}) == "Host CPU"
    assert device_label({**gpu, "efficiency": {"wall": {"segments": [{"device": "GPU Y", "cpu": "Host CPU"}]}}}) == "GPU Y"
    assert device_label({**gpu, "efficiency": {"wall": {"segments": [{"from_step": 0}]}}}) == "GPU X"  # no device kept
    assert device_label({**gpu, "efficiency": {"bench": {"device": "cpu"}}}) == "Host CPU"
