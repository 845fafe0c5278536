"""A run killed at ANY point resumes, with the same command, to exactly the uninterrupted run: the
same best validation (and its step, ties to the first), test accuracy and loss, steps, learning curve,
best checkpoint, and the curves its logger wrote (steps and values). The run stops itself at each
chosen point (``tests/killpoints.py``): after every checkpoint write, in the middle of a training
step, of a validation and of the test pass, as a validation ends and right after it; with checkpoint
steps that coincide with validation steps and ones that never do.
SIGTERM and Ctrl-C stop gracefully at those points too and resume exactly.

Runs go through ``tests/forkrun.py`` (``python run.py`` forked from a process that imported the suite
once): a real process that SIGKILLs itself, without the 5 s of imports per run."""
from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from lra.data.cache import FINGERPRINT
from tests.conftest import ROOT, TINY_LISTOPS
from tests.forkrun import RunServer
from tests.killpoints import pause_fifos

pytestmark = pytest.mark.slow
# lr 1e-3 with warm-up 3: validation accuracy rises, then ties (0.10 at step 10, 0.125 at 20 and 30):
# the best is not the first validation, and the tie must go to step 20
BASE = [*TINY_LISTOPS, "logger=csv", "trainer.max_steps=30", "task.val_every=10", "trainer.deterministic=true",
        "model.dropout=0.1", "optim.lr=1e-3", "optim.warmup_steps=3", "trainer.enable_progress_bar=false"]
ALIGNED = [*BASE, "checkpointing.every_n_steps=5"]  # last.ckpt due at 10, 20, 30: validation steps
APART = [*BASE, "checkpointing.every_n_steps=7"]    # last.ckpt at 7, 14, 21, 28: never a validation step
# checkpoint writes in order. ALIGNED: last 5, best 10, last 10, last 15, best 20, last 20, last 25,
# last 30 (30 ties 20: no best). APART: last 7, best 10, last 14, best 20, last 21, last 28.
KILLS = {
    "aligned": (ALIGNED, ["step:3", *(f"save:{k}" for k in range(1, 9)), "step:7", "step:10", "val:10:1", "val:20:3",
                          "after_val:10", "after_val:20", "test:1", "test:3"]),
    "apart": (APART, [*(f"save:{k}" for k in range(1, 7)), "step:20", "val:10:2", "after_val:20", "test:2"]),
}
COMPARED = ("best_val_acc", "best_val_step", "test_acc", "test_loss", "train_steps", "val_acc")


def kill_at(point: str, signal: str = "KILL") -> list[str]:
    return ["+callbacks.kill._target_=tests.killpoints.KillAt", f"+callbacks.kill.at={point}",
            f"+callbacks.kill.signal={signal}"]


def records(cwd: Path) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((cwd / "results" / "runs").glob("*.json"))]


def env(cwd: Path, data: Path) -> dict[str, str]:
    return {"LRA_DATA_DIR": str(data), "LRA_RESULTS_DIR": str(cwd / "results"),
            "LRA_CHECKPOINT_DIR": str(cwd / "checkpoints")}


CURVES = ("train/loss_step", "lr-AdamW/pg1", "val/acc", "val/loss", "test/acc", "test/loss")


def logged(cwd: Path) -> dict[str, dict[str, str]]:
    """The curves the CSV logger wrote, step -> value, over every invocation in ``cwd`` (a step
    redone after a kill is logged again; the later value stands, as on a chart). Epoch aggregates
    (``train/acc``) are left out: Lightning starts them again at each invocation."""
    curves: dict[str, dict[str, str]] = {k: {} for k in CURVES}
    for path in sorted((cwd / "outputs").glob("**/csv/metrics.csv")):
        with path.open() as f:
            for row in csv.DictReader(f):
                for k in CURVES:
                    if row.get(k):
                        curves[k][row["step"]] = row[k]
    return curves


def outcome(cwd: Path) -> dict:
    (rec,) = records(cwd)  # one record, whatever happened before
    assert rec["status"] == "finished", rec.get("error")
    ckpt_dir = cwd / "checkpoints" / rec["run_id"]
    best = sorted(p.name for p in ckpt_dir.glob("best-*.ckpt"))
    # the wall clock runs through every resume: stretches that join up from step 0 to the end
    steps = [(s["from_step"], s["to_step"]) for s in rec["efficiency"]["wall"]["segments"]]
    assert steps[0][0] == 0 and steps[-1][1] == rec["metrics"]["train_steps"], steps
    assert all(a[1] == b[0] for a, b in zip(steps, steps[1:])), steps
    assert rec["metrics"]["n_val"] == 40  # TINY_LISTOPS' validation split: the report's floor under best_val_acc
    # the load is sampled at each validation of the stretch (every 10 steps here)
    loads = [(s["load_samples"], s["to_step"] // 10 - s["from_step"] // 10) for s in rec["efficiency"]["wall"]["segments"]]
    assert all(n == due for n, due in loads), loads
    # peak memory and throughput cover every stretch too (carried in the checkpoint); the batches
    # they counted (timed + warm-up) are the uninterrupted run's, each training step once
    eff = rec["efficiency"]
    assert eff["peak_memory"]["from_step"] == 0 and eff["throughput"]["from_step"] == 0, eff
    counted = {p: sum(v for k, v in eff["throughput"][p].items() if k.startswith(("timed_", "warmup_")))
               for p in ("train", "val")}
    assert counted["train"] == rec["metrics"]["train_steps"], eff["throughput"]
    return {"metrics": {**{k: rec["metrics"][k] for k in COMPARED}, "batches_counted": counted},
            "curve": rec["learning_curve"], "best": best,
            "logged": logged(cwd),
            "run_id": rec["run_id"], "resumed": rec.get("resumed", False), "restarts": rec.get("restart_count", 0)}


@pytest.fixture(scope="module")
def server():
    with RunServer() as s:
        yield s


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tmp_path_factory.mktemp("data")  # generated once, shared (read-only after the first run)


@pytest.fixture(scope="module")
def uninterrupted(server, data, tmp_path_factory):
    out = {}
    for name, (args, _) in KILLS.items():
        cwd = tmp_path_factory.mktemp(f"ref-{name}")
        server.run(args, cwd, env(cwd, data))
        out[name] = outcome(cwd)
    return out


def test_the_reference_runs_exercise_the_tie_rule(uninterrupted):
    for ref in uninterrupted.values():
        assert [acc for _, acc in ref["curve"]] == pytest.approx([0.1, 0.125, 0.125])  # 20 and 30 tie
        assert ref["metrics"]["best_val_step"] == 20 and ref["best"] == ["best-20.ckpt"]  # the FIRST best
        # what the logger wrote, compared after every resume: validation and test at the steps charted
        assert list(ref["logged"]["val/acc"]) == ["9", "19", "29"] and list(ref["logged"]["test/acc"]) == ["30"]


@pytest.mark.parametrize("name,point", [(n, p) for n, (_, points) in KILLS.items() for p in points])
def test_killed_at_any_point_resumes_to_the_uninterrupted_run(server, data, uninterrupted, tmp_path, name, point):
    args = KILLS[name][0]
    killed = server.run([*args, *kill_at(point)], tmp_path, env(tmp_path, data), check=False)
    assert killed.returncode == -9, killed.stderr[-3000:]  # it died where it was told to
    (rec,) = records(tmp_path)
    assert rec["status"] == "running"
    server.run(args, tmp_path, env(tmp_path, data))  # the same command again
    resumed = outcome(tmp_path)
    assert resumed["run_id"] == rec["run_id"]  # one record
    # from its last.ckpt; killed before the first one, it starts again from step 0
    assert (resumed["resumed"], resumed["restarts"]) == ((False, 1) if point == "step:3" else (True, 0))
    ref = uninterrupted[name]
    assert resumed["metrics"] == ref["metrics"]  # exactly, not approximately
    assert resumed["curve"] == ref["curve"] and resumed["best"] == ref["best"]
    assert resumed["logged"] == ref["logged"]  # the logged curves too: steps and values


def test_a_run_moved_to_another_path_resumes_exactly(server, data, uninterrupted, tmp_path):
    """A checkpoint committed on one machine and resumed from another clone: the results and checkpoint
    folders sit at another absolute path. Killed after step 25 (its best so far is step 20), the resumed
    run must keep that best: Lightning's own ModelCheckpoint drops its best score when the folder path
    changed, and validation 30 (a tie) would then become the best and be tested."""
    first, moved = tmp_path / "machine-a", tmp_path / "machine-b"
    first.mkdir()
    killed = server.run([*ALIGNED, *kill_at("save:7")], first, env(first, data), check=False)  # after last.ckpt of step 25
    assert killed.returncode == -9, killed.stderr[-3000:]
    shutil.move(first, moved)
    server.run(ALIGNED, moved, env(moved, data))
    resumed = outcome(moved)
    assert resumed["resumed"] and resumed["metrics"] == uninterrupted["aligned"]["metrics"]
    assert resumed["curve"] == uninterrupted["aligned"]["curve"] and resumed["best"] == uninterrupted["aligned"]["best"]
    assert resumed["logged"] == uninterrupted["aligned"]["logged"]


@pytest.mark.parametrize("point,signal,saved_step", [
    ("step:7", "TERM", 7),     # finishes step 7, saves it, stops
    ("step:10", "TERM", 5),    # a validation follows step 10: stops at once, last.ckpt stays at 5
    ("val:20:2", "INT", 15),   # inside a validation: stops at once
    ("step:13", "INT2", 10),   # a second Ctrl-C: stops at once without saving
    # after a validation's last batch: Lightning's own SIGTERM exit, after it counted the step for its
    # loggers. Resumed from there, every later metric was logged a step late (the CPU Reformer run's
    # first resume); after step 30 the resumed run only tests, and a fix that saved a lower count
    # logged that test a step early (as Lightning does after a kill at "save:8")
    ("val_end:10", "TERM", 10),
    ("val_end:30", "TERM", 30),
])
def test_graceful_stops_resume_exactly(server, data, uninterrupted, tmp_path, point, signal, saved_step):
    stopped = server.run([*ALIGNED, *kill_at(point, signal)], tmp_path, env(tmp_path, data), check=False)
    assert stopped.returncode == 130 and "Traceback" not in stopped.stderr, stopped.stderr[-3000:]
    (rec,) = records(tmp_path)
    assert rec["status"] == "interrupted"
    (last,) = (tmp_path / "checkpoints").glob("*/last.ckpt")
    assert torch.load(last, map_location="cpu", weights_only=False)["global_step"] == saved_step
    assert f"checkpoint of step {saved_step}" in stopped.stderr.strip().splitlines()[-1]
    server.run(ALIGNED, tmp_path, env(tmp_path, data))
    resumed = outcome(tmp_path)
    assert resumed["metrics"] == uninterrupted["aligned"]["metrics"]
    assert resumed["curve"] == uninterrupted["aligned"]["curve"]
    assert resumed["logged"] == uninterrupted["aligned"]["logged"]


def test_sigterm_during_data_preparation_marks_interrupted(server, tmp_path):
    stopped = server.run([*TINY_LISTOPS, "trainer.max_steps=2"], tmp_path, env(tmp_path, tmp_path / "data"),
                         check=False, hook="tests.killpoints:signal_during_data_build")
    assert stopped.returncode == 130, stopped.stderr[-3000:]
    (rec,) = records(tmp_path)
    assert rec["status"] == "interrupted", rec["error"]
    assert "before training started" in rec["error"]
    assert not [p for p in (tmp_path / "data" / "listops").glob("*") if (p / "COMPLETE").exists()]


def test_finished_config_is_not_run_twice(server, data, tmp_path):
    args = [*TINY_LISTOPS, "trainer.max_steps=2"]
    server.run(args, tmp_path, env(tmp_path, data))
    again = server.run(args, tmp_path, env(tmp_path, data))
    assert len(records(tmp_path)) == 1 and "already finished" in again.stderr + again.stdout
    server.run([*args, "resume=false"], tmp_path, env(tmp_path, data))
    assert len(records(tmp_path)) == 2


def test_resume_true_without_checkpoint_explains(cli):
    proc = cli(*TINY_LISTOPS, "trainer.max_steps=2", "resume=true", check=False)
    assert proc.returncode != 0 and "no checkpoint of an unfinished run" in proc.stderr


def test_a_resume_onto_other_data_is_refused(server, data, uninterrupted, tmp_path):
    """The same settings can generate other data elsewhere (another generator version, a damaged
    copy): a run must not continue on it silently. Refused, it loses nothing: with its own data the
    same command resumes it to the uninterrupted run."""
    killed = server.run([*ALIGNED, *kill_at("save:3")], tmp_path, env(tmp_path, data), check=False)
    assert killed.returncode == -9, killed.stderr[-3000:]
    (rec,) = records(tmp_path)
    (cache,) = (marker.parent for marker in data.glob("listops/cache-*/COMPLETE"))
    assert rec["data_fingerprint"] == (cache / FINGERPRINT).read_text().strip()
    other = tmp_path / "other-data"
    shutil.copytree(cache, other / "listops" / cache.name)
    labels = np.load(cache / "train_labels.npy")
    labels[0] = (labels[0] + 1) % 10
    np.save(other / "listops" / cache.name / "train_labels.npy", labels)
    (other / "listops" / cache.name / FINGERPRINT).unlink()   # built elsewhere: its own fingerprint
    proc = server.run(ALIGNED, tmp_path, env(tmp_path, other), check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert f"fingerprint {rec['data_fingerprint']}" in proc.stderr and "resume=false" in proc.stderr
    server.run(ALIGNED, tmp_path, env(tmp_path, data))
    resumed = outcome(tmp_path)
    assert resumed["resumed"] and resumed["metrics"] == uninterrupted["aligned"]["metrics"]
    assert resumed["curve"] == uninterrupted["aligned"]["curve"]


def test_incompatible_checkpoint_is_rejected(server, data, tmp_path):
    server.run([*TINY_LISTOPS, "trainer.max_steps=2"], tmp_path, env(tmp_path, data))
    (ckpt,) = (tmp_path / "checkpoints").glob("*/best-*.ckpt")
    proc = server.run([*TINY_LISTOPS, "trainer.max_steps=2", "model.d_model=48", f"ckpt_path={ckpt}"], tmp_path,
                      env(tmp_path, data), check=False)
    assert proc.returncode == 2
    assert "does not match the configured model" in proc.stderr and "shape mismatch" in proc.stderr


def test_a_damaged_own_checkpoint_names_the_way_out(server, data, tmp_path):
    server.run([*ALIGNED, *kill_at("save:3")], tmp_path, env(tmp_path, data), check=False)  # last 5, best 10, last 10
    (last,) = (tmp_path / "checkpoints").glob("*/last.ckpt")
    last.write_bytes(b"torn by a full disk")
    proc = server.run(ALIGNED, tmp_path, env(tmp_path, data), check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    err = proc.stderr.strip()
    assert f"its own checkpoint {last} is damaged" in err and "resume=false" in err
    assert f"mode=test ckpt_path={last.parent / 'best-10.ckpt'}" in err  # the intact best beside it


def test_two_identical_commands_started_together_train_once(data, tmp_path):
    """The second command waits for the first (paused at step 3 until the test lets it go: FIFOs,
    no timing), then finds the run finished and adds nothing."""
    release = tmp_path / "release"
    pause_fifos(release)
    environ = {**os.environ, "WANDB_MODE": "offline", **env(tmp_path, data)}
    command = [sys.executable, str(ROOT / "run.py"), *ALIGNED]
    pause = ["+callbacks.pause._target_=tests.killpoints.PauseAt", "+callbacks.pause.at=step:3", f"+callbacks.pause.until={release}"]
    first = subprocess.Popen([*command, *pause], cwd=tmp_path, env=environ, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    second = None
    try:
        with open(f"{release}.paused") as paused:  # blocks until the first run is at step 3
            assert paused.read() == "paused\n"
        second = subprocess.Popen(command, cwd=tmp_path, env=environ, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        waiting = next((line for line in iter(second.stdout.readline, "") if "an identical run" in line), "")
        assert "waiting for it to end" in waiting and len(records(tmp_path)) == 1
        with open(release, "w"):
            pass  # let the first run go on
        assert first.wait(timeout=600) == 0, first.stderr.read()[-3000:]
        rest = second.communicate(timeout=600)[0]
        assert second.returncode == 0 and "already finished" in rest, rest[-3000:]
        (rec,) = records(tmp_path)
        assert rec["status"] == "finished"
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()
