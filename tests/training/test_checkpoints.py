"""``last.ckpt`` is written only where a resume is exact, and every checkpoint file atomically
(the end-to-end proof is tests/training/test_resume.py; these are the rules, fast)."""
from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from lra.training.checkpoints import AtomicCheckpointIO, LastCheckpoint
from tests.training.test_run_identity import fake_trainer


def test_last_checkpoint_waits_for_the_validation_a_due_step_is_followed_by(tmp_path):
    last = LastCheckpoint(tmp_path, every_n_steps=5)
    for step, validates in ((4, False), (5, False), (10, True)):
        trainer = fake_trainer(step, validates_next=validates)
        last.on_train_batch_end(trainer, None)
        assert trainer.saved == ([(str(tmp_path / "last.ckpt"), 5)] if step == 5 else [])
    trainer.sanity_checking, trainer.state = False, SimpleNamespace(fn="fit")
    last.on_validation_end(trainer, None)  # the deferred save, once the validation has ended
    assert trainer.saved == [(str(tmp_path / "last.ckpt"), 10)] and not last.pending


def test_checkpoint_files_are_replaced_atomically_from_a_sibling(tmp_path, monkeypatch):
    """The temporary file is in the target's folder (a rename there is atomic; Lightning's own goes
    through the system temp dir, a copy when the checkpoint dir is another filesystem), and a
    failed write leaves the previous checkpoint as it was."""
    target = tmp_path / "run" / "last.ckpt"
    io = AtomicCheckpointIO()
    io.save_checkpoint({"step": 1}, target)
    renames = []
    real_replace = os.replace
    monkeypatch.setattr(os, "replace", lambda src, dst: (renames.append((Path(src), Path(dst))), real_replace(src, dst)))
    io.save_checkpoint({"step": 2}, target)
    ((src, dst),) = renames
    assert dst == target and src.parent == target.parent and src != target
    assert torch.load(target, weights_only=False) == {"step": 2}

    class Unpicklable:
        def __reduce__(self):
            raise RuntimeError("disk full")

    with pytest.raises(RuntimeError, match="disk full"):
        io.save_checkpoint({"step": 3, "bad": Unpicklable()}, target)
    assert torch.load(target, weights_only=False) == {"step": 2}
    assert sorted(p.name for p in target.parent.iterdir()) == ["last.ckpt"]  # no temporary left behind


def test_best_checkpoint_state_follows_its_folder_and_keeps_lightnings_key(tmp_path):
    """Checkpoints written by Lightning's ModelCheckpoint (runs before BestCheckpoint) resume into it,
    and a state saved under another folder path is rebased onto the folder the run now uses."""
    from pytorch_lightning.callbacks import ModelCheckpoint

    from lra.training.checkpoints import BestCheckpoint

    settings = {"monitor": "val/acc", "mode": "max", "filename": "best-{step}"}
    assert BestCheckpoint(**settings).state_key == ModelCheckpoint(**settings).state_key
    old, new = "/elsewhere/checkpoints/run-1", str(tmp_path / "checkpoints" / "run-1")
    saved = ModelCheckpoint(**settings)
    saved.dirpath, saved.best_model_score = old, torch.tensor(0.4)
    saved.best_model_path = saved.kth_best_model_path = f"{old}/best-20.ckpt"
    saved.best_k_models, saved.kth_value = {f"{old}/best-20.ckpt": torch.tensor(0.4)}, torch.tensor(0.4)
    resumed = BestCheckpoint(**settings)
    resumed.dirpath = new
    resumed.load_state_dict(saved.state_dict())
    assert resumed.best_model_score == 0.4  # Lightning's own drops it when the folder moved
    assert resumed.best_model_path == resumed.kth_best_model_path == f"{new}/best-20.ckpt"
    assert list(resumed.best_k_models) == [f"{new}/best-20.ckpt"]
    same = BestCheckpoint(**settings)
    same.dirpath = old
    same.load_state_dict(saved.state_dict())
    assert same.best_model_path == f"{old}/best-20.ckpt" and same.best_model_score == 0.4


class Clock:
    """``time.monotonic`` of lra.training.checkpoints, set by the test (no sleeps)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def timed_trainer(step: int) -> SimpleNamespace:
    trainer = fake_trainer(step)
    trainer.strategy = SimpleNamespace(broadcast=lambda value: value)
    return trainer


def test_every_minutes_counts_from_the_last_save_whoever_made_it(tmp_path, monkeypatch):
    """A timed save, and a save forced by a stop (save_now), both restart the every-minutes clock:
    otherwise, after the first timed save, every later step would write a checkpoint."""
    clock = Clock()
    monkeypatch.setattr("lra.training.checkpoints.time.monotonic", clock)
    last = LastCheckpoint(tmp_path, every_minutes=1)
    saved = []
    for step, seconds in ((1, 30), (2, 61), (3, 62), (4, 100), (5, 122)):
        clock.now = 1000.0 + seconds
        trainer = timed_trainer(step)
        last.on_train_batch_end(trainer, None)
        saved += [s for _, s in trainer.saved]
    assert saved == [2, 5]                       # at 61 s, then 61 s later: not at every step after the first
    clock.now = 1200.0
    last.save_now(timed_trainer(6))              # a graceful stop's save
    for step, seconds in ((7, 1230), (8, 1259)):
        clock.now = seconds
        trainer = timed_trainer(step)
        last.on_train_batch_end(trainer, None)
        assert trainer.saved == [], f"step {step}: saved {seconds - 1200:.0f} s after the stop's save"


def test_an_unreadable_validation_schedule_defers_the_save(tmp_path):
    """When Lightning's schedule cannot be read (another version: no ``_should_check_val_fx``), a due
    save is deferred as if a validation followed: saved before a validation, a resumed run would skip it."""
    from lra.training.checkpoints import validates_next

    trainer = fake_trainer(5)
    trainer.fit_loop.epoch_loop = SimpleNamespace()  # the rule is not there
    assert validates_next(trainer) is True
    last = LastCheckpoint(tmp_path, every_n_steps=5)
    last.on_train_batch_end(trainer, None)
    assert trainer.saved == [] and last.pending
