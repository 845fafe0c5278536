"""A test-only callback with which a run stops itself at a chosen point, so that kill-and-resume
tests are deterministic (no polling for a file, no timed signal from outside).

Added to a run on the command line; callbacks are not part of a run's identity, so the same command
without it resumes the killed run::

    python run.py ... +callbacks.kill._target_=tests.killpoints.KillAt +callbacks.kill.at=save:3

Points (``at``):

* ``save:K``      right after the K-th checkpoint file (``last.ckpt`` or ``best-*.ckpt``) is written
* ``step:S``      in the middle of training step S (after its backward, before the optimiser step)
* ``val:S:J``     in the middle of the validation after step S, after its J-th batch (from 1)
* ``val_end:S``   as the validation after step S ends (after its last batch, in ``on_validation_end``)
* ``after_val:S`` after step S and its validation have ended, before step S+1 starts
* ``test:J``      in the middle of the test pass, after its J-th batch (from 1)

``stage`` (optional) limits the point to one stage of a self-pretrained run (``+pretrain=...``):
``pretrain`` (the pretraining stage) or ``train`` (the fine-tune); unset, the first stage to reach it.

``signal`` is what the run sends itself there: ``KILL`` (default), ``TERM``, ``INT`` or ``INT2``
(two Ctrl-C presses in a row). :class:`PauseAt` instead holds the run there until the test lets it go
(for tests in which a second process acts while the first is at a known point).
"""
from __future__ import annotations

import os
import signal as signals
from pathlib import Path
from typing import Any

import pytorch_lightning as pl

POINTS = ("save", "step", "val", "val_end", "after_val", "test")


class AtPoint(pl.Callback):
    """Calls :meth:`act` once, at the point ``at``."""

    def __init__(self, at: str, stage: str | None = None) -> None:
        kind, *numbers = str(at).split(":")
        if kind not in POINTS:
            raise ValueError(f"unknown point {at!r}; valid kinds: {POINTS}")
        if stage not in (None, "pretrain", "train"):
            raise ValueError(f"unknown stage {stage!r}; valid: pretrain, train")
        self.kind, self.numbers, self.stage = kind, tuple(int(n) for n in numbers), stage
        self.saves = 0
        self.fired = False

    def act(self) -> None:
        raise NotImplementedError

    def _fire(self) -> None:
        if not self.fired:
            self.fired = True
            self.act()

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        pretraining = hasattr(pl_module, "mask_ratio")  # models.pretraining.MaskedLMModule
        if self.stage is not None and self.stage != ("pretrain" if pretraining else "train"):
            self.fired = True  # another stage's trainer: never fires here
            return
        if self.kind != "save":
            return
        save = trainer.save_checkpoint

        def save_then_act(*args: Any, **kwargs: Any) -> None:
            save(*args, **kwargs)
            self.saves += 1
            if self.saves == self.numbers[0]:
                self._fire()

        trainer.save_checkpoint = save_then_act

    def on_before_optimizer_step(self, trainer: pl.Trainer, *args: Any) -> None:
        if self.kind == "step" and trainer.global_step + 1 == self.numbers[0]:
            self._fire()

    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                                batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        if self.kind == "val" and not trainer.sanity_checking and (trainer.global_step, batch_idx + 1) == self.numbers:
            self._fire()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self.kind == "val_end" and not trainer.sanity_checking and trainer.global_step == self.numbers[0]:
            self._fire()

    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        if self.kind == "after_val" and trainer.global_step == self.numbers[0]:
            self._fire()

    def on_test_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any,
                          batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        if self.kind == "test" and batch_idx + 1 == self.numbers[0]:
            self._fire()


class KillAt(AtPoint):
    def __init__(self, at: str, signal: str = "KILL", stage: str | None = None) -> None:
        super().__init__(at, stage)
        if signal not in ("KILL", "TERM", "INT", "INT2"):
            raise ValueError(f"unknown signal {signal!r}")
        self.signal = signal

    def act(self) -> None:
        if self.signal == "KILL":
            os.kill(os.getpid(), signals.SIGKILL)
        for _ in range(2 if self.signal == "INT2" else 1):
            os.kill(os.getpid(), signals.SIGINT if self.signal.startswith("INT") else signals.SIGTERM)


class PauseAt(AtPoint):
    """At the point, writes a line to the FIFO ``<until>.paused`` and blocks reading the FIFO
    ``until``: both are blocking opens, so the test and the run meet without polling or timeouts
    (:func:`pause_fifos` makes the pair)."""

    def __init__(self, at: str, until: str, stage: str | None = None) -> None:
        super().__init__(at, stage)
        self.until = Path(until)

    def act(self) -> None:
        with open(f"{self.until}.paused", "w") as paused:
            paused.write("paused\n")
        with open(self.until) as release:
            release.read()


def pause_fifos(until: Path) -> None:
    os.mkfifo(until)
    os.mkfifo(f"{until}.paused")


def signal_during_data_build() -> None:
    """A run-server hook (see :class:`tests.forkrun.RunServer`): SIGTERM arrives while the dataset
    is being built, before any model or trainer exists."""
    import lra.data.datamodule as datamodule

    real = datamodule.build_once

    def build_once(target: Any, build: Any, settings: Any) -> Any:
        def interrupted(directory: Any) -> None:
            os.kill(os.getpid(), signals.SIGTERM)
            build(directory)

        return real(target, interrupted, settings)

    datamodule.build_once = build_once
