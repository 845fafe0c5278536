"""``trainer.compile=true`` end to end on tiny generated ListOps: the compiled run trains, evaluates
and tests through Inductor, matches the eager run, and says in its record how many graphs it
compiled and why it recompiled; a recompile storm stops the run with the reasons and the fix."""
from __future__ import annotations

import json

import pytest

from tests.conftest import TINY_LISTOPS

pytestmark = pytest.mark.slow

RUN = [*TINY_LISTOPS, "trainer.max_steps=6", "task.val_every=3", "logger=none", "trainer.enable_progress_bar=false"]
SCALAR = "tests.graph_safe:scalar_cpp"  # the pipeline is tested, not Inductor's SIMD kernels (tests/graph_safe.py)


def records(cwd):
    return {r["config"]["trainer"]["compile"]: r
            for r in (json.loads(p.read_text()) for p in sorted((cwd / "results" / "runs").glob("*.json")))}


def test_compiled_run_matches_eager_and_records_its_graphs(cli):
    cli(*RUN)
    cli(*RUN, "trainer.compile=true", hook=SCALAR)
    recs = records(cli.cwd)
    eager, compiled = recs[False], recs[True]
    assert eager["status"] == compiled["status"] == "finished"
    assert eager["efficiency"]["compile"] == {"enabled": False}
    info = compiled["efficiency"]["compile"]
    assert info["enabled"] and info["fullgraph"] and not info["dynamic"]
    # training batches have one shape; evaluation widths are multiples of max_len / 8 = 8 (and a
    # last partial batch): a handful of graphs, each recompile named by its failed guard
    assert 2 <= info["graphs"] <= 16 and info["recompiles"] == info["graphs"] - 1
    assert info["recompile_reasons"] and all(isinstance(r, str) and r for r in info["recompile_reasons"])
    # softmax draws nothing, so graph-safe compiled code computes the eager run's numbers
    for key in ("best_val_acc", "test_acc", "train_steps", "best_val_step"):
        assert compiled["metrics"][key] == pytest.approx(eager["metrics"][key], abs=1e-6), key
    assert compiled["metrics"]["test_loss"] == pytest.approx(eager["metrics"]["test_loss"], abs=1e-4)


def test_recompile_storm_stops_with_the_reason_and_the_fix(cli):
    proc = cli(*RUN, "trainer.compile=true", "trainer.compile_limit=1", check=False, hook=SCALAR)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "trainer.compile_limit=1" in proc.stderr and "last reasons: " in proc.stderr
    assert "not logged" not in proc.stderr  # the failed guard is named (here: the switch to validation)
    (rec,) = records(cli.cwd).values()
    assert rec["status"] == "failed" and "trainer.compile_limit" in rec["error"]


def test_compile_limit_below_one_is_refused_before_any_work(cli):
    proc = cli(*RUN, "trainer.compile=true", "trainer.compile_limit=0", check=False)
    assert proc.returncode == 2 and "trainer.compile_limit" in proc.stderr
    assert not (cli.cwd / "data").exists()
