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
