"""A run killed with SIGKILL resumes from its last checkpoint and ends exactly where an
uninterrupted run ends; SIGTERM stops gracefully; re-running a finished config adds no record."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import ROOT, TINY_LISTOPS, run_cli

pytestmark = pytest.mark.slow
ARGS = [*TINY_LISTOPS, "trainer.max_steps=40", "task.val_every=10", "checkpointing.every_n_steps=5",
        "trainer.deterministic=true", "model.dropout=0.1", "trainer.enable_progress_bar=false"]


def records(cwd: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((cwd / "results" / "runs").glob("*.json"))]


def start(cwd: Path, args: list[str]) -> subprocess.Popen:
    env = {**os.environ, "WANDB_MODE": "offline", "LRA_DATA_DIR": str(cwd / "data"),
           "LRA_RESULTS_DIR": str(cwd / "results"), "LRA_CHECKPOINT_DIR": str(cwd / "checkpoints")}
    return subprocess.Popen([sys.executable, str(ROOT / "run.py"), *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def wait_for_checkpoint(cwd: Path, proc: subprocess.Popen, timeout: float = 240) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if list((cwd / "checkpoints").glob("*/last.ckpt")):
            return
        if proc.poll() is not None:
            raise AssertionError(f"run ended before its first checkpoint:\n{proc.stderr.read()[-3000:]}")
        time.sleep(0.05)
    raise AssertionError("no checkpoint appeared")


def env_run(cwd: Path, args: list[str]):
    return run_cli(args, cwd, env={"LRA_CHECKPOINT_DIR": str(cwd / "checkpoints")})


def test_sigkill_then_rerun_equals_uninterrupted(tmp_path):
    ref, cut = tmp_path / "ref", tmp_path / "cut"
    ref.mkdir(), cut.mkdir()
    env_run(ref, ARGS)
    proc = start(cut, ARGS)
    wait_for_checkpoint(cut, proc)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    (killed,) = records(cut)
    assert killed["status"] == "running"
    env_run(cut, ARGS)  # the same command again
    (resumed,) = records(cut)  # exactly one record
    (uninterrupted,) = records(ref)
    assert resumed["status"] == "finished" and resumed["resumed"] is True
    assert resumed["run_id"] == killed["run_id"]
    for key in ("best_val_acc", "test_acc", "test_loss", "train_steps"):
        assert resumed["metrics"][key] == pytest.approx(uninterrupted["metrics"][key], abs=1e-6), key


def test_sigterm_saves_checkpoint_and_marks_interrupted(tmp_path):
    proc = start(tmp_path, [*ARGS, "trainer.max_steps=100000", "checkpointing.every_n_steps=3"])
    wait_for_checkpoint(tmp_path, proc)  # training has started
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    assert proc.returncode != 0
    (rec,) = records(tmp_path)
    assert rec["status"] == "interrupted" and "SIGTERM" in rec["error"] and "resume" in rec["error"]
    (last,) = (tmp_path / "checkpoints").glob("*/last.ckpt")
    import torch
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] >= 3


def test_sigterm_during_data_preparation_marks_interrupted(tmp_path):
    proc = start(tmp_path, [*ARGS, "task.datamodule.generator.n_train=500000"])
    deadline = time.time() + 120
    while time.time() < deadline and not (tmp_path / "results" / "runs").exists():
        time.sleep(0.05)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=120)
    (rec,) = records(tmp_path)
    assert rec["status"] == "interrupted", rec["error"]
    assert not [p for p in (tmp_path / "data" / "listops").glob("*") if (p / "COMPLETE").exists()]


def test_finished_config_is_not_run_twice(tmp_path):
    args = [*TINY_LISTOPS, "trainer.max_steps=2"]
    env_run(tmp_path, args)
    env_run(tmp_path, args)
    assert len(records(tmp_path)) == 1
    env_run(tmp_path, [*args, "resume=false"])
    assert len(records(tmp_path)) == 2


def test_resume_true_without_checkpoint_explains(tmp_path):
    proc = run_cli([*TINY_LISTOPS, "trainer.max_steps=2", "resume=true"], tmp_path, check=False)
    assert proc.returncode != 0 and "no checkpoint of an unfinished run" in proc.stderr


def test_incompatible_checkpoint_is_rejected(tmp_path):
    env_run(tmp_path, [*TINY_LISTOPS, "trainer.max_steps=2"])
    (ckpt,) = (tmp_path / "checkpoints").glob("*/best-*.ckpt")
    proc = run_cli([*TINY_LISTOPS, "trainer.max_steps=2", "model.d_model=48", f"ckpt_path={ckpt}"], tmp_path, check=False)
    assert proc.returncode != 0
    assert "does not match the configured model" in proc.stderr and "shape mismatch" in proc.stderr
