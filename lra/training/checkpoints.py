"""Checkpoints a killed run can resume from exactly, whatever the moment it was killed.

Why a callback of our own rather than ``ModelCheckpoint(every_n_train_steps=..., save_last=True)``:
Lightning writes such a checkpoint in ``on_train_batch_end``, *before* the validation that follows
that step. Resuming from it, Lightning fast-forwards over that validation (it takes a checkpoint
written at the end of a training batch to mean "validation already done"): the learning curve loses
a point and, when that validation would have been the best, the run tests another checkpoint. That
was the cause of the flaky resume test (issue 23: resuming from step 10 of a 40-step run tested
step 20's weights). So ``last.ckpt`` is only ever written at a point from which Lightning resumes
exactly:

* after a training step that no validation follows (``on_train_batch_end``), or
* after a validation, once the best-checkpoint callback has recorded it (``on_validation_end``;
  being a :class:`~pytorch_lightning.callbacks.Checkpoint`, this callback runs after
  ``ModelCheckpoint``, and Lightning resumes from there without repeating the validation).

A save that falls due at a step a validation follows is deferred until that validation ends.
Lightning's resume can set its loggers' step one off (after a stop at its SIGTERM exit, and at the
end of training): :meth:`LastCheckpoint.on_load_checkpoint` puts it back.
The best-validation checkpoint is :class:`BestCheckpoint`: its state follows its folder, so a run
resumed from a folder moved to another path (a checkpoint committed here, resumed in another clone)
keeps its best so far.
Every checkpoint file (``last.ckpt`` and ``best-*.ckpt``) is written by :class:`AtomicCheckpointIO`:
a temporary sibling, fsync, rename, so a kill during a write leaves the previous file intact.
"""
from __future__ import annotations

import io
import os
import time
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Checkpoint, ModelCheckpoint
from pytorch_lightning.plugins.io import TorchCheckpointIO

from lra.files import write_bytes

LAST = "last.ckpt"


class AtomicCheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint IO with the temporary file next to the target: Lightning's own goes
    through a temporary file in the system temp dir and ``shutil.move``, which is a copy (not atomic)
    when the checkpoint dir is on another filesystem, as shared cluster storage usually is."""

    def save_checkpoint(self, checkpoint: dict[str, Any], path: Any, storage_options: Any | None = None) -> None:
        if storage_options is not None:
            raise TypeError("AtomicCheckpointIO takes no storage_options")
        buffer = io.BytesIO()
        torch.save(checkpoint, buffer)
        write_bytes(Path(path), buffer.getbuffer())


class BestCheckpoint(ModelCheckpoint):
    """Lightning's ``ModelCheckpoint`` whose restored state follows the folder it now lives in.

    Lightning restores the best score only when the checkpoint folder's path is unchanged, and keeps
    pointing the best at the old path otherwise: a run resumed in another clone, or after its
    folder was moved, forgets its best (the next validation becomes the best: a seam in the result)
    and tests a file that is not there. Paths under the old folder are rebased onto the new one;
    the files themselves moved with the folder."""

    @property
    def state_key(self) -> str:
        # Lightning's own key: checkpoints written with ModelCheckpoint resume into this class and back
        return super().state_key.replace(type(self).__qualname__, ModelCheckpoint.__qualname__, 1)

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        old = state_dict.get("dirpath")
        if old and self.dirpath and os.path.normpath(str(old)) != os.path.normpath(str(self.dirpath)):
            state_dict = _rebased(state_dict, str(old), str(self.dirpath))
        super().load_state_dict(state_dict)


def _rebased(state: dict[str, Any], old: str, new: str) -> dict[str, Any]:
    def move(path: Any) -> Any:
        if not path or os.path.normpath(os.path.dirname(str(path))) != os.path.normpath(old):
            return path  # empty, or not under the folder (left as it was)
        return os.path.join(new, os.path.basename(str(path)))

    out = dict(state, dirpath=new)
    for key in ("best_model_path", "kth_best_model_path", "last_model_path"):
        if key in out:
            out[key] = move(out[key])
    if isinstance(out.get("best_k_models"), dict):
        out["best_k_models"] = {move(k): v for k, v in out["best_k_models"].items()}
    return out


def validates_next(trainer: pl.Trainer) -> bool:
    """Whether Lightning runs a validation right after the current training batch (its own rule).

    If the rule cannot be read (another Lightning version) the answer is True: a save is then
    deferred to the next safe point, which costs at most one step, never exactness."""
    loop = trainer.fit_loop
    fetcher = getattr(loop, "_data_fetcher", None)
    try:
        return bool(fetcher is not None and loop.epoch_loop._should_check_val_fx(fetcher))
    except AttributeError:
        return True


def best_checkpoint(trainer: pl.Trainer) -> ModelCheckpoint | None:
    """The callback that keeps the best-validation checkpoint (monitors a metric), if configured."""
    return next((c for c in trainer.callbacks if isinstance(c, ModelCheckpoint) and c.monitor), None)


class LastCheckpoint(Checkpoint):
    """Writes ``<dirpath>/last.ckpt`` every ``every_n_steps`` optimiser steps and/or every
    ``every_minutes``, only at points a resume reproduces exactly (see the module docstring).
    :meth:`save_now` is the same write for a graceful stop."""

    def __init__(self, dirpath: str | Path, every_n_steps: int | None = None, every_minutes: float | None = None) -> None:
        self.dirpath = Path(dirpath)
        self.every_n_steps = every_n_steps or None
        self.every_s = every_minutes * 60.0 if every_minutes else None
        self.pending = False  # a save fell due at a step a validation follows
        self.saved_step: int | None = None
        self._last_time = time.monotonic()
        self._restored = False

    @property
    def path(self) -> Path:
        return self.dirpath / LAST

    def _due(self, trainer: pl.Trainer) -> bool:
        step = trainer.global_step
        due = bool(self.every_n_steps and step % self.every_n_steps == 0)
        if self.every_s is not None and not due:
            # every rank must take the same decision (the save is collective): rank 0's clock decides
            due = bool(trainer.strategy.broadcast(time.monotonic() - self._last_time >= self.every_s))
        return due

    def save_now(self, trainer: pl.Trainer) -> None:
        trainer.save_checkpoint(self.path, weights_only=False)  # said, so Lightning does not log that it defaulted
        self.saved_step, self.pending = trainer.global_step, False
        self._last_time = time.monotonic()

    def on_load_checkpoint(self, trainer: pl.Trainer, pl_module: pl.LightningModule, checkpoint: dict[str, Any]) -> None:
        """Lightning's resume re-derives the step its loggers write (``_batches_that_stepped``) from the
        loop state the checkpoint was saved in, and gets it one off in two places: too high after a save at
        its SIGTERM exit after a validation (every later metric landed one step late, and the training loss
        was logged for other steps), too low for a run resumed after its last validation (it only tests,
        and logged the test a step early). Between training steps the count equals ``global_step``, one
        per optimiser step: it is set so before the first batch, or the test, that follows the restore."""
        self._restored = True

    def _realign_logger_step(self, trainer: pl.Trainer) -> None:
        if self._restored:
            self._restored = False
            trainer.fit_loop.epoch_loop._batches_that_stepped = trainer.global_step

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        self._realign_logger_step(trainer)

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._realign_logger_step(trainer)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if not (self.pending or self._due(trainer)) or self.saved_step == trainer.global_step:
            return
        if validates_next(trainer):
            self.pending = True  # written once that validation has ended
        else:
            self.save_now(trainer)

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.pending and not trainer.sanity_checking and trainer.state.fn == "fit":
            self.save_now(trainer)
