"""Issue 34's cases on which records a number stands (one experiment identity, lra/identity.py), each
rebuilt as a fabricated results folder: what the report must print, and what it must not."""
from __future__ import annotations

import csv
import io

import numpy as np
import pytest

from lra.report.build import build_report
from lra.report.cells import AccuracyGroup, accuracy_groups
from lra.report.comparisons import declared_family, run_pairs
from lra.report.efficiency import bench_groups, smat_table
from lra.report.lengths import length_data
from lra.report.screening import screen
from tests.report.fabricate import Results

PROTOCOL = ["experiment=quick"]


def groups_of(res: Results):
    runs, ledger = screen(res.root, "test_acc")
    return runs, ledger, {(g.protocol, g.custom): g for g in accuracy_groups(runs, ledger)}


def reasons(ledger) -> dict[str, str]:
    return {e.file.removesuffix(".json"): e.reason for e in ledger.excluded}


def nine(res: Results) -> None:
    for attn, ks in (("softmax", [80, 84, 88]), ("linear", [82, 86, 90]), ("adamra", [90, 94, 99])):
        res.sweep(attn, ks)


# case 1 --------------------------------------------------------------------------------------
@pytest.mark.slow
def test_1_one_run_with_a_fixed_data_seed_leaves_the_others_pooled(tmp_path):
    res = Results(tmp_path)
    nine(res)
    res.train("softmax", 1, 85, run_id="zz-fixed-data-seed", changes={"task__datamodule__seed": 0},
              overrides=[*PROTOCOL, "attention=softmax", "seed=1", "task.datamodule.seed=0"])
    _, _, groups = groups_of(res)
    proto = groups["quick", False]
    assert {k: c["listops"].n for k, c in proto.rows.items()} == {("softmax", ()): 3, ("linear", ()): 3, ("adamra", ()): 3}
    assert all(c.result is not None for c in declared_family(proto, "test_acc"))
    # the custom row says what differs (its override), and no invented config difference
    assert list(groups["quick", True].rows) == [("softmax", ("task.datamodule.seed=0",))]
    md, files, _ = res.report()
    assert "n=1 (no interval)" not in md.split("Accuracy (%), custom")[0]
    assert (md, files) == res.report()[:2]  # byte-identical on a second build


# case 3 / 4 / 5 / 11c: SMAT --------------------------------------------------------------------
def smat_bench(res: Results, attn: str, results: list[dict], run_id: str | None = None, started: str = "2026-01-02",
               attention: dict | None = None) -> None:
    config = {"model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "d_ffn": 64}}
    if attention is not None:
        config["attention"] = attention
    res.write({"schema": 1, "run_id": run_id or f"smat-{attn}", "mode": "bench", "task": "listops", "attention": attn,
               "seed": 0, "protocol": "smat", "status": "finished", "stamp": {"cpu": "Test CPU"}, "started_at": started,
               "config": config, "efficiency": {"threads": 1, "bench": {"protocol": "smat", "batch_size": 8, "device": "cpu",
                                                                         "results": results}}})


def ok(n: int, speed: float, mb: float) -> dict:
    return {"length": n, "status": "ok", "ms": 8000 / speed, "peak_mb": mb, "examples_per_s": speed}


def smat_of(res: Results):
    md, files, _ = res.report(smat_protocol="quick")
    (name,) = [f for f in files if f.startswith("tables/smat_") and f.endswith(".csv") and "reference" not in f]
    rows = {r[0]: r for r in list(csv.reader(io.StringIO(files[name])))[1:]}
    return md, rows


@pytest.mark.slow
def test_3_smat_never_mixes_lengths(tmp_path):
    res = Results(tmp_path)
    nine(res)
    smat_bench(res, "softmax", [ok(128, 20.0, 300.0), ok(256, 10.0, 900.0)])
    smat_bench(res, "linear", [ok(128, 90.0, 100.0), {"length": 256, "status": "oom"}])
    smat_bench(res, "adamra", [ok(128, 60.0, 120.0), ok(256, 40.0, 200.0)])
    md, rows = smat_of(res)
    assert "SMAT (eq. 10), N=256" in md
    assert rows["linear"][2] == "" and rows["linear"][8] == "" and rows["linear"][10] == "oom at N=256"
    assert "| linear | run | — | — |" in md and "90.0" not in md.split("SMAT (eq. 10), N=256")[1].split("\n\n")[2]
    assert rows["adamra"][3] == "1.0" and rows["softmax"][3] == "0.0"  # normalised over the two measured at N


@pytest.mark.slow
def test_4_unresolved_memory_is_never_ranked(tmp_path):
    res = Results(tmp_path)
    nine(res)
    smat_bench(res, "softmax", [ok(64, 10.0, 0.93)])
    smat_bench(res, "linear", [ok(64, 30.0, 0.86)])
    smat_bench(res, "adamra", [ok(64, 20.0, 50.0)])
    md, rows = smat_of(res)
    assert rows["softmax"][10] == rows["linear"][10] == "memory unresolved (<1 MB): not ranked"
    assert rows["linear"][5] == "" and "**" not in md.split("SMAT (eq. 10)")[1].split("##")[0]  # one left: no score, no bold


@pytest.mark.slow
def test_5_a_failed_bench_never_supersedes_a_good_one(tmp_path):
    res = Results(tmp_path)
    nine(res)
    smat_bench(res, "softmax", [ok(64, 10.0, 900.0)], run_id="smat-softmax-good", started="2026-01-02")
    smat_bench(res, "softmax", [{"length": 64, "status": "oom"}], run_id="smat-softmax-later", started="2026-01-03")
    smat_bench(res, "linear", [ok(64, 30.0, 100.0)])
    runs, ledger, _ = groups_of(res)
    (g,) = bench_groups(runs, ledger)
    assert g.runs["softmax"].run_id == "smat-softmax-good"
    assert reasons(ledger)["smat-softmax-later"].startswith("every length failed (oom at 64)")
    _, rows = smat_of(res)
    assert rows["softmax"][8] != "" and rows["softmax"][3] == "0.0"


@pytest.mark.slow
def test_11c_one_model_gets_no_score_and_no_bold(tmp_path):
    res = Results(tmp_path)
    nine(res)
    smat_bench(res, "adamra", [ok(64, 20.0, 50.0)])
    md, rows = smat_of(res)
    assert rows["adamra"][8] == "" and "min-max needs two" in rows["adamra"][10]
    assert "**" not in md.split("SMAT (eq. 10)")[1].split("##")[0]


# case 6 --------------------------------------------------------------------------------------
@pytest.mark.slow
def test_6_a_yaml_edited_configuration_is_not_the_protocol(tmp_path):
    res = Results(tmp_path)
    res.sweep("softmax", [80, 84, 88])
    res.sweep("linear", [82, 86, 90])
    res.sweep("adamra", [90, 94, 99], changes={"optim__lr": 0.001})  # no override: the YAML said so
    _, _, groups = groups_of(res)
    assert ("adamra", ()) not in groups["quick", False].rows
    ((key, cells),) = [(k, c) for k, c in groups["quick", True].rows.items() if k[0] == "adamra"]
    assert key[1][0].endswith(": optim.lr=0.001") and cells["listops"].n == 3
    smat_bench(res, "softmax", [ok(64, 10.0, 900.0)])
    smat_bench(res, "linear", [ok(64, 30.0, 100.0)])
    smat_bench(res, "adamra", [ok(64, 20.0, 50.0)])
    md, rows = smat_of(res)
    assert rows["adamra"][10] == "no complete accuracy row in protocol quick"
    across = md.split("## Across tasks, protocol quick")[1].split("##")[0]
    assert "| adamra |" not in across


@pytest.mark.slow
def test_6_smat_checks_the_bench_measured_the_accuracy_runs_model(tmp_path):
    res = Results(tmp_path)
    nine(res)
    runs, _, groups = groups_of(res)
    same = {"_partial_": True, "_target_": "attention.adamra.Attention", "dropout": 0.0}
    smat_bench(res, "softmax", [ok(64, 10.0, 900.0)], attention={**same, "_target_": "attention.softmax.Attention"})
    smat_bench(res, "linear", [ok(64, 30.0, 100.0)], attention={**same, "_target_": "attention.linear.Attention"})
    smat_bench(res, "adamra", [ok(64, 20.0, 50.0)], attention={**same, "dropout": 0.3})
    _, rows = smat_of(res)
    assert rows["adamra"][10] == "the bench measured other attention settings than the accuracy runs"
    assert rows["softmax"][8] != "" and rows["linear"][8] != ""


# case 9 / 11a --------------------------------------------------------------------------------
@pytest.mark.slow
def test_9_malformed_fields_are_exclusions_with_reasons(tmp_path):
    res = Results(tmp_path)
    nine(res)
    no_ms = ok(64, 10.0, 900.0)
    del no_ms["ms"]
    smat_bench(res, "softmax", [no_ms], run_id="b-no-ms")
    smat_bench(res, "linear", [{**ok(64, 10.0, 900.0), "examples_per_s": None}], run_id="b-null-speed")
    smat_bench(res, "adamra", [None], run_id="b-null-result")  # type: ignore[list-item]
    curve = res.train("linear", 5, 80, learning_curve=[[100, None]])
    text = res.train("softmax", 5, 80, overrides="experiment=quick")
    md, files, _ = res.report()
    why = reasons(screen(res.root, "test_acc")[1])
    assert why["b-no-ms"] == "efficiency.bench.results[0] (length 64, ok) has no ms"
    assert why["b-null-speed"] == "efficiency.bench.results[0].examples_per_s=None is not a positive number"
    assert why["b-null-result"] == "efficiency.bench.results[0]=None is not an object"
    assert why[curve["run_id"]] == "learning_curve point [100, None] is not [step, accuracy fraction]"
    assert why[text["run_id"]] == "overrides='experiment=quick' is not a list of strings (the run's command-line overrides)"
    assert "= c e e e" not in md and all(r in files["excluded.csv"] for r in ("b-no-ms", "b-null-speed", "b-null-result"))


# case 10 -------------------------------------------------------------------------------------
def other_test_set(res: Results, labels: np.ndarray, lengths: np.ndarray, *args, **kw) -> dict:
    saved = res.labels, res.lengths
    res.labels, res.lengths = labels, lengths
    try:
        return res.train(*args, **kw)
    finally:
        res.labels, res.lengths = saved


def test_10_a_run_on_another_test_set_never_pools(tmp_path):
    res = Results(tmp_path)
    nine(res)
    perm = np.random.default_rng(3).permutation(res.n)
    other_test_set(res, res.labels[perm], res.lengths[perm], "adamra", 3, 95)  # the same examples, reordered
    _, _, groups = groups_of(res)
    assert groups["quick", False].rows["adamra", ()]["listops"].seeds == [0, 1, 2]
    ((key, cells),) = [(k, c) for k, c in groups["quick", True].rows.items() if k[0] == "adamra"]
    assert ": test set " in key[1][0] and cells["listops"].seeds == [3]


def test_10_the_fingerprint_holds_the_lengths(tmp_path):
    """Same labels, other lengths: another test set."""
    res = Results(tmp_path)
    nine(res)
    other_test_set(res, res.labels, res.lengths[::-1].copy(), "adamra", 3, 95)
    _, _, groups = groups_of(res)
    assert groups["quick", False].rows["adamra", ()]["listops"].seeds == [0, 1, 2]


def test_10_run_pairs_need_the_same_test_set_not_its_size(tmp_path):
    res = Results(tmp_path)
    res.sweep("softmax", [80, 84])
    for seed, k in enumerate([90, 94]):
        other_test_set(res, res.labels, res.lengths[::-1].copy(), "adamra", seed, k)
    _, _, groups = groups_of(res)
    custom = groups["quick", True]
    ((key, cells),) = custom.rows.items()  # adamra's runs on the other test set are not the protocol's
    g = AccuracyGroup("quick", False, {("softmax", ()): groups["quick", False].rows["softmax", ()],
                                       ("adamra", ()): cells})
    family = declared_family(g, "test_acc")
    assert [c.result for c in family] == [None]
    assert run_pairs(g, family) == []  # same size, other examples: no McNemar


# case 11b ------------------------------------------------------------------------------------
def test_11b_an_example_exactly_max_len_long_is_not_cut(tmp_path):
    lengths = np.concatenate([np.arange(5, 55), np.full(50, 30), np.arange(10, 60), np.full(50, 64)])
    res = Results(tmp_path, lengths=lengths)
    res.sweep("softmax", [80, 90, 100])
    _, _, groups = groups_of(res)
    table, labels, _ = length_data(groups["quick", False], "listops")
    assert "cut)" not in labels[-1] and labels[-1].endswith("(50 at max_len)")
    fixed = Results(tmp_path / "images", lengths=np.full(200, 64))  # every example at the cap: nothing cut
    fixed.sweep("softmax", [80, 90, 100])
    _, _, groups = groups_of(fixed)
    _, labels, _ = length_data(groups["quick", False], "listops")
    assert "max_len" not in labels[-1] and "cut" not in labels[-1]
