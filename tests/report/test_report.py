"""Report: SMAT against AdaMRA Table 3, table rules on fabricated records, and an end-to-end run
(train sweep + bench sweep + report twice, byte-identical)."""
from __future__ import annotations

import csv
import io
import json
import math
import statistics
import time
from pathlib import Path

import numpy as np
import pytest
from scipy import stats as st
from omegaconf import OmegaConf

from lra.report import reference as ref
from lra.report.build import build_report as _build_report
from lra.report.build import run_report as _run_report
from lra.report.smat import smat_scores
from tests.conftest import TINY_LISTOPS
from tests.report.fabricate import config


build_report, run_report = _build_report, _run_report

# AdaMRA Table 3, normalised values as printed (speed, memory, accuracy) and SMAT
TABLE3_NORMALISED = {
    "Transformer": (0.00, 1.00, 0.54), "BigBird": (0.12, 0.30, 0.61), "Reformer": (0.35, 0.13, 0.15),
    "Linformer": (0.52, 0.12, 0.21), "Linear Trans.": (1.00, 0.00, 0.48), "Performer-32": (0.69, 0.02, 0.00),
    "Nyströmformer-32": (0.23, 0.25, 0.56), "AdaMRA": (0.78, 0.02, 1.00),
}


def test_smat_reproduces_adamra_table3():
    models = list(ref.ADAMRA_TABLE3)
    speed, mem, acc, published = zip(*(ref.ADAMRA_TABLE3[m] for m in models))
    scores = smat_scores(list(speed), list(mem), list(acc))
    for m, s, pub in zip(models, scores, published):
        assert round(s["smat"], 2) == pytest.approx(pub, abs=1e-9), m
        assert (s["s_norm"], s["m_norm"], s["acc_norm"]) == pytest.approx(TABLE3_NORMALISED[m], abs=1e-9), m
    exact = smat_scores(list(speed), list(mem), list(acc), round_to=None)
    assert all(abs(e["smat"] - p) < 0.015 for e, p in zip(exact, published))
    assert smat_scores([5.0], [10.0], [50.0])[0]["smat"] == 1.0  # zero range -> 0, as MinMaxScaler


def test_reference_numbers_are_consistent():
    for table in ref.ACCURACY_SOURCES.values():
        for model, row in table.items():
            assert statistics.fmean(row[t] for t in ref.LRA_TASKS) == pytest.approx(row["avg"], abs=0.006), model
    for model, (_, _, acc, _) in ref.ADAMRA_TABLE3.items():
        base = model.split("-")[0]
        if base in ref.ADAMRA_TABLE1:
            assert acc == ref.ADAMRA_TABLE1[base]["avg"], model


# ---------------------------------------------------------------------------------------------
def write_record(runs: Path, run_id: str, mode: str, task: str, attention: str, seed: int = 0, status: str = "finished",
                 started: str = "2026-01-01T00:00:00+00:00", **fields) -> None:
    rec = {"schema": 1, "run_id": run_id, "mode": mode, "task": task, "attention": attention, "seed": seed,
           "protocol": "xiong2021", "status": status, "config": {}, "metrics": {}, "efficiency": {},
           "stamp": {"cpu": "Test CPU", "gpu": None}, "started_at": started, "finished_at": None, "error": None}
    rec.update(fields)
    if mode == "train":  # what run.py stores: the resolved config (the report's experiment identity)
        rec["config"] = config(attention, task, seed, rec["protocol"])
    runs.mkdir(parents=True, exist_ok=True)
    (runs / f"{run_id}.json").write_text(json.dumps(rec))


def bench_block(protocol: str, rows: dict[int, tuple[float, float]], batch: int = 16) -> dict:
    results = [{"length": n, "status": "ok", "ms": ms, "peak_mb": mb, "examples_per_s": batch / (ms / 1000)}
               for n, (ms, mb) in rows.items()]
    return {"bench": {"protocol": protocol, "batch_size": batch, "device": "cpu", "results": results,
                      "memory_method": "cpu-vmhwm-reset"}}


@pytest.fixture
def fabricated(tmp_path):
    runs = tmp_path / "runs"
    acc = lambda v: {"test_acc": v}  # noqa: E731
    write_record(runs, "a1", "train", "listops", "softmax", 0, metrics=acc(0.30))
    write_record(runs, "a2", "train", "listops", "softmax", 1, metrics=acc(0.40))
    write_record(runs, "a0", "train", "listops", "softmax", 1, metrics=acc(0.99), started="2025-01-01T00:00:00+00:00")
    write_record(runs, "a3", "train", "text", "softmax", 0, metrics=acc(0.60))
    write_record(runs, "a4", "train", "listops", "linear", 0, metrics=acc(0.32))
    write_record(runs, "a5", "train", "text", "linear", 0, metrics=acc(0.70))
    write_record(runs, "a6", "train", "listops", "zeta", 0, metrics=acc(0.20))                 # incomplete row
    write_record(runs, "a7", "train", "text", "zeta", 0, status="failed", metrics=acc(0.90))   # not counted
    write_record(runs, "b1", "bench", "text", "softmax", protocol="table2",
                 efficiency=bench_block("table2", {1024: (100.0, 400.0), 2048: (400.0, 1600.0)}))
    write_record(runs, "b2", "bench", "text", "linear", protocol="table2",
                 efficiency=bench_block("table2", {1024: (50.0, 200.0), 2048: (100.0, 400.0)}))
    write_record(runs, "c1", "bench", "text", "softmax", protocol="smat", efficiency=bench_block("smat", {4096: (800.0, 3000.0)}, 8))
    write_record(runs, "c2", "bench", "text", "linear", protocol="smat", efficiency=bench_block("smat", {4096: (100.0, 1000.0)}, 8))
    write_record(runs, "c3", "bench", "text", "zeta", protocol="smat", efficiency=bench_block("smat", {4096: (200.0, 900.0)}, 8))
    (runs / "broken.json").write_text("{not json")
    return tmp_path


@pytest.mark.slow
def test_tables_from_fabricated_records(fabricated):
    md, files, plots = build_report(fabricated)
    # accuracy: seeds averaged (the older duplicate of seed 1 listed, not counted), sample std, t-interval
    # over the two seeds (35 +- 12.706 * 7.071 / sqrt 2) flagged as one degree of freedom; one seed: no
    # interval; avg only for complete rows; too few seeds: no test, no mark
    assert "| softmax | run | 35.00 ± 7.07 [-28.53, 98.53] n=2 (1 dof) | 60.00 n=1 (no interval) | 47.50 |" in md
    assert "| linear | run | 32.00 n=1 (no interval) | 70.00 n=1 (no interval) | 51.00 |" in md
    assert "| zeta | run | 20.00 n=1 (no interval) | — | — |" in md
    assert "| Transformer [softmax] | AdaMRA Table 1 | 37.10 | 65.02 | 51.06 |" in md
    assert "LRA paper Table 1" not in md  # its rows follow another protocol
    assert "| listops | linear | softmax | not tested: needs ≥ 3 seeds per side (has 1 and 2) |" in md
    assert "| `a0.json` | train listops softmax seed 1 | a newer record of the same experiment and seed counts: a2 |" in md
    # efficiency: ratio softmax / variant; exponents from two lengths (no interval); published T4
    # figures in their own table, never beside the CPU runs
    assert ("| linear | run | **50.0 (2.00x)** | **100.0 (4.00x)** | **200.0 (2.00x)** | **400.0 (4.00x)** "
            "| 1.00 [—] | 1.00 [—] |") in md
    assert "| Linear Trans. [linear] | AdaMRA Table 2 (T4 GPU) | 22.0 (3.73x) | 38.0 (7.16x) | 69.0 (14.59x) |" in md
    cpu_table = files["tables/efficiency_table2_test-cpu.csv"]
    assert "T4" not in cpu_table and "T4" in files["tables/efficiency_reference_table2.csv"]
    # SMAT over softmax and linear (zeta has no complete accuracy row): linear wins on all three; the
    # accuracy term is a two-task mean here, and the table says so
    assert "| linear | run | 80.0 (1.00) | 1000.0 (0.00) | 51.00 (1.00) | **3.00** |" in md
    assert "| softmax | run | 10.0 (0.00) | 3000.0 (1.00) | 47.50 (0.00) | <u>0.00</u> |" in md
    assert "| zeta | run | 40.0 | 900.0 | — | — (no complete accuracy row in protocol xiong2021) |" in md
    assert "| attention | source | Speed (ex/s) | Peak MB | Avg listops+text | SMAT |" in md
    assert "T4" not in files["tables/smat_test-cpu.csv"] and "smat bench, bench protocol smat, Test CPU" in md
    assert "broken.json" in md and "- **failed** × 1: `a7`" in md
    assert {"tables/accuracy_xiong2021.csv", "tables/efficiency_table2_test-cpu.tex", "tables/smat_test-cpu.csv",
            "tables/significance_xiong2021.csv", "tables/smat_reference_table3.csv", "tables/cells_xiong2021.csv",
            "tables/across_xiong2021.csv", "excluded.csv"} <= set(files)
    assert not any("quick" in f or "lra2020" in f or "custom" in f for f in files)  # tables with no runs: omitted
    assert set(plots) == {"plots/bubble.png", "plots/scaling_table2_test-cpu.png"}
    assert all(p.startswith(b"\x89PNG") for p in plots.values())
    csv_rows = files["tables/accuracy_xiong2021.csv"].splitlines()
    assert csv_rows[1].startswith("softmax,run,35.0,7.0710678118654755,2,-28.531023680873474,98.53102368087347,0;1,30.0;40.0,")
    assert build_report(fabricated) == (md, files, plots)  # same records, same report


@pytest.mark.slow
def test_run_report_writes_files_and_removes_stale_ones(fabricated, tmp_path):
    out = tmp_path / "out"
    (out / "tables").mkdir(parents=True)
    (out / "tables" / "efficiency_old_device.csv").write_text("stale")
    (out / "tables" / "notes.txt").write_text("mine")  # not a report file: kept
    cfg = OmegaConf.create({"report": {"results_dir": str(fabricated), "out_dir": str(out), "metric": "test_acc",
                                       "smat_protocol": "xiong2021"}})
    result = run_report(cfg)
    assert (out / "report.md").exists() and all((out / f).exists() for f in result["files"])
    assert not (out / "tables" / "efficiency_old_device.csv").exists() and (out / "tables" / "notes.txt").exists()
    tex = (out / "tables" / "accuracy_xiong2021.tex").read_text()
    assert tex.startswith("% needs \\usepackage{booktabs}; the notes: accuracy_xiong2021.notes.tex\n\\begin{table}[t]")
    assert "\\caption{Accuracy (\\%), protocol xiong2021" in tex and "\\toprule" in tex and "\\bottomrule" in tex
    # the Markdown cells, escaped (no compact form that names another spread); the notes in a file of their own
    assert "35.00 $\\pm$ 7.07 [-28.53, 98.53] n=2 (1 dof) & 60.00 n=1 (no interval)" in tex and "\\item" not in tex
    assert "\\begin{itemize}" in (out / "tables" / "accuracy_xiong2021.notes.tex").read_text()
    assert (out / "excluded.csv").read_text().startswith("file,kind,reason")


# ---------------------------------------------------------------------------------------------
# Intervals, paired tests, Holm, length buckets, learning curves and fitted exponents on records
# with known per-example predictions; every expected value is computed here, independently.
N_TEST = 200


def write_preds(runs: Path, run_id: str, correct: np.ndarray, labels: np.ndarray, lengths: np.ndarray) -> dict:
    np.savez(runs / f"{run_id}.preds.npz", pred=np.where(correct, labels, (labels + 1) % 10).astype(np.int16),
             correct=correct, label=labels.astype(np.int16), length=lengths.astype(np.int32))
    return {"file": f"{run_id}.preds.npz", "n": int(correct.size), "accuracy": float(correct.mean())}


@pytest.fixture
def with_predictions(tmp_path):
    runs = tmp_path / "runs"
    runs.mkdir()
    rng = np.random.default_rng(7)
    labels, lengths = rng.integers(0, 10, N_TEST), rng.integers(5, 61, N_TEST)

    def exactly(k: int) -> np.ndarray:  # k correct examples, at random positions
        c = np.zeros(N_TEST, dtype=bool)
        c[rng.permutation(N_TEST)[:k]] = True
        return c

    # linear - softmax = +3, +4, +6 points: paired t p = 0.039, above 0.05 after Holm (x2);
    # zeta - softmax = +0.5, -0.5, 0: p = 1; adamra far better on its one seed (a run pair only)
    counts = {"softmax": (80, 90, 85), "linear": (86, 98, 97), "zeta": (81, 89, 85), "adamra": (170,)}
    correct = {(attn, seed): exactly(k) for attn, ks in counts.items() for seed, k in enumerate(ks)}
    for (attn, seed), c in correct.items():
        rid = f"{attn}-s{seed}"
        write_record(runs, rid, "train", "listops", attn, seed, protocol="quick",
                     overrides=["experiment=quick", f"attention={attn}", "task=listops", f"seed={seed}"],
                     metrics={"test_acc": float(c.mean())}, predictions=write_preds(runs, rid, c, labels, lengths),
                     learning_curve=[[100, 0.2 + 0.01 * seed], [200, 0.3 + 0.02 * seed]])
    return tmp_path, correct, lengths


def _csv(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def _midp(v: np.ndarray, b: np.ndarray) -> float:
    n01, n10 = int((v & ~b).sum()), int((~v & b).sum())
    n, k = n01 + n10, min(n01, n10)
    return min(1.0, (2 * sum(math.comb(n, i) for i in range(k)) + math.comb(n, k)) / 2 ** n)


@pytest.mark.slow
def test_intervals_significance_and_length_buckets(with_predictions):
    root, correct, lengths = with_predictions
    md, files, plots = build_report(root, compare=["adamra", "linear"])
    acc = {k: 100 * v.mean() for k, v in correct.items()}
    rows = {r["attention"]: r for r in _csv(files["tables/accuracy_quick.csv"])}
    # three seeds: t-interval over seeds; one seed: no interval at all
    soft = [acc["softmax", s] for s in range(3)]
    ci = st.ttest_1samp(soft, 0).confidence_interval()
    assert float(rows["softmax"]["listops_low"]) == pytest.approx(ci.low, rel=1e-9)
    assert float(rows["softmax"]["listops_high"]) == pytest.approx(ci.high, rel=1e-9)
    assert rows["softmax"]["listops_values"] == ";".join(repr(float(v)) for v in soft) and rows["softmax"]["listops_seeds"] == "0;1;2"
    assert rows["adamra"]["listops_low"] == "" and rows["adamra"]["listops_n"] == "1"

    # the declared family: linear and zeta vs softmax, paired t over three seed pairs, Holm over both;
    # adamra has one seed: not tested at seed level, its run pair goes to the McNemar table
    sig = {(r["variant"], r["baseline"]): r for r in _csv(files["tables/significance_quick.csv"])}
    t = st.ttest_rel([acc["linear", s] for s in range(3)], soft)
    assert 0.025 < t.pvalue < 0.05  # significant alone, not after Holm
    assert float(sig["linear", "softmax"]["p"]) == pytest.approx(t.pvalue, rel=1e-9)
    assert float(sig["zeta", "softmax"]["p"]) == pytest.approx(1.0)
    assert float(sig["linear", "softmax"]["p_holm"]) == pytest.approx(2 * t.pvalue, rel=1e-9)
    assert sig["linear", "softmax"]["significant"] == "no" and sig["adamra", "softmax"]["p"] == ""
    pairs = {(r["variant"], r["baseline"]): r for r in _csv(files["tables/runpairs_quick.csv"])}
    assert float(pairs["adamra", "softmax"]["p"]) == pytest.approx(_midp(correct["adamra", 0], correct["softmax", 0]), rel=1e-9)
    assert pairs["adamra", "softmax"]["run_variant"] == "adamra-s0" and pairs["adamra", "softmax"]["n"] == str(N_TEST)
    # report.compare: exploratory, its own tables; the run pair of adamra and linear is McNemar on seed 0
    comp = _csv(files["tables/compare_quick.csv"])
    assert [(r["variant"], r["baseline"], r["p"]) for r in comp] == [("adamra", "linear", "")]
    cp = _csv(files["tables/runpairs_quick_compare.csv"])
    assert float(cp[0]["p"]) == pytest.approx(_midp(correct["adamra", 0], correct["linear", 0]), rel=1e-9)
    # no seed-level significance anywhere: no dagger, no bold
    acc_table = md[md.index("## Accuracy (%), protocol quick"):md.index("## Cells of the accuracy table")]
    cells = [ln for ln in acc_table.splitlines() if ln.startswith("| ")]
    assert len(cells) == 5 and not any("†" in ln or "**" in ln for ln in cells)
    assert "Seed-level tests against softmax, protocol quick" in md and "AdaMRA Table 1" not in md  # no published quick rows

    # accuracy by length: quartile buckets of the real lengths, softmax's mean over its three seeds with
    # a two-level bootstrap interval; each bucket's examples counted once
    edges = np.unique(np.round(np.quantile(lengths, [0, 0.25, 0.5, 0.75, 1.0])))
    bucket = np.clip(np.searchsorted(edges, lengths, side="right") - 1, 0, len(edges) - 2)
    by_len = {r["attention"]: r for r in _csv(files["tables/length_quick_listops.csv"])}
    for i in range(len(edges) - 1):
        lab = f"{int(edges[i])}-{int(edges[i + 1]) - (1 if i < len(edges) - 2 else 0)}"
        pooled = np.concatenate([correct["softmax", s][bucket == i] for s in range(3)])
        row = by_len["softmax"]
        assert float(row[f"{lab}_acc"]) == pytest.approx(100 * pooled.mean(), rel=1e-9), lab
        assert float(row[f"{lab}_low"]) < float(row[f"{lab}_acc"]) < float(row[f"{lab}_high"])
        assert int(row[f"{lab}_examples"]) == int((bucket == i).sum())
    assert by_len["softmax"]["seeds"] == "3" and by_len["adamra"]["seeds"] == "1"
    assert {"plots/length_quick_listops.png", "plots/curves_quick_listops.png"} <= set(plots)
    assert build_report(root, compare=["adamra", "linear"]) == (md, files, plots)


def test_fitted_scaling_exponents(tmp_path):
    runs = tmp_path / "runs"
    n = [256, 512, 1024, 2048]
    wiggle = [1.04, 0.97, 1.01, 0.99]
    write_record(runs, "q", "bench", "text", "softmax", protocol="table2",
                 efficiency=bench_block("table2", {k: (0.001 * k ** 2 * w, 50 + 0.0001 * k ** 2) for k, w in zip(n, wiggle)}))
    write_record(runs, "l", "bench", "text", "linear", protocol="table2",
                 efficiency=bench_block("table2", {k: (0.05 * k * w, 0.2 * k) for k, w in zip(n, wiggle)}))
    md, files, plots = build_report(tmp_path)
    rows = {r["attention"]: r for r in _csv(files["tables/efficiency_table2_test-cpu.csv"])}
    for attn, ms in (("softmax", [0.001 * k ** 2 * w for k, w in zip(n, wiggle)]), ("linear", [0.05 * k * w for k, w in zip(n, wiggle)])):
        ref_fit = st.linregress(np.log(n), np.log(ms))
        half = st.t.ppf(0.975, len(n) - 2) * ref_fit.stderr
        r = rows[attn]
        assert float(r["time_alpha"]) == pytest.approx(ref_fit.slope, rel=1e-5)
        assert (float(r["time_alpha_low"]), float(r["time_alpha_high"])) == pytest.approx((ref_fit.slope - half, ref_fit.slope + half), rel=1e-4)
    assert float(rows["linear"]["mem_alpha"]) == pytest.approx(1.0, abs=1e-9)
    assert rows["linear"]["mem_alpha_low"] == "" or float(rows["linear"]["mem_alpha_high"]) - float(rows["linear"]["mem_alpha_low"]) < 1e-6
    assert "plots/scaling_table2_test-cpu.png" in plots and "time α [95% CI]" in md


def test_unresolved_memory_peak_is_neither_ranked_nor_a_ratio(tmp_path):
    """An in-process CPU bench can report a ~0 MB peak: shown as unresolved, never a 1000x 'win'."""
    runs = tmp_path / "runs"
    write_record(runs, "q", "bench", "text", "softmax", protocol="table2", efficiency=bench_block("table2", {1024: (100.0, 40.0)}))
    write_record(runs, "l", "bench", "text", "linear", protocol="table2", efficiency=bench_block("table2", {1024: (10.0, 0.03)}))
    md, files, _ = build_report(tmp_path)
    row = next(line for line in md.splitlines() if line.startswith("| linear | run |"))
    assert "<1 (unresolved)" in row and "x)" not in row.split("|")[4]
    assert "40.0 (1.00x)" in md and "**40.0" not in md  # one resolved peak: nothing ranked, no bold
    csv_row = {r["attention"]: r for r in _csv(files["tables/efficiency_table2_test-cpu.csv"])}["linear"]
    assert csv_row["mb_ratio_1024"] == ""


@pytest.mark.slow
def test_protocols_custom_runs_and_devices_never_mix(tmp_path):
    """A mixed set: a xiong2021 run, a newer overridden one (the README's quick look), a quick run,
    an lra2020 run, and CPU bench runs: each lands in its own table."""
    runs = tmp_path / "runs"
    eff = lambda: {"throughput": {"train": {"examples_per_s": 50.0}}, "peak_memory": {"train_mb": 300.0}}  # noqa: E731
    write_record(runs, "x1", "train", "listops", "softmax", metrics={"test_acc": 0.37}, efficiency=eff(),
                 overrides=["experiment=xiong2021", "attention=softmax", "hydra.sweep.dir=/x", "paths.results_dir=/r"])
    write_record(runs, "x2", "train", "listops", "softmax", metrics={"test_acc": 0.0865}, started="2026-02-01T00:00:00+00:00",
                 overrides=["attention=softmax", "task=listops", "trainer.max_steps=20"])
    write_record(runs, "x3", "train", "listops", "linear", metrics={"test_acc": 0.33}, efficiency=eff(),
                 overrides=["attention=linear", "attention.feature_map=relu"])
    write_record(runs, "q1", "train", "listops", "softmax", protocol="quick", metrics={"test_acc": 0.45},
                 overrides=["experiment=quick", "seed=0"])
    write_record(runs, "l1", "train", "listops", "softmax", protocol="lra2020", metrics={"test_acc": 0.36},
                 overrides=["experiment=lra2020"])
    write_record(runs, "b1", "bench", "text", "softmax", protocol="table2", efficiency=bench_block("table2", {1024: (100.0, 400.0)}))
    out = tmp_path / "out"
    cfg = OmegaConf.create({"report": {"results_dir": str(tmp_path), "out_dir": str(out), "metric": "test_acc",
                                       "smat_protocol": "xiong2021"}})
    run_report(cfg)
    md = (out / "report.md").read_text()
    tables = {p.stem: p.read_text() for p in (out / "tables").glob("*.csv")}
    xiong = tables["accuracy_xiong2021"]
    assert "softmax,run,37.0," in xiong and "8.65" not in xiong and "AdaMRA Table 1" in xiong and "LRA paper" not in xiong
    custom = tables["accuracy_custom_xiong2021"]
    assert "softmax,trainer.max_steps=20,8.649999999999999," in custom and "linear,attention.feature_map=relu,33.0," in custom
    assert "Table 1" not in custom
    assert "| softmax | trainer.max_steps=20 | 8.65 n=1 (no interval) |" in md  # listed with its overrides, not ranked
    assert "softmax,run,45.0," in tables["accuracy_quick"] and "Table 1" not in tables["accuracy_quick"]
    assert "LRA paper Table 1" in tables["accuracy_lra2020"] and "AdaMRA" not in tables["accuracy_lra2020"]
    assert "T4" not in tables["efficiency_table2_test-cpu"] and "efficiency_reference_table2" in tables
    # no smat bench: the bubble chart's own panel uses the training runs' throughput and memory
    assert "Bubble chart, left panel: this suite: training throughput of the protocol xiong2021 runs on Test CPU" in md


# ---------------------------------------------------------------------------------------------
def snapshot(root: Path) -> dict[str, bytes]:
    files = [root / "report.md", *sorted((root / "tables").glob("*")), *sorted((root / "plots").glob("*"))]
    return {str(f.relative_to(root)): f.read_bytes() for f in files}


@pytest.mark.slow
def test_end_to_end_train_bench_report(cli):
    """experiment=quick, two variants, two seeds, shrunk to seconds: the shrinking overrides make
    them custom runs of protocol quick, with intervals, length buckets and curves (two seeds: no test)."""
    results = cli.cwd / "results"
    cli("-m", "experiment=quick", "attention=softmax,linear", *TINY_LISTOPS, "seed=0,1", "task.max_steps=4",
        "task.val_every=2", "callbacks.throughput.warmup_steps=1", "trainer.enable_progress_bar=false",
        f"hydra.sweep.dir={cli.cwd / 'multirun'}")
    # in-process measurements keep this test fast; per-measurement subprocesses are tested in test_bench.py
    cli("-m", "mode=bench", "model=tiny", "bench.task=listops", "bench.protocol=table2,smat", "bench.lengths=[32,64]",
        "bench.repeats=1", "bench.min_time_s=0", "bench.warmup=1", "bench.threads=1", "bench.isolate=false",
        f"hydra.sweep.dir={cli.cwd / 'multirun-bench'}")
    # a protocol run of another variant (fabricated: the real ones above are custom)
    write_record(results / "runs", "zz-other", "train", "listops", "other", 0, metrics={"test_acc": 0.25})
    cli("mode=report", f"hydra.run.dir={cli.cwd / 'report-run'}")
    first = snapshot(results)

    from lra.records import load_predictions, load_records
    records, problems = load_records(results)
    assert not problems
    trains = [r for r in records if r["mode"] == "train" and r["run_id"] != "zz-other"]
    benches = [r for r in records if r["mode"] == "bench"]
    assert len(trains) == 4 and len(benches) == 2 and all(r["status"] == "finished" for r in records)
    for r in trains:
        eff = r["efficiency"]
        assert eff["throughput"]["train"]["examples_per_s"] > 0 and eff["parameters"]["attention"] > 0
        assert eff["peak_memory"]["train_mb"] > 0 and eff["peak_memory"]["method"]
        assert r["protocol"] == "quick" and "task.max_steps=4" in r["overrides"] and "experiment=quick" in r["overrides"]
        assert [s for s, _ in r["learning_curve"]] == [2, 4]
        preds = load_predictions(results, r)
        assert preds["correct"].shape == (40,) and r["predictions"]["n"] == 40
        assert preds["correct"].mean() == pytest.approx(r["metrics"]["test_acc"])
        assert (preds["correct"] == (preds["pred"] == preds["label"])).all()
        assert 5 <= preds["length"].min() and preds["length"].max() <= 64
    for r in benches:
        assert [m["status"] for m in r["efficiency"]["bench"]["results"]] == ["ok", "ok"]
        assert r["stamp"]["torch"] and r["efficiency"]["bench"]["protocol"] == r["protocol"]

    md = first["report.md"].decode()
    assert "| other | run | 25.00 n=1 (no interval) | 25.00 |" in md  # the protocol table holds only the protocol run
    assert "\nsoftmax,run," not in first["tables/accuracy_xiong2021.csv"].decode()
    assert "| softmax | model=tiny task.batch_size=16 " in md and " n=2" in md and "± " in md
    names = set(first)
    assert {"tables/accuracy_xiong2021.csv", "tables/accuracy_custom_quick.csv", "tables/significance_custom_quick.csv",
            "tables/length_custom_quick_listops.csv", "plots/length_custom_quick_listops.png",
            "plots/curves_custom_quick_listops.png", "plots/bubble.png"} <= names
    assert "needs ≥ 3 seeds per side (has 2 and 2)" in first["tables/significance_custom_quick.csv"].decode()
    assert "Built from 7 record file(s) under `runs/`: 7 used, 0 excluded" in md
    assert any(n.startswith("tables/efficiency_table2_") for n in names)
    assert any(n.startswith("tables/smat_") for n in names)
    assert any(n.startswith("plots/scaling_table2_") for n in names)

    # second report, in-process: byte-identical
    cfg = OmegaConf.create({"report": {"results_dir": str(results), "out_dir": str(results), "metric": "test_acc",
                                       "smat_protocol": "xiong2021"}})
    run_report(cfg)
    assert snapshot(results) == first


@pytest.mark.slow
def test_report_pushed_to_wandb_offline(fabricated, tmp_path, monkeypatch):
    from tests.wandb_offline import read_run

    monkeypatch.setenv("WANDB_MODE", "offline")
    out = tmp_path / "out"
    cfg = OmegaConf.create({"report": {"results_dir": str(fabricated), "out_dir": str(out), "metric": "test_acc",
                                       "smat_protocol": "xiong2021", "wandb": True, "wandb_project": "lra-test"}})
    result = run_report(cfg)
    (run_file,) = out.glob("wandb/offline-run-*/run-*.wandb")
    # the W&B service process may still be writing the offline file when finish() returns (seen on a
    # loaded machine: a 7-byte file); wait for the history to land rather than read a partial log
    deadline = time.monotonic() + 60
    keys, summary = read_run(run_file)
    while not keys and time.monotonic() < deadline:
        time.sleep(0.5)
        keys, summary = read_run(run_file)
    logged = {k.rsplit("/", 1)[0] for k in keys if k.endswith("/_type")}  # media are logged as nested keys
    assert {"tables/accuracy_xiong2021", "plots/bubble"} <= logged, keys
    assert "report_md" in summary and result["wandb_dir"]
