"""Runs that know their code, through run.py: an edited variant is a new experiment (trained
again, pooled apart), a refactor that keeps the numbers is not (a killed run resumes across it),
and a killed run is never continued by code that behaves differently. The edits are planted in the
forked run (:mod:`tests.code_edits`), deterministically."""
from __future__ import annotations

import csv

import pytest

from tests.conftest import TINY_LISTOPS
from tests.training.test_resume import data, env, kill_at, records, server  # noqa: F401 - fixtures shared

pytestmark = pytest.mark.slow
ARGS = [*TINY_LISTOPS, "trainer.max_steps=4", "task.val_every=2", "checkpointing.every_n_steps=1",
        "trainer.enable_progress_bar=false"]
CHANGED, SAME = "tests.code_edits:changed_behaviour", "tests.code_edits:same_behaviour"



def said(proc) -> str:
    return proc.stdout + proc.stderr


def test_an_edited_variant_trains_again_and_is_pooled_apart(server, data, tmp_path):
    run = lambda *extra, **kw: server.run([*ARGS, *extra], tmp_path, env(tmp_path, data), **kw)  # noqa: E731
    run()
    edited = run(hook=CHANGED)
    assert "already finished" not in said(edited) and "behaves differently" in said(edited), said(edited)[-2000:]
    first, second = records(tmp_path)
    assert second["status"] == "finished" and second["fingerprint"] != first["fingerprint"]
    assert "already finished" in said(run())  # the original code again: its finished run counts
    assert len(records(tmp_path)) == 2
    server.run(["mode=report"], tmp_path, env(tmp_path, data))
    (table,) = (tmp_path / "results" / "tables").glob("cells_custom_*.csv")
    rows = list(csv.DictReader(table.open()))
    cells = {row["run_ids"]: row for row in rows}
    assert set(cells) == {first["run_id"], second["run_id"]}, rows  # two cells, one run each
    assert any("behaves differently" in " ".join(row.values()) for row in rows)


def test_a_killed_run_resumes_across_a_refactor_but_not_across_a_change(server, data, tmp_path):
    run = lambda *extra, **kw: server.run([*ARGS, *extra], tmp_path, env(tmp_path, data), **kw)  # noqa: E731
    killed = run(*kill_at("save:2"), check=False)
    assert killed.returncode == -9, said(killed)[-2000:]
    refused = run(hook=CHANGED, check=False)
    assert refused.returncode == 2, said(refused)[-2000:]
    line = refused.stderr.strip().splitlines()[-1]
    assert "behaves differently" in line and "training loss of step 1: " in line and "recorded against" in line and "resume=false" in line, line
    (rec,) = records(tmp_path)
    assert rec["status"] != "finished"  # refused: nothing trained, nothing lost
    resumed = run(hook=SAME)
    assert "behaves differently" not in said(resumed)
    (rec,) = records(tmp_path)
    assert rec["status"] == "finished" and rec.get("resumed") and rec["metrics"]["train_steps"] == 4
    assert len(rec["efficiency"]["wall"]["segments"]) == 2  # every stretch with its code version
    assert all("source_sha1" in s and "dirty" in s for s in rec["efficiency"]["wall"]["segments"])
    fresh = run("resume=false", hook=CHANGED)
    assert fresh.returncode == 0 and len(records(tmp_path)) == 2
