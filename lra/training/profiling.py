"""Profiling callbacks (on by default, ``conf/callbacks/default.yaml``): throughput, peak memory and
parameter counts of a run. Each exposes ``record_fields()``, which :mod:`lra.training.train` merges into the
run record's ``efficiency`` block, and logs its figures to the run's loggers and the Python logger.

Choices, written down:

* A training step is timed from ``on_train_batch_start`` to ``on_train_batch_end``: forward, loss,
  backward and optimiser step; data loading and host-to-device copies happen before the first hook
  and are excluded. The device is synchronised at both ends, so asynchronous CUDA work is counted in
  the step that issued it. The first ``warmup_steps`` steps (allocator growth, kernel selection)
  are not timed; validation and test skip their first ``eval_warmup_batches`` batches in the same way.
* ``tokens_per_s`` counts REAL tokens (``mask`` True) and ``padded_tokens_per_s`` every position
  (``B x N``, both documents of retrieval pairs); examples are labels. Token counts are accumulated
  as device tensors and read once per phase, so the hooks add no extra device sync.
* The callbacks' own cost is measured: the time spent inside the throughput hooks outside the timed
  region, per step, as a percentage of the step time (``overhead``). Memory and parameter hooks run
  only at phase boundaries.
* A resumed run reports the whole run, as the uninterrupted run does: the checkpoint carries the
  training and validation counts and the peaks of earlier stretches, and each block says from which
  step it covers (``from_step``). Each stretch skips its own warm-up (a new process warms up again).
  Rates from another device, CPU model or thread count are not summed: the figures then start at the
  resume, and ``from_step`` says so. The test pass and the ``*_start_mb`` figures are this invocation's.
* Memory: see :mod:`lra.footprint`. Validation interrupting training is handled: the training peak is
  read before validation resets the high-water mark, and training resumes with a fresh mark.
"""
from __future__ import annotations

import logging
import time
from typing import Any

import pytorch_lightning as pl
import torch

from lra.footprint import PeakMemory, count_parameters
from lra.stamp import cpu_model

log = logging.getLogger(__name__)
PHASES = ("train", "val", "test")
TOKEN_NOTE = "tokens_per_s counts real tokens (mask True); padded_tokens_per_s counts all B x N positions"


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _log_metrics(trainer: pl.Trainer, metrics: dict[str, float]) -> None:
    clean = {k: float(v) for k, v in metrics.items() if v is not None}
    for logger in trainer.loggers:
        logger.log_metrics(clean, step=trainer.global_step)


def _machine(pl_module: pl.LightningModule) -> str:
    """What a rate depends on: rates from another device, CPU model or thread count are not summed."""
    device = pl_module.device
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else cpu_model()
    return f"{device.type}: {name}, {torch.get_num_threads()} threads"


class _Meter:
    """Accumulates one phase's timed batches."""

    def __init__(self) -> None:
        self.seen = 0          # batches that reached the start hook (warm-up included), over the run
        self.here = 0          # the same, in this process (not checkpointed)
        self.steps = 0         # timed batches
        self.seconds = 0.0
        self.examples = 0
        self.padded = 0
        self.tokens: torch.Tensor | int = 0
        self.t0: float | None = None

    COUNTS = ("seen", "steps", "seconds", "examples", "padded")

    def state(self) -> dict[str, float]:
        tokens = float(self.tokens.item()) if isinstance(self.tokens, torch.Tensor) else float(self.tokens)
        return {**{k: getattr(self, k) for k in self.COUNTS}, "tokens": tokens}

    def add(self, state: dict[str, float]) -> None:
        """Counts of an earlier stretch of the run (from its checkpoint)."""
        for k in self.COUNTS:
            setattr(self, k, getattr(self, k) + type(getattr(self, k))(state[k]))
        self.tokens = self.tokens + state["tokens"]

    def summary(self, per: str) -> dict[str, Any]:
        plural = per + ("es" if per == "batch" else "s")
        out: dict[str, Any] = {f"timed_{plural}": self.steps, f"warmup_{plural}": self.seen - self.steps}
        if self.steps == 0 or self.seconds <= 0:
            return out | {"examples_per_s": None, "tokens_per_s": None, "padded_tokens_per_s": None,
                          f"ms_per_{per}": None}
        tokens = float(self.tokens) if not isinstance(self.tokens, torch.Tensor) else float(self.tokens.item())
        return out | {
            "examples_per_s": self.examples / self.seconds,
            "tokens_per_s": tokens / self.seconds,
            "padded_tokens_per_s": self.padded / self.seconds,
            f"ms_per_{per}": 1000.0 * self.seconds / self.steps,
        }


class ThroughputMonitor(pl.Callback):
    def __init__(self, warmup_steps: int = 5, eval_warmup_batches: int = 1) -> None:
        if warmup_steps < 0 or eval_warmup_batches < 0:
            raise ValueError("callbacks.throughput: warmup_steps and eval_warmup_batches must be >= 0")
        self.warmup = {"train": warmup_steps, "val": eval_warmup_batches, "test": eval_warmup_batches}
        self.meters = {p: _Meter() for p in PHASES}
        self.overhead_s = 0.0
        self.earlier: dict[str, Any] = {}  # from the checkpoint, added to the meters as fit starts
        self.from_step: int | None = None
        self.machine: str | None = None

    # -- shared hook bodies -------------------------------------------------------------------
    def _start(self, phase: str, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        h0 = time.perf_counter()
        if trainer.sanity_checking:
            return
        meter = self.meters[phase]
        meter.seen += 1
        meter.here += 1
        if meter.here > self.warmup[phase]:  # each process warms up again
            _sync(pl_module.device)
            meter.t0 = time.perf_counter()
            self.overhead_s += meter.t0 - h0

    def _end(self, phase: str, pl_module: pl.LightningModule, batch: Any) -> None:
        meter = self.meters[phase]
        if meter.t0 is None:
            return
        _sync(pl_module.device)
        t1 = time.perf_counter()
        meter.seconds += t1 - meter.t0
        meter.steps += 1
        meter.t0 = None
        if isinstance(batch, dict) and "mask" in batch:
            mask = batch["mask"]
            meter.examples += int(batch["label"].shape[0]) if "label" in batch else int(mask.shape[0])
            meter.padded += mask.numel()
            meter.tokens = meter.tokens + mask.sum()
        self.overhead_s += time.perf_counter() - t1

    def _report(self, phase: str, trainer: pl.Trainer) -> None:
        fields = self.phase_fields(phase)
        _log_metrics(trainer, {f"profile/{phase}_{k}": v for k, v in fields.items()})
        if fields.get("examples_per_s") is not None:
            per = "step" if phase == "train" else "batch"
            plural = "steps" if phase == "train" else "batches"
            log.info("%s throughput: %.1f examples/s, %.0f real tokens/s, %.2f ms/%s over %d timed %s",
                     phase, fields["examples_per_s"], fields["tokens_per_s"], fields[f"ms_per_{per}"], per,
                     fields[f"timed_{plural}"], plural)

    # -- Lightning hooks ----------------------------------------------------------------------
    def on_fit_start(self, trainer, pl_module) -> None:
        # after Lightning restored the callbacks' state (not yet the step), also where no step is left to run
        self.machine = _machine(pl_module)
        earlier, self.earlier = self.earlier, {}
        if earlier and earlier.get("machine") == self.machine:
            for phase in ("train", "val"):
                self.meters[phase].add(earlier[phase])
            self.overhead_s += earlier["overhead_s"]
            self.from_step = earlier["from_step"]

    def state_dict(self) -> dict[str, Any]:
        return {"from_step": self.from_step, "machine": self.machine, "overhead_s": self.overhead_s,
                **{p: self.meters[p].state() for p in ("train", "val")}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.earlier = dict(state)  # used as fit starts: the checkpoint a test restores is never added

    def on_train_start(self, trainer, pl_module) -> None:
        if self.from_step is None:  # nothing (comparable) carried over: figures start here
            self.from_step = trainer.global_step

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self._start("train", trainer, pl_module)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self._end("train", pl_module, batch)

    def on_validation_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self._start("val", trainer, pl_module)

    def on_validation_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._end("val", pl_module, batch)

    def on_test_batch_start(self, trainer, pl_module, batch, batch_idx, dataloader_idx=0) -> None:
        self._start("test", trainer, pl_module)

    def on_test_batch_end(self, trainer, pl_module, outputs, batch, batch_idx, dataloader_idx=0) -> None:
        self._end("test", pl_module, batch)

    def on_train_end(self, trainer, pl_module) -> None:
        self._report("train", trainer)
        over = self.overhead()
        if over["pct_of_step"] is not None:
            log.info("profiling overhead: %.4f ms/step (%.2f%% of step time)", over["ms_per_step"], over["pct_of_step"])

    def on_validation_end(self, trainer, pl_module) -> None:
        if not trainer.sanity_checking:
            self._report("val", trainer)

    def on_test_end(self, trainer, pl_module) -> None:
        self._report("test", trainer)

    # -- results ------------------------------------------------------------------------------
    def phase_fields(self, phase: str) -> dict[str, Any]:
        return self.meters[phase].summary("step" if phase == "train" else "batch")

    def overhead(self) -> dict[str, float | None]:
        train = self.meters["train"]
        batches = sum(m.steps for m in self.meters.values())
        if batches == 0 or train.steps == 0:
            return {"ms_per_step": None, "pct_of_step": None}
        per_step = self.overhead_s / batches
        return {"ms_per_step": 1000.0 * per_step, "pct_of_step": 100.0 * per_step / (train.seconds / train.steps)}

    def record_fields(self) -> dict[str, Any]:
        return {"throughput": {p: self.phase_fields(p) for p in PHASES} | {
            "tokens": TOKEN_NOTE, "overhead": self.overhead(), "from_step": self.from_step,
            "machine": self.machine,
            "covers": "train and val: every stretch from from_step on (kept in the checkpoint); "
                      "test: this invocation's",
            "timing": "device-synchronised batch start..end hooks (forward, backward, optimiser); data loading excluded",
        }}


class PeakMemoryMonitor(pl.Callback):
    """Peak memory per phase (:mod:`lra.footprint`) over the whole run: a checkpoint carries the
    training and validation peaks so far (the open phase's included), added back as fit starts, as
    :class:`ThroughputMonitor` does. Peaks of another method (another device, a kernel without
    ``clear_refs``) are not combined: the figures then start at the resume."""

    def __init__(self) -> None:
        self.meter: PeakMemory | None = None
        self.peaks: dict[str, float | None] = {p: None for p in PHASES}  # train, val: with earlier stretches
        self.start_mb: dict[str, float | None] = {p: None for p in PHASES}
        self.earlier: dict[str, Any] = {}  # from the checkpoint, added to the peaks as fit starts
        self.from_step: int | None = None
        self._open: str | None = None
        self._training = False

    def _begin(self, phase: str, pl_module: pl.LightningModule) -> None:
        if self.meter is None:
            self.meter = PeakMemory(pl_module.device)
        if self.start_mb[phase] is None:
            self.start_mb[phase] = self.meter.current_mb()
        self.meter.reset()
        self._open = phase

    def _close(self, phase: str) -> None:
        if self.meter is not None:
            self.peaks[phase] = self._peak(phase)
        self._open = None

    def _peak(self, phase: str) -> float | None:
        """The phase's peak so far, the open phase's live high-water mark included."""
        live = self.meter.peak_mb() if self._open == phase and self.meter is not None else None
        values = [v for v in (self.peaks[phase], live) if v is not None]
        return max(values) if values else None

    def on_fit_start(self, trainer, pl_module) -> None:
        # after Lightning restored the callbacks' state (not yet the step); the test's restore never reaches here
        if self.meter is None:
            self.meter = PeakMemory(pl_module.device)
        earlier, self.earlier = self.earlier, {}
        if earlier and earlier.get("method") == self.meter.method:
            self.peaks["train"], self.peaks["val"] = earlier["train_mb"], earlier["val_mb"]
            self.from_step = earlier["from_step"]

    def on_train_start(self, trainer, pl_module) -> None:
        if self.from_step is None:  # nothing (comparable) carried over: figures start here
            self.from_step = trainer.global_step
        self._training = True
        self._begin("train", pl_module)

    def on_train_end(self, trainer, pl_module) -> None:
        self._close("train")
        self._training = False
        self._report(trainer, "train")

    def on_validation_start(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        if self._training:
            self._close("train")
        self._begin("val", pl_module)

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.sanity_checking:
            return
        self._close("val")
        self._report(trainer, "val")
        if self._training and self.meter is not None:
            self.meter.reset()
            self._open = "train"

    def on_test_start(self, trainer, pl_module) -> None:
        self._begin("test", pl_module)

    def on_test_end(self, trainer, pl_module) -> None:
        self._close("test")
        self._report(trainer, "test")

    def _report(self, trainer: pl.Trainer, phase: str) -> None:
        _log_metrics(trainer, {f"profile/{phase}_peak_mb": self.peaks[phase]})
        if self.peaks[phase] is not None and self.meter is not None:
            log.info("%s peak memory: %.1f MB (%s)", phase, self.peaks[phase], self.meter.method)

    def state_dict(self) -> dict[str, Any]:
        return {"from_step": self.from_step, "method": self.meter.method if self.meter else None,
                "train_mb": self._peak("train"), "val_mb": self._peak("val")}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.earlier = dict(state)

    def record_fields(self) -> dict[str, Any]:
        meter = self.meter
        return {"peak_memory": {
            "method": meter.method if meter else None, "note": meter.note if meter else None,
            "train_mb": self._peak("train"), "val_mb": self._peak("val"), "test_mb": self.peaks["test"],
            "from_step": self.from_step, **{f"{p}_start_mb": self.start_mb[p] for p in PHASES},
            "covers": "train and val: the highest of every stretch from from_step on (kept in the checkpoint); "
                      "test and *_start_mb: this invocation's",
        }}


class ParameterCount(pl.Callback):
    def __init__(self) -> None:
        self.counts: dict[str, int] | None = None

    def setup(self, trainer, pl_module, stage: str) -> None:
        if self.counts is None:
            self.counts = count_parameters(pl_module)
            _log_metrics(trainer, {f"params/{k}": v for k, v in self.counts.items()})
            log.info("parameters: %s", ", ".join(f"{k} {v:,}" for k, v in self.counts.items()))

    def record_fields(self) -> dict[str, Any]:
        return {"parameters": self.counts}
