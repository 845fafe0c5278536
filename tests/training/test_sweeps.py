"""Sweeps at scale: W&B offline runs per job, DDP on two CPU processes, an Optuna study that
resumes from its sqlite storage."""
from __future__ import annotations

import json
import sqlite3

import pytest

from tests.conftest import TINY_LISTOPS
from tests.wandb_offline import read_run, read_run_info

pytestmark = pytest.mark.slow


def records(cwd):
    return [json.loads(p.read_text()) for p in sorted((cwd / "results" / "runs").glob("*.json"))]


def test_wandb_offline_run_per_job(cli):
    cli("-m", *[o for o in TINY_LISTOPS if o != "logger=none"], "logger=wandb", "trainer.max_steps=4", "trainer.log_every_n_steps=1",
        "task.val_every=2", "seed=0,1", env={"WANDB_MODE": "offline"})
    runs = sorted(cli.cwd.glob("results/wandb/offline-run-*/run-*.wandb"))  # under the results folder
    assert len(runs) == 2, runs  # one W&B run per job
    infos = [read_run_info(p) for p in runs]
    assert len({i["group"] for i in infos}) == 1 and len({i["name"] for i in infos}) == 2  # seeds group together
    for path in runs:
        keys, summary = read_run(path)
        assert {"train/loss_step", "val/acc", "test/acc"} <= keys, keys
        assert any(k.startswith("profile/") for k in keys), keys
        assert "record/test_acc" in summary  # the job finished its W&B run
    assert sorted(r["seed"] for r in records(cli.cwd)) == [0, 1]


@pytest.mark.xdist_group("ddp")  # Lightning's ddp takes a port found free just before (tests/conftest.py)
def test_ddp_two_cpu_processes_one_record(cli):
    cli(*TINY_LISTOPS, "trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2", "trainer.max_steps=6",
        "task.val_every=3", timeout=600)
    (rec,) = records(cli.cwd)  # exactly one record, written by rank 0
    assert rec["status"] == "finished" and rec["metrics"]["train_steps"] == 6
    assert rec["config"]["trainer"]["devices"] == 2
    assert 0.0 <= rec["metrics"]["test_acc"] <= 1.0 and rec["metrics"]["best_val_acc"] is not None


def test_optuna_study_resumes(cli):
    args = ["-m", "hydra/sweeper=optuna_lr", *TINY_LISTOPS, "trainer.max_steps=3", "hydra.sweeper.n_jobs=1"]
    cli(*args, "hydra.sweeper.n_trials=2")
    db = cli.cwd / "results" / "optuna.db"
    count = lambda: sqlite3.connect(db).execute("select count(*) from trials where state='COMPLETE'").fetchone()[0]  # noqa: E731
    assert count() == 2
    cli(*args, "hydra.sweeper.n_trials=1")  # the same study, continued
    assert count() == 3
