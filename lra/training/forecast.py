"""How long a training run will take, said early: the plan (steps, validations) at the start, an
estimate after the first timed steps, a measured forecast after the first validation, and a
step-based progress bar whose ETA includes the validations still to come.

Choices, written down:

* A step is timed from ``on_train_batch_start`` to ``on_train_batch_end`` (wall clock, data loading
  between steps excluded, like :mod:`lra.training.profiling`); the first ``skip`` steps of a (resumed) run are
  not timed (allocator growth, first-call costs). The median of the timed steps is the step cost.
* Before the first validation its cost is ESTIMATED as one third of a training step per validation
  batch (a forward pass of a backward-and-step training step, same batch size), and said to be an
  estimate; after it, the measured time of the last validation is used.
* The test pass at the end (one pass over the test set) is not in the ETA; the forecast says so.
"""
from __future__ import annotations

import logging
import statistics
import time
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import RichProgressBar
from pytorch_lightning.callbacks.progress.rich_progress import CustomTimeColumn

from lra.data.progress import human

log = logging.getLogger(__name__)
FORWARD_SHARE = 1 / 3  # forward cost / (forward + backward + optimiser step), for the first estimate


def _count(limit: int | float | None, available: int) -> int:
    """Batches a Lightning ``limit_*_batches`` setting leaves of ``available``."""
    if limit is None:
        return available
    if isinstance(limit, int) and not isinstance(limit, bool) and limit != 1:
        return min(limit, available)
    return int(available * float(limit))


def cpu_hint(protocol: str | None, accelerator: str | None) -> None:
    """Said before data preparation (which can itself take many minutes on a first run)."""
    on_cpu = accelerator == "cpu" or (accelerator in (None, "auto") and not torch.cuda.is_available())
    if on_cpu and protocol != "quick":
        log.info("training on CPU: the %s protocol takes hours to days here; for a first run try "
                 "`python run.py experiment=quick` (minutes)", protocol)


class RunForecast(pl.Callback):
    """Times steps and validations; logs the plan, an early estimate and a measured forecast."""

    def __init__(self, protocol: str | None = None, estimate_after: int = 5, skip: int = 1) -> None:
        self.protocol = protocol
        self.estimate_after = estimate_after
        self.skip = skip
        self.step_times: list[float] = []
        self.val_seconds: float | None = None
        self.max_steps = 0
        self.val_every: int | None = None
        self.val_batches = 0
        self._seen = 0
        self._t0: float | None = None
        self._val_t0: float | None = None
        self._said_estimate = False
        self._said_measured = False

    # ------------------------------------------------------------------ plan
    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.max_steps = int(trainer.max_steps or 0)
        every = trainer.val_check_batch
        self.val_every = int(every) if isinstance(every, (int, float)) and every != float("inf") else None
        dm = getattr(trainer, "datamodule", None)
        try:
            self.val_batches = _count(trainer.limit_val_batches, len(dm.val_dataloader())) if dm else 0
        except (TypeError, AttributeError, NotImplementedError):
            self.val_batches = 0
        start = trainer.global_step
        vals = self.validations_left(start)
        where = f"from step {start} " if start else ""
        log.info("plan%s: %d training steps %s(%s), %d validations of %d batches; "
                 "the expected duration follows after the first %d steps",
                 f" ({self.protocol} protocol)" if self.protocol else "", self.max_steps - start, where,
                 f"validation every {self.val_every} steps" if self.val_every else "no step-based validation",
                 vals, self.val_batches, self.estimate_after)

    def validations_left(self, step: int) -> int:
        if not self.val_every or self.max_steps <= 0:
            return 0
        return max(self.max_steps // self.val_every - step // self.val_every, 0)

    # ------------------------------------------------------------------ timing
    def on_train_batch_start(self, trainer: pl.Trainer, *args: Any) -> None:
        self._t0 = time.perf_counter()

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if self._t0 is None:
            return
        self._seen += 1
        if self._seen > self.skip:
            self.step_times.append(time.perf_counter() - self._t0)
        if len(self.step_times) >= self.estimate_after and not self._said_estimate:
            self._said_estimate = True
            log.info("expected: %s", self.describe(trainer.global_step))

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not trainer.sanity_checking and trainer.state.fn == "fit":
            self._val_t0 = time.perf_counter()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._val_t0 is None:
            return
        self.val_seconds = time.perf_counter() - self._val_t0
        self._val_t0 = None
        if not self._said_measured and self.step_times:
            self._said_measured = True
            log.info("measured: %s", self.describe(trainer.global_step))

    # ------------------------------------------------------------------ forecast
    def step_seconds(self) -> float | None:
        return statistics.median(self.step_times) if self.step_times else None

    def validation_seconds(self) -> tuple[float | None, bool]:
        """Seconds per validation and whether that is measured (else estimated from the step time)."""
        if self.val_seconds is not None:
            return self.val_seconds, True
        step = self.step_seconds()
        return (None if step is None else step * FORWARD_SHARE * self.val_batches), False

    def eta_seconds(self, step: int) -> float | None:
        per_step = self.step_seconds()
        if per_step is None:
            return None
        per_val, _ = self.validation_seconds()
        return max(self.max_steps - step, 0) * per_step + self.validations_left(step) * (per_val or 0.0)

    def describe(self, step: int) -> str:
        per_step = self.step_seconds()
        per_val, measured = self.validation_seconds()
        if per_step is None:
            return "no step timed yet"
        train = max(self.max_steps - step, 0) * per_step
        vals = self.validations_left(step)
        val = vals * (per_val or 0.0)
        return (f"{human(train + val)} left = {human(train)} training ({per_step:.2f} s/step x {self.max_steps - step} steps)"
                f" + {human(val)} validation ({vals} x {per_val or 0:.1f} s, "
                f"{'measured' if measured else 'estimated until the first validation'}); the final test pass comes on top")


class _ForecastTimeColumn(CustomTimeColumn):
    """Elapsed time and, on the training bar, the forecast's ETA (validations included)."""

    def render(self, task: Any) -> Any:
        eta = task.fields.get("eta")
        if eta is None:
            return super().render(task)
        from rich.text import Text

        elapsed = task.finished_time if task.finished else task.elapsed
        return Text(f"{human(elapsed or 0)} • eta {eta}", style=self.style)


class StepProgressBar(RichProgressBar):
    """Lightning's rich bar counted in optimiser steps (``412/5000``, no ``Epoch 0/-2`` from
    ``max_epochs=-1``), with the ETA of :class:`RunForecast` (validations included)."""

    def __init__(self, forecast: RunForecast, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.forecast = forecast

    @property
    def total_train_batches(self) -> int | float:
        steps = self.trainer.max_steps
        return steps if steps and steps > 0 else super().total_train_batches

    def _get_train_description(self, current_epoch: int) -> str:
        return f"{'Step':{len(self.validation_description)}}"

    def configure_columns(self, trainer: pl.Trainer) -> list:
        columns = super().configure_columns(trainer)
        return [_ForecastTimeColumn(style=c.style) if isinstance(c, CustomTimeColumn) else c for c in columns]

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        super().on_train_epoch_start(trainer, pl_module)
        self._show(trainer)

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, outputs: Any, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        self._show(trainer)

    def _show(self, trainer: pl.Trainer) -> None:
        if self.progress is None or self.train_progress_bar_id is None or not self.is_enabled:
            return
        eta = self.forecast.eta_seconds(trainer.global_step)
        self.progress.update(self.train_progress_bar_id, completed=trainer.global_step,
                             eta="…" if eta is None else human(eta))
        self.refresh()
