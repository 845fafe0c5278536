"""SMAT says what it needs (lra/report/build.py smat_notices, lra/report/efficiency.py smat_table):
an absent or empty SMAT table gets one line naming the runs or the setting that would give it
(``report.smat_protocol=quick``), and speed from one backbone is never combined with accuracy from
another: the row is refused and both backbones are named."""
from __future__ import annotations

from lra.report.build import build_tables
from tests.report.fabricate import Results

BACKBONE = {"d_model": 32, "n_layers": 1, "n_heads": 2, "d_ffn": 64, "d_head": 64, "pool": "mean", "dropout": 0.0}


def bench(res: Results, attn: str, protocol: str, speed: float, mb: float, model: dict | None = None) -> None:
    res.write({"schema": 1, "run_id": f"{protocol}-{attn}", "mode": "bench", "task": "listops", "attention": attn, "seed": 0,
               "protocol": protocol, "status": "finished", "stamp": {"cpu": "Test CPU"}, "started_at": "2026-01-01",
               "config": {"model": model or BACKBONE},
               "efficiency": {"threads": 1, "bench": {"protocol": protocol, "batch_size": 8, "device": "cpu", "results": [
                   {"length": 64, "status": "ok", "ms": 8000 / speed, "peak_mb": mb, "examples_per_s": speed}]}}})


def quick_runs(res: Results) -> None:
    res.sweep("softmax", [80, 90, 100])
    res.sweep("linear", [70, 75, 80])


def smat_lines(res: Results, **kw) -> list[str]:
    _, _, _, notices, *_ = build_tables(res.root, plots=False, **kw)
    return [n for n in notices if "SMAT" in n]


def smat_rows(res: Results, **kw) -> dict[str, str]:
    tables, *_ = build_tables(res.root, plots=False, **kw)
    (t,) = [t for t in tables if t.name.startswith("smat_") and "reference" not in t.name]
    return {line.split(" | ")[0].strip("| "): line for line in t.markdown().splitlines()[2:]}


def test_without_a_smat_bench_the_report_says_which_runs_and_setting_give_one(tmp_path):
    res = Results(tmp_path)
    quick_runs(res)
    for attn in ("softmax", "linear"):
        bench(res, attn, "table2", 20.0, 900.0)
    (line,) = smat_lines(res)
    assert line.startswith("No SMAT table: it needs smat bench records of at least two variants "
                           "(python run.py -m mode=bench bench.protocol=smat attention=softmax,<variant>)")
    assert "in protocol xiong2021" in line and line.endswith("report.smat_protocol=quick.")
    assert smat_lines(res, smat_protocol="quick") == [
        "No SMAT table: it needs smat bench records of at least two variants (python run.py -m mode=bench "
        "bench.protocol=smat attention=softmax,<variant>)."]


def test_accuracy_in_another_protocol_is_named_with_the_setting(tmp_path):
    res = Results(tmp_path)
    quick_runs(res)
    for attn, speed, mb in (("softmax", 20.0, 1800.0), ("linear", 80.0, 900.0)):
        bench(res, attn, "smat", speed, mb)
    rows = smat_rows(res)
    assert "no complete accuracy row in protocol xiong2021; protocol quick has one: report.smat_protocol=quick" in rows["softmax"]
    (line,) = smat_lines(res)
    assert line.startswith("The SMAT table scores no variant (each row says why)") and "report.smat_protocol=quick" in line
    assert smat_lines(res, smat_protocol="quick") == []   # scored: nothing to explain
    assert "**" in smat_rows(res, smat_protocol="quick")["linear"]


def test_speed_from_one_backbone_is_never_combined_with_accuracy_from_another(tmp_path):
    res = Results(tmp_path)
    quick_runs(res)   # accuracy on L1 d32
    d64 = {**BACKBONE, "d_model": 64, "n_layers": 2, "d_ffn": 128}
    for attn, speed in (("softmax", 20.0), ("linear", 80.0)):
        bench(res, attn, "smat", speed, 900.0, model=d64)
    rows = smat_rows(res, smat_protocol="quick")
    for attn in ("softmax", "linear"):
        assert "another backbone: speed measured on model L2 d64 h2 ffn128" in rows[attn]
        assert "accuracy on model L1 d32 h2 ffn64" in rows[attn] and "**" not in rows[attn]
    lines = smat_lines(res, smat_protocol="quick")
    assert lines[0].startswith("SMAT refused for ") and "L2 d64" in lines[0] and "L1 d32" in lines[0]
    assert "model.d_model, model.d_ffn, model.n_layers" in lines[0] or "model.d_ffn, model.d_model, model.n_layers" in lines[0]
