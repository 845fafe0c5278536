"""Self-pretrained fine-tunes (``+pretrain=mlm``, issue 64) in the report: rows ``<variant> +SPT(mlm)``
beside the from-scratch rows of the same protocol, never pooled with them, tested against
``softmax +SPT(mlm)``; their pretraining records feed no table; an edited pretraining setting is a
custom row."""
from __future__ import annotations

from tests.report.fabricate import Results

SPT = {"pretrain": {"objective": "mlm", "mask_ratio": 0.5, "max_steps": 600, "warmup_steps": 30, "lr": 0.003,
                    "val_every": None}}


def spt_runs(res: Results, attention: str, ks: list[int], **changes) -> None:
    for seed, k in enumerate(ks):
        res.train(attention, seed, k, changes={**SPT, **changes},
                  overrides=["experiment=quick", "+pretrain=mlm", f"attention={attention}", f"seed={seed}",
                             *(f"{key.replace('__', '.')}={v}" for key, v in changes.items())])


def test_spt_rows_stand_beside_the_from_scratch_rows_and_are_never_pooled(tmp_path):
    res = Results(tmp_path)
    res.sweep("softmax", [80, 82, 84])
    res.sweep("adamra", [78, 80, 81])
    spt_runs(res, "softmax", [120, 122, 125])
    spt_runs(res, "adamra", [90, 92, 93])
    pre = res.train("softmax", 0, 10, run_id="pretrain-softmax", changes=SPT, overrides=["+pretrain=mlm"])
    res.edit(pre, mode="pretrain")
    spt_runs(res, "linear", [60], pretrain__mask_ratio=0.25)  # another pretraining: a custom row
    md, files, _ = res.report()
    tables = {k[len("tables/"):-len(".csv")]: v for k, v in files.items() if k.endswith(".csv") and k.startswith("tables/")}
    acc = tables["accuracy_quick"]
    lines = [ln.split(",")[0] for ln in acc.splitlines()[1:] if ln and not ln.startswith(("AdaMRA", "LRA"))]
    assert lines[:4] == ["softmax", "softmax +SPT(mlm)", "adamra", "adamra +SPT(mlm)"], acc
    assert "softmax +SPT(mlm),run,61.1" in acc and "softmax,run,41.0" in acc  # separate cells: 122.33/200, 82/200
    assert "never pooled with the runs from scratch" in md
    sig = tables["significance_quick"]
    assert "adamra +SPT(mlm),softmax +SPT(mlm)" in sig and "adamra,softmax" in sig
    assert "adamra +SPT(mlm),softmax," not in sig
    assert "linear +SPT(mlm),pretrain.mask_ratio=0.25" in tables["accuracy_custom_quick"]
    assert "| `pretrain-softmax.json` | pretrain listops softmax seed 0 | mode=pretrain:" in md


def test_report_compare_tests_a_self_pretrained_row_against_its_from_scratch_row(tmp_path):
    """Tier 2's question (does self-pretraining change a variant's accuracy?): report.compare takes
    the row names, and its exploratory table tests the pair seed by seed."""
    from lra.report.arguments import check_compare_names

    res = Results(tmp_path)
    res.sweep("softmax", [80, 82, 84])
    res.sweep("adamra", [78, 80, 81])
    spt_runs(res, "adamra", [120, 122, 125])
    check_compare_names(("adamra +SPT(mlm)", "adamra"), tmp_path)  # no error: both rows have finished runs
    md, files, _ = res.report(compare=("adamra +SPT(mlm)", "adamra"))
    (table,) = [v for k, v in files.items() if k.startswith("tables/compare_") and k.endswith(".csv")]
    assert "adamra +SPT(mlm),adamra" in table, table


def test_report_also_reads_the_from_scratch_folder_beside_the_self_pretrained_one(tmp_path):
    """``report.also``: a self-pretrained folder's report shows the from-scratch folder's rows beside
    its own, never pooled; each run's predictions come from its own folder, the other folder's files
    are named relative to the report's, and nothing there is written."""
    from lra.report.build import build_report

    scratch, spt = Results(tmp_path / "scratch"), Results(tmp_path / "spt")
    spt.clock = 100  # run ids of their own, as real ones are
    scratch.sweep("softmax", [80, 82, 84])
    scratch.sweep("adamra", [78, 80, 81])
    scratch.edit(scratch.train("linear", 0, 50, run_id="linear-running"), status="running")
    spt_runs(spt, "softmax", [120, 122, 125])
    spt_runs(spt, "adamra", [90, 92, 93])
    before = sorted((p.name, p.read_bytes()) for p in scratch.runs.iterdir())
    md, files, _ = build_report(spt.root, also=[scratch.root])
    acc = files["tables/accuracy_quick.csv"]
    lines = [ln.split(",")[0] for ln in acc.splitlines()[1:] if ln and not ln.startswith(("AdaMRA", "LRA"))]
    assert lines[:4] == ["softmax", "softmax +SPT(mlm)", "adamra", "adamra +SPT(mlm)"], acc
    assert "softmax +SPT(mlm),run,61.1" in acc and "softmax,run,41.0" in acc
    assert "Built from 13 record file(s) under `runs/` and `../scratch/runs/`: 12 used, 1 excluded" in md
    assert "- **running** × 1: `linear-running`" in md
    assert "\n../scratch/runs/linear-running.json,not finished," in files["excluded.csv"]
    assert sorted((p.name, p.read_bytes()) for p in scratch.runs.iterdir()) == before


def test_report_also_refuses_its_own_folder_a_repeat_and_a_folder_without_records(tmp_path):
    import pytest

    from lra.badinput import ConfigError, DataMissingError
    from lra.report.arguments import check_also

    res, other = Results(tmp_path / "a"), Results(tmp_path / "b")
    res.sweep("softmax", [80])
    other.sweep("softmax", [80])
    assert check_also([str(other.root)], res.root) == [other.root]
    for bad in ([str(res.root)], [str(other.root), str(other.root)]):
        with pytest.raises(ConfigError, match=r"report.also=.* names .* twice or names the report's own folder"):
            check_also(bad, res.root)
    with pytest.raises(DataMissingError, match=r"report.also: .*nowhere is not a results folder with run records"):
        check_also([str(tmp_path / "nowhere")], res.root)
