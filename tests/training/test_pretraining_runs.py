"""Self-pretraining through ``run.py`` end to end (issue 64): one command pretrains then fine-tunes;
the pretraining is a run of its own, found again by its identity (a second fine-tune reuses it);
both stages resume exactly from a kill at any point (``tests/killpoints.py``, limited to one stage
with ``stage=``); every attention config runs ``experiment=quick +pretrain=mlm``.

Runs go through ``tests/forkrun.py`` (see ``tests/training/test_resume.py``)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from attention.registry import variant_names
from tests.conftest import ROOT
from lra.identity import behaviour_difference
from tests.killpoints import pause_fifos

SMALL = ["experiment=quick", "+pretrain=mlm", "model=tiny", "logger=none", "trainer.enable_progress_bar=false",
         "task.max_len=64", "task.batch_size=16", "task.datamodule.generator.n_train=200",
         "task.datamodule.generator.n_val=40", "task.datamodule.generator.n_test=40",
         "task.datamodule.generator.min_length=5", "task.datamodule.generator.max_length=60"]
QUICK = [*SMALL, "pretrain.max_steps=4", "trainer.max_steps=4", "task.val_every=2", "optim.warmup_steps=1"]
# resume: dropout on, validations and checkpoints at steps that coincide (10, 20) and that do not (7, 14)
RESUME = [*SMALL, "model.dropout=0.1", "trainer.deterministic=true", "optim.lr=1e-3", "optim.warmup_steps=3",
          "pretrain.max_steps=20", "pretrain.val_every=10", "trainer.max_steps=20", "task.val_every=10",
          "checkpointing.every_n_steps=7"]
# checkpoint writes: pretraining last 7, last 14 (no best-validation checkpoint: the last encoder is
# carried); the fine-tune last 7, best 10, last 14, best 20 if better
PRETRAIN_KILLS = ["step:3", "save:1", "save:2", "step:10", "val:10:1", "after_val:10", "val_end:20", "step:20"]
FINETUNE_KILLS = ["step:3", "save:1", "save:3", "val:10:2", "after_val:10", "test:1"]


def records(cwd: Path, mode: str | None = None) -> list[dict]:
    found = [json.loads(p.read_text()) for p in sorted((cwd / "results" / "runs").glob("*.json"))]
    return [r for r in found if mode is None or r["mode"] == mode]


def env(cwd: Path, data: Path) -> dict[str, str]:
    return {"LRA_DATA_DIR": str(data), "LRA_RESULTS_DIR": str(cwd / "results"),
            "LRA_CHECKPOINT_DIR": str(cwd / "checkpoints")}


def kill_at(point: str, stage: str) -> list[str]:
    return ["+callbacks.kill._target_=tests.killpoints.KillAt", f"+callbacks.kill.at={point}",
            f"+callbacks.kill.stage={stage}"]


@pytest.fixture(scope="module")
def server(run_server):
    return run_server  # the worker's run server (tests/conftest.py)


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return tmp_path_factory.mktemp("data")


def outcome(cwd: Path) -> dict:
    (pre,) = records(cwd, "pretrain")
    (fine,) = records(cwd, "train")
    assert pre["status"] == "finished" and fine["status"] == "finished", (pre.get("error"), fine.get("error"))
    encoder = torch.load(pre["encoder"], weights_only=True)
    return {"pre": {k: pre[k] for k in ("metrics", "learning_curve", "loss_curve")},
            "fine": {"metrics": {k: v for k, v in fine["metrics"].items()}, "curve": fine["learning_curve"]},
            "encoder": encoder, "pre_record": pre, "fine_record": fine}


def test_one_command_pretrains_then_fine_tunes_and_a_second_fine_tune_reuses_it(server, data, tmp_path):
    server.run(QUICK, tmp_path, env(tmp_path, data))
    (pre,) = records(tmp_path, "pretrain")
    (fine,) = records(tmp_path, "train")
    assert pre["status"] == fine["status"] == "finished"
    assert pre["metrics"]["train_steps"] == 4 and fine["metrics"]["train_steps"] == 4
    assert pre["efficiency"]["wall"]["train_s"] > 0  # the budget is stated in steps and wall time
    assert pre["config"]["mode"] == "pretrain" and fine["config"]["pretrain"]["objective"] == "mlm"
    assert fine["pretraining"]["run_id"] == pre["run_id"] and Path(fine["pretraining"]["record"]).is_file()
    assert Path(pre["encoder"]).is_file() and not (Path(pre["checkpoint_dir"]) / "last.ckpt").exists()
    assert pre["run_key"] != fine["run_key"]
    assert len(pre["fingerprint"]["losses"]) == 2 and pre["fingerprint"] != fine["fingerprint"]  # its own code's
    # a fine-tune with another budget finds the same pretraining; the same command again skips both
    server.run([*QUICK, "trainer.max_steps=3"], tmp_path, env(tmp_path, data))
    server.run(QUICK, tmp_path, env(tmp_path, data))
    assert len(records(tmp_path, "pretrain")) == 1 and len(records(tmp_path, "train")) == 2
    assert {r["pretraining"]["run_id"] for r in records(tmp_path, "train")} == {pre["run_id"]}


@pytest.mark.slow
@pytest.mark.parametrize("attention", variant_names())
def test_every_attention_config_pretrains_and_fine_tunes(server, data, tmp_path, attention):
    server.run([*QUICK, f"attention={attention}", "pretrain.max_steps=2", "trainer.max_steps=2"], tmp_path,
               env(tmp_path, data))
    (pre,) = records(tmp_path, "pretrain")
    (fine,) = records(tmp_path, "train")
    assert pre["status"] == fine["status"] == "finished" and fine["pretraining"]["run_id"] == pre["run_id"]
    assert pre["metrics"]["val_loss"] is not None and fine["metrics"]["test_acc"] is not None


@pytest.fixture(scope="module")
def uninterrupted(server, data, tmp_path_factory):
    cwd = tmp_path_factory.mktemp("ref")
    server.run(RESUME, cwd, env(cwd, data))
    return outcome(cwd)


def assert_same(got: dict, ref: dict) -> None:
    assert got["pre"] == ref["pre"]
    assert got["fine"] == ref["fine"]
    assert ref["encoder"].keys() == got["encoder"].keys()
    for k, v in ref["encoder"].items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(v, got["encoder"][k]), k


@pytest.mark.slow
@pytest.mark.parametrize("point", PRETRAIN_KILLS)
def test_killed_while_pretraining_the_same_command_resumes_it_then_fine_tunes(server, data, uninterrupted, tmp_path, point):
    killed = server.run([*RESUME, *kill_at(point, "pretrain")], tmp_path, env(tmp_path, data), check=False)
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert not records(tmp_path, "train")  # the fine-tune had not started
    had_last = any((tmp_path / "checkpoints").glob("*/last.ckpt"))
    server.run(RESUME, tmp_path, env(tmp_path, data))
    got = outcome(tmp_path)
    assert_same(got, uninterrupted)
    # resumed from its last.ckpt when it had one (else started again in the same record): not redone.
    # The wall clock's stretches join up from step 0 to the end; a resumed one starts past step 0.
    steps = [(seg["from_step"], seg["to_step"]) for seg in got["pre_record"]["efficiency"]["wall"]["segments"]]
    assert steps[0][0] == 0 and steps[-1][1] == 20 and all(a[1] == b[0] for a, b in zip(steps, steps[1:])), steps
    assert (len(steps) == 2 and steps[1][0] > 0) == had_last, (steps, had_last)
    assert got["pre_record"].get("restart_count", 0) == (not had_last)


@pytest.mark.slow
@pytest.mark.parametrize("point", FINETUNE_KILLS)
def test_killed_while_fine_tuning_the_fine_tune_resumes_without_pretraining_again(server, data, uninterrupted, tmp_path,
                                                                                 point):
    killed = server.run([*RESUME, *kill_at(point, "train")], tmp_path, env(tmp_path, data), check=False)
    assert killed.returncode == -9, killed.stderr[-3000:]
    (pre,) = records(tmp_path, "pretrain")
    assert pre["status"] == "finished"
    server.run(RESUME, tmp_path, env(tmp_path, data))
    got = outcome(tmp_path)
    assert_same(got, uninterrupted)
    assert got["pre_record"] == pre  # not touched: not resumed, not rerun


@pytest.mark.slow
def test_two_fine_tunes_started_together_pretrain_once(data, tmp_path):
    """Two jobs of a sweep (different fine-tunes) that need the same pretraining: the second waits on
    the pretraining's lock while the first pretrains (paused at step 3 until the test lets it go:
    FIFOs, no timing), then finds it finished and fine-tunes from it."""
    release = tmp_path / "release"
    pause_fifos(release)
    environ = {**os.environ, "WANDB_MODE": "offline", **env(tmp_path, data)}
    command = [sys.executable, str(ROOT / "run.py"), *QUICK]
    pause = ["+callbacks.pause._target_=tests.killpoints.PauseAt", "+callbacks.pause.at=step:3",
             f"+callbacks.pause.until={release}", "+callbacks.pause.stage=pretrain"]
    first = subprocess.Popen([*command, *pause], cwd=tmp_path, env=environ, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
    second = None
    try:
        with open(f"{release}.paused") as paused:  # blocks until the first is at pretraining step 3
            assert paused.read() == "paused\n"
        second = subprocess.Popen([*command, "trainer.max_steps=3"], cwd=tmp_path, env=environ, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True)
        waiting = next((line for line in iter(second.stdout.readline, "") if "an identical run" in line), "")
        assert "waiting for it to end" in waiting and len(records(tmp_path, "pretrain")) == 1
        with open(release, "w"):
            pass  # let the first run go on
        assert first.wait(timeout=600) == 0, first.stderr.read()[-3000:]
        rest = second.communicate(timeout=600)[0]
        assert second.returncode == 0 and "self-pretraining already done" in rest, rest[-3000:]
        (pre,) = records(tmp_path, "pretrain")
        fines = records(tmp_path, "train")
        assert len(fines) == 2 and {r["pretraining"]["run_id"] for r in fines} == {pre["run_id"]}
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.kill()


@pytest.mark.slow
def test_a_pretraining_by_code_that_behaves_differently_is_not_reused_nor_resumed(server, data, tmp_path):
    server.run(QUICK, tmp_path, env(tmp_path, data))
    (pre,) = records(tmp_path, "pretrain")
    path = tmp_path / "results" / "runs" / f"{pre['run_id']}.json"
    other = {**pre, "fingerprint": {**pre["fingerprint"], "losses": [v + 1.0 for v in pre["fingerprint"]["losses"]]}}
    path.write_text(json.dumps(other))  # as if another code had pretrained it
    server.run([*QUICK, "trainer.max_steps=3"], tmp_path, env(tmp_path, data))
    fresh = [r for r in records(tmp_path, "pretrain") if r["run_id"] != pre["run_id"]]
    assert len(fresh) == 1 and fresh[0]["status"] == "finished"
    (third,) = [r for r in records(tmp_path, "train") if r["config"]["trainer"]["max_steps"] == 3]
    assert third["pretraining"]["run_id"] == fresh[0]["run_id"]  # not the other code's encoder
    # an unfinished pretraining of other code is refused with one line, not continued
    cwd = tmp_path / "second"
    cwd.mkdir()
    server.run(QUICK, cwd, env(cwd, data))
    (pre2,) = records(cwd, "pretrain")
    path = cwd / "results" / "runs" / f"{pre2['run_id']}.json"
    path.write_text(json.dumps({**pre2, "status": "interrupted", "fingerprint": other["fingerprint"]}))
    for rec in records(cwd, "train"):
        (cwd / "results" / "runs" / f"{rec['run_id']}.json").unlink()
    refused = server.run(QUICK, cwd, env(cwd, data), check=False)
    assert refused.returncode == 2 and "self-pretraining" in refused.stderr and "behaves differently" in refused.stderr


@pytest.mark.slow
@pytest.mark.parametrize("point,signal", [("step:9", "TERM"), ("val:10:1", "INT")])
def test_a_graceful_stop_while_pretraining_resumes_exactly(server, data, uninterrupted, tmp_path, point, signal):
    stopped = server.run([*RESUME, *kill_at(point, "pretrain")[:2], f"+callbacks.kill.signal={signal}",
                          "+callbacks.kill.stage=pretrain"], tmp_path, env(tmp_path, data), check=False)
    assert stopped.returncode == 130 and "self-pretraining stopped by" in stopped.stderr, stopped.stderr[-3000:]
    (pre,) = records(tmp_path, "pretrain")
    assert pre["status"] == "interrupted" and not records(tmp_path, "train")
    server.run(RESUME, tmp_path, env(tmp_path, data))
    assert_same(outcome(tmp_path), uninterrupted)


def test_a_fine_tune_of_another_pretraining_code_is_trained_again(server, data, tmp_path):
    """The fine-tune's fingerprint holds its pretraining's: when the pretraining is redone by code
    that behaves differently, the same command fine-tunes anew from it (never 'already finished'),
    and the two fine-tunes' fingerprints differ in what they started from."""
    server.run(QUICK, tmp_path, env(tmp_path, data))
    (pre,) = records(tmp_path, "pretrain")
    (first,) = records(tmp_path, "train")
    assert first["fingerprint"]["pretraining"]["losses"] == pre["fingerprint"]["losses"]
    old = {**pre["fingerprint"], "losses": [v + 1.0 for v in pre["fingerprint"]["losses"]]}  # as if other code made both
    runs = tmp_path / "results" / "runs"
    (runs / f"{pre['run_id']}.json").write_text(json.dumps({**pre, "fingerprint": old}))
    (runs / f"{first['run_id']}.json").write_text(json.dumps({**first, "fingerprint": {**first["fingerprint"], "pretraining": old}}))
    again = server.run(QUICK, tmp_path, env(tmp_path, data))
    assert "already finished" not in again.stdout + again.stderr
    fine = records(tmp_path, "train")
    assert len(fine) == 2 and all(r["status"] == "finished" for r in fine)
    (second,) = [r for r in fine if r["run_id"] != first["run_id"]]
    assert second["pretraining"]["run_id"] != pre["run_id"]
    said = behaviour_difference(first["fingerprint"] | {"pretraining": old}, second["fingerprint"])
    assert said is not None and said.startswith("its self-pretraining's training loss"), said
