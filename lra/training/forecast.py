"""How long a training run will take, said early: the plan (steps, validations) at the start, an
estimate after the first timed steps, a measured forecast after the first validation, and a
step-based progress bar whose ETA includes the validations still to come.

Choices, written down:

* A step is timed from the end of the one before (or of the validation before) to its own
  ``on_train_batch_end``: the wall clock it costs the run, data loading, logging, checkpoint writes
  and callbacks included, the validations not (they are priced apart). Timing only the forward and
  backward, as :mod:`lra.training.profiling` does for throughput, put the quick protocol's first
  forecast at half the time the run took (5.2 s forecast, 9.6 s taken, softmax ListOps on one CPU
  thread, 2026-12-01). The first ``skip`` steps of a (resumed) run are not timed (allocator growth,
  first-call costs). The median of the timed steps is the step cost.
* Before the first validation its cost is ESTIMATED, and said to be an estimate: ``FORWARD_SHARE``
  of a training step per training batch's worth of positions the validation computes
  (``eval_share`` of the datamodule, whose evaluation batches are cut to their longest real token;
  one per validation batch where a datamodule cannot say). After it, the measured time of the last
  validation is used. The share counts positions, so for quadratic attention, whose cost falls
  faster than the width, the estimate stays high. Counting full batches at a third of a step put
  ListOps validations at 3x their measured time (29.0 s against 9.9 s, 35.5 against 11.5).
  A resumed run estimates from its checkpoint instead: the last validation's cost in training
  steps measured before the resume (``val_steps``; a ratio, so it carries to another machine
  better than seconds would: memformer's ListOps validation cost 9.7 steps on an AMD EPYC, 11.0
  on an Intel Xeon).
  Without it, ListOps resumes put clustered's validations at 14.1 s against 32.9 s measured,
  routing's at 14.0 s against 22.7 s.
* The test pass at the end (one pass over the test set) is not in the ETA; the forecast says so.
* The step cost is the median of the last ``STEP_WINDOW`` timed steps, not of all of them: it
  follows a change of load or machine, and the ETA the progress bar asks for after every step costs
  the same at step 60,000 as at step 10 (a median over every step sorted a growing list each step).
* The run's wall clock is checkpointed (``state_dict``): a run resumed, here or on another machine,
  records one *segment* per stretch of training (steps from..to, active seconds, the machine and the
  code's commit: a run resumed on newer code says so; the 1-minute load average at each validation,
  since on a shared CPU the time says little without it), so
  ``efficiency.wall`` in the record says how long the run took in all, where, and what the first
  measured forecast of the run and of each segment had said (a segment's, made at its first
  validation, is ``forecast_elapsed_s`` in plus ``forecast_s`` to go; before 2026-11-30 segments
  kept only ``forecast_s``, the rest from their first validation). Time after a segment's last
  checkpoint is redone by the resume, so it is not counted. The test pass is timed on its own
  (``test_s``).
"""
from __future__ import annotations

import logging
import os
import socket
import statistics
import time
from collections import deque
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import RichProgressBar
from pytorch_lightning.callbacks.progress.rich_progress import CustomTimeColumn

from lra.data.progress import human
from lra.stamp import code_version, cpu_model

log = logging.getLogger(__name__)
FORWARD_SHARE = 1 / 4  # an evaluation forward (no autograd) / a training step, same positions. Measured on one CPU
# thread, ListOps xiong2021: 0.21 (nystromformer), 0.22 (linear_unnormalised); from issue 33's figures 0.26 (adamra), 0.28 (linear);
# the textbook 1/3 (backward = 2 forwards) leaves out what no_grad saves. Not every variant: bigbird's is about 0.44
# (its first validation took 40.9 s where this estimated 18.2 s); the first measured validation replaces the estimate.
STEP_WINDOW = 200  # timed steps the step cost is the median of


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
        self.step_times: deque[float] = deque(maxlen=STEP_WINDOW)
        self.val_seconds: float | None = None
        self.val_steps: float | None = None  # the last validation's cost in training steps (checkpointed)
        self.segments: list[dict[str, Any]] = []  # earlier stretches of this run (from its checkpoint)
        self.first_forecast: dict[str, Any] | None = None
        self.test_seconds: float | None = None
        self._segment: dict[str, Any] | None = None  # the stretch training now
        self._segment_t0: float | None = None
        self._fit_over = False
        self._test_t0: float | None = None
        self.max_steps = 0
        self.val_every: int | None = None
        self.val_batches = 0
        self.val_share: float | None = None  # training batches' worth of positions per validation
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
            # the loader first: a datamodule may apply (and pin) a fractional limit itself
            available = len(dm.val_dataloader()) if dm else 0
            self.val_batches = _count(trainer.limit_val_batches, available)
        except (TypeError, AttributeError, NotImplementedError):
            self.val_batches = 0
        self.val_share = dm.eval_share("val") if self.val_batches and hasattr(dm, "eval_share") else None
        start = trainer.global_step
        self._segment = {"from_step": start, "to_step": start, "seconds": 0.0,
                         "forecast_s": None, "forecast_at_step": None, "forecast_elapsed_s": None,
                         "host": socket.gethostname(), "cpu": cpu_model(), "device": _device_name(pl_module),
                         "threads": torch.get_num_threads(), **code_version(),
                         "cpu_count": os.cpu_count(), "load_samples": 0, "load_mean": 0.0,
                         "load_max": 0.0}
        self._segment_t0 = time.perf_counter()
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
        if self._t0 is None:  # the first step of a stretch: from its own start
            self._t0 = time.perf_counter()

    def on_train_batch_end(self, trainer: pl.Trainer, *args: Any) -> None:
        if self._segment is not None:
            self._segment["to_step"] = trainer.global_step
        if self._t0 is None:
            return
        self._seen += 1
        now = time.perf_counter()
        if self._seen > self.skip:
            self.step_times.append(now - self._t0)
        self._t0 = now  # the next step's time starts here: loading its batch is part of it
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
        self._t0 = time.perf_counter() if self._t0 is not None else None  # the validation is not the next step's
        step = self.step_seconds()
        if step:
            self.val_steps = self.val_seconds / step
        if self._segment is not None:  # mean and max over the validations (a record of bounded size)
            load, seg = _load(), self._segment
            seg["load_samples"] += 1
            seg["load_mean"] += (load - seg["load_mean"]) / seg["load_samples"]
            seg["load_max"] = max(seg["load_max"], load)
        if not self._said_measured and self.step_times:
            self._said_measured = True
            log.info("measured: %s", self.describe(trainer.global_step))
            self._keep_forecast(trainer.global_step)

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.segments = self.wall_segments()
        self._segment = self._segment_t0 = None

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        # before Lightning restores callbacks from the checkpoint the test loads (the best one, an
        # older state): it must not replace this run's clock. A run resumed at its last step runs
        # no training hook at all, so the end of fit cannot say it.
        self._fit_over = stage != "fit"

    def on_test_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._test_t0 = time.perf_counter()

    def on_test_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if self._test_t0 is not None:
            self.test_seconds = time.perf_counter() - self._test_t0

    # ------------------------------------------------------------------ wall clock (checkpointed)
    def wall_segments(self) -> list[dict[str, Any]]:
        """Every stretch of this run so far, the current one up to now."""
        if self._segment is None or self._segment_t0 is None:
            return list(self.segments)
        return [*self.segments, {**self._segment, "seconds": time.perf_counter() - self._segment_t0}]

    def _keep_forecast(self, step: int) -> None:
        """The first measured forecast of the segment (and of the run), to hold against the time taken:
        the segment's forecast total is ``forecast_elapsed_s + forecast_s`` (the time it had run when
        the forecast was made, at ``forecast_at_step``, and the rest)."""
        eta = self.eta_seconds(step)
        if eta is None or self._segment is None or self._segment_t0 is None:
            return
        self._segment.update(forecast_s=eta, forecast_at_step=step,
                             forecast_elapsed_s=time.perf_counter() - self._segment_t0)
        if self.first_forecast is None:
            elapsed = sum(s["seconds"] for s in self.wall_segments())
            self.first_forecast = {"at_step": step, "elapsed_s": elapsed, "eta_s": eta, "total_s": elapsed + eta}

    def state_dict(self) -> dict[str, Any]:
        return {"segments": self.wall_segments(), "first_forecast": self.first_forecast, "val_steps": self.val_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self._fit_over:  # Lightning restores callbacks from the best checkpoint the test loads
            return
        self.segments = [dict(s) for s in state.get("segments", [])]
        self.first_forecast = state.get("first_forecast")
        self.val_steps = state.get("val_steps")  # absent from checkpoints written before 2026-11-30

    def record_fields(self) -> dict[str, Any]:
        segments = self.wall_segments()
        return {"wall": {
            "segments": segments, "train_s": sum(s["seconds"] for s in segments) if segments else None,
            "test_s": self.test_seconds, "first_forecast": self.first_forecast,
            "note": "active seconds of fit (training and validations) per stretch between resumes; "
                    "the test pass apart",
        }}

    # ------------------------------------------------------------------ forecast
    def step_seconds(self) -> float | None:
        return statistics.median(self.step_times) if self.step_times else None

    def validation_seconds(self) -> tuple[float | None, str]:
        """Seconds per validation and where that figure comes from (printed with the forecast)."""
        if self.val_seconds is not None:
            return self.val_seconds, "measured"
        step = self.step_seconds()
        if step is None:
            return None, "not yet estimated"
        if self.val_steps is not None:
            return (step * self.val_steps,
                    f"estimated as {self.val_steps:.1f} steps each, measured before the resume, until the first validation")
        share = self.val_batches if self.val_share is None else self.val_share
        return step * FORWARD_SHARE * share, "estimated until the first validation"

    def eta_seconds(self, step: int) -> float | None:
        per_step = self.step_seconds()
        if per_step is None:
            return None
        per_val, _ = self.validation_seconds()
        return max(self.max_steps - step, 0) * per_step + self.validations_left(step) * (per_val or 0.0)

    def describe(self, step: int) -> str:
        per_step = self.step_seconds()
        per_val, source = self.validation_seconds()
        if per_step is None:
            return "no step timed yet"
        train = max(self.max_steps - step, 0) * per_step
        vals = self.validations_left(step)
        val = vals * (per_val or 0.0)
        return (f"{human(train + val)} left = {human(train)} training ({per_step:.2f} s/step x {self.max_steps - step} steps)"
                f" + {human(val)} validation ({vals} x {per_val or 0:.1f} s, {source}); the final test pass comes on top")


def _load() -> float:
    """The machine's 1-minute load average (NaN where the platform has none)."""
    try:
        return os.getloadavg()[0]
    except OSError:
        return float("nan")


def _device_name(pl_module: pl.LightningModule) -> str:
    device = pl_module.device
    return torch.cuda.get_device_name(device) if device.type == "cuda" else device.type


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
