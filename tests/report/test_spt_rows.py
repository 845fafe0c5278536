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
