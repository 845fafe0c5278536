"""A newcomer's first day, through run.py with the DEFAULT logger (csv) and with W&B (offline):
the same command after Ctrl-C or SIGKILL resumes the one record; after it finished, it is skipped;
a sweep run twice trains nothing the second time. (tests/training/test_resume.py checks, with logger=none,
that a resumed run ends exactly where an uninterrupted one ends.)"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from lra.training.wandb_run import wandb_id
from tests.conftest import TINY_LISTOPS, run_cli
from tests.training.test_resume import kill_at, records
from tests.wandb_offline import read_run_info

pytestmark = pytest.mark.slow
DATA = [a for a in TINY_LISTOPS if not a.startswith("logger=")]  # the default logger, csv
# validation every 4 steps, periodic last.ckpt every 6 steps (those at 12, 24, ... wait for the validation)
ARGS = [*DATA, "trainer.max_steps=48", "task.val_every=4", "checkpointing.every_n_steps=6"]


def fresh_run(cwd: Path, args: list[str], check: bool = True):
    """A newcomer's `python run.py` in a fresh interpreter (not the `cli` fixture's forked run)."""
    return run_cli(args, cwd, env={"LRA_CHECKPOINT_DIR": str(cwd / "checkpoints")}, check=check)


def ckpt_step(path: Path) -> int:
    return torch.load(path, map_location="cpu", weights_only=False)["global_step"]


def finished_once(cwd: Path, run_id: str, steps: int) -> dict:
    (rec,) = records(cwd)  # one record, whatever happened before
    assert rec["run_id"] == run_id and rec["status"] == "finished", rec.get("error")
    assert rec["metrics"]["train_steps"] == steps
    ckpt_dir = cwd / "checkpoints" / run_id
    assert sorted(p.name for p in ckpt_dir.glob("last*.ckpt")) == ["last.ckpt"]  # never last-v1.ckpt
    assert ckpt_step(ckpt_dir / "last.ckpt") == steps  # the newest
    return rec


def test_ctrl_c_sigkill_then_the_same_command_resumes_then_skips(tmp_path):
    # 1. Ctrl-C in step 7: finishes the step, saves, says one line, the record is interrupted
    #    (the run presses Ctrl-C itself at that point: tests/killpoints.py)
    stopped = fresh_run(tmp_path, [*ARGS, *kill_at("step:7", "INT")], check=False)
    err = stopped.stderr
    assert stopped.returncode == 130 and "Traceback" not in err, err[-3000:]
    last_line = err.strip().splitlines()[-1]
    assert last_line.startswith("run.py: stopped by SIGINT at step 7") and "run the same command again" in last_line
    (rec,) = records(tmp_path)
    assert rec["status"] == "interrupted" and rec["efficiency"]["threads"] == 1 and rec["stamp"]["torch_threads"] == 1
    (last,) = (tmp_path / "checkpoints").glob("*/last.ckpt")
    assert ckpt_step(last) == 7 and "checkpoint of step 7" in last_line
    # 2. the same command resumes (a new Hydra output folder, the same record) and is SIGKILLed after
    #    its second checkpoint write
    killed = fresh_run(tmp_path, [*ARGS, *kill_at("save:2")], check=False)
    assert killed.returncode == -9
    (killed,) = records(tmp_path)
    assert killed["run_id"] == rec["run_id"] and killed["resumed"] is True and ckpt_step(last) > 7
    # 3. the same command resumes again and finishes
    out = fresh_run(tmp_path, ARGS)
    assert "Step" in out.stdout and "/-2" not in out.stdout  # counted in steps, not "Epoch 0/-2"
    assert "expected:" in out.stdout + out.stderr and "measured:" in out.stdout + out.stderr  # the forecast
    done = finished_once(tmp_path, rec["run_id"], 48)
    assert done["resume_count"] >= 2
    assert len(list((tmp_path / "outputs").glob("*/*"))) == 3  # every launch its own folder
    # 4. a sweep over the finished seed and a new one trains only the new one; run twice, nothing
    fresh_run(tmp_path, ["-m", *ARGS, "seed=0,1"])
    (new,) = [r for r in records(tmp_path) if r["run_id"] != done["run_id"]]
    assert new["seed"] == 1 and new["status"] == "finished"
    again = fresh_run(tmp_path, ["-m", *ARGS, "seed=0,1"])
    assert (again.stderr + again.stdout).count("this configuration already finished") == 2
    assert "[sweep] 2 jobs: 0 finished, 2 skipped (already finished), 0 failed" in again.stdout  # not "2 finished"
    assert sorted(r["run_id"] for r in records(tmp_path)) == sorted([done["run_id"], new["run_id"]])


def test_wandb_run_resumes_after_sigkill(tmp_path):
    args = [*ARGS, "logger=wandb"]
    assert fresh_run(tmp_path, [*args, *kill_at("save:2")], check=False).returncode == -9  # best-4, then last-6
    (killed,) = records(tmp_path)
    assert killed["status"] == "running"
    fresh_run(tmp_path, args)
    done = finished_once(tmp_path, killed["run_id"], 48)
    assert done["resumed"] is True and done["config"]["logger"]["wandb"]
    # one W&B run: both stretches logged offline under the results folder, under the one W&B id derived
    # from the suite's run id (wandb sync merges them: resume="allow"), with the same name and group
    logs = sorted((tmp_path / "results" / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(logs) == 2 and not list(tmp_path.glob("outputs/*/*/wandb")), logs
    # the folder and file of each stretch carry its W&B id (the SIGKILLed one flushed nothing else)
    assert {p.stem.removeprefix("run-") for p in logs} == {wandb_id(done["run_id"])}
    assert all(p.parent.name.endswith("-" + wandb_id(done["run_id"])) for p in logs)
    info = read_run_info(logs[-1])   # the resumed stretch, which finished
    assert info["id"] == wandb_id(done["run_id"]) and info["job_type"] == "train"
    assert info["name"] == f"softmax_listops_xiong2021_s0_{done['run_id'].rsplit('-', 1)[-1]}"
    assert info["group"].startswith("softmax-listops-xiong2021-")
    assert json.loads(info["config"]["suite/run_id"]) == done["run_id"]
    assert json.loads(info["config"]["suite/record"]).endswith(f"runs/{done['run_id']}.json")
