"""Train/test orchestration for ``run.py``: build data, network, trainer; fit (resuming a killed run
of the same configuration); test the best checkpoint; keep the run record up to date whatever
happens (finished, diverged, interrupted or failed)."""
from __future__ import annotations

import logging
import os
import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.callbacks import LearningRateMonitor, ModelCheckpoint, ProgressBar
from pytorch_lightning.utilities.exceptions import SIGTERMException

from lra.badinput import BadInputError, DataMissingError, DivergedError
from lra.training.forecast import RunForecast, StepProgressBar, cpu_hint
from lra.records import NullRecord, RunRecord, hydra_overrides, is_rank_zero, write_predictions
from lra.training.checkpoints import LAST, AtomicCheckpointIO, LastCheckpoint, best_checkpoint
from lra.training.compile import CompileNetwork, trainer_settings
from lra.identity import behaviour_difference, run_key
from lra.stamp import source_sha1
from lra.training.fingerprint import behavioural_fingerprint
from lra.training.pretrained import pretraining_behaviour
from lra.training.resume import (GracefulStop, StopRequested, boot_id, check_checkpoint, check_same_data, find_previous,
                                 identical_run_lock, reopen_unfinished)
from lra.training.threads import apply_threads
from lra.training.wandb_run import is_wandb, record_link, wandb_settings
from models.module import LRAModule
from models.network import LRAClassifier

log = logging.getLogger(__name__)
ENV_RUN_ID, ENV_RESUME_FROM = "LRA_RUN_ID", "LRA_RESUME_FROM"  # handed to DDP worker processes


def build_network(cfg: DictConfig) -> LRAClassifier:
    return instantiate(cfg.model, mixer=instantiate(cfg.attention))


def build_module(cfg: DictConfig) -> LRAModule:
    return LRAModule(
        build_network(cfg), num_classes=cfg.task.num_classes, total_steps=cfg.trainer.max_steps,
        **OmegaConf.to_container(cfg.optim, resolve=True),
    )


def build_trainer(cfg: DictConfig, ckpt_dir: Path, extra_callbacks: list | None = None,
                  record: RunRecord | None = None) -> pl.Trainer:
    """The configured Trainer; checkpoints of this run go to ``ckpt_dir``, written atomically.
    ``extra_callbacks`` come after the configured ones (a :class:`LastCheckpoint` among them runs
    after the best-checkpoint callback, which the exactness of ``last.ckpt`` relies on). ``record``:
    the run's record, which names its W&B run (:mod:`lra.training.wandb_run`) and is named in every
    logger's config."""
    callbacks = [instantiate(c) for c in (cfg.get("callbacks") or {}).values() if c is not None]
    run_id = record.data["run_id"] if record is not None else None
    loggers = [instantiate(c, **(wandb_settings(cfg, c, run_id) if run_id and is_wandb(c) else {}))
               for c in (cfg.get("logger") or {}).values() if c is not None]
    if not loggers:  # logger=none: callbacks that only feed a logger have nothing to do
        callbacks = [c for c in callbacks if not isinstance(c, LearningRateMonitor)]
    for cb in callbacks:
        if isinstance(cb, ModelCheckpoint):
            cb.dirpath = str(ckpt_dir)
    forecast = RunForecast(cfg.get("protocol"))  # plan, expected duration, measured forecast
    callbacks.append(forecast)
    if cfg.trainer.get("enable_progress_bar", True) and not any(isinstance(c, ProgressBar) for c in callbacks):
        callbacks.append(StepProgressBar(forecast))  # counted in steps, ETA with validations
    resolved = OmegaConf.to_container(cfg, resolve=True)
    if record is not None:
        resolved.update(record_link(str(record.path), record.data["run_id"]))
    for lg in loggers:
        lg.log_hyperparams(resolved)
    kwargs: dict[str, Any] = {}
    max_steps, val_every = cfg.trainer.max_steps, cfg.trainer.get("val_check_interval")
    if isinstance(val_every, int) and isinstance(max_steps, int) and 0 < max_steps < val_every:
        kwargs["val_check_interval"] = max_steps  # always validate at least once, at the end
    trainer_cfg, compiler = trainer_settings(cfg.trainer)
    if compiler is not None:
        callbacks.append(compiler)
    return instantiate(trainer_cfg, callbacks=callbacks + list(extra_callbacks or []), logger=loggers or False,
                       plugins=[AtomicCheckpointIO()], **kwargs)


def last_checkpoint(cfg: DictConfig, ckpt_dir: Path) -> LastCheckpoint:
    """The periodic ``last.ckpt`` a killed run resumes from (``checkpointing`` in the config)."""
    cadence = cfg.get("checkpointing") or {}
    return LastCheckpoint(ckpt_dir, every_n_steps=cadence.get("every_n_steps"), every_minutes=cadence.get("every_minutes"))


def new_record(cfg: DictConfig, mode: str, **extra: Any) -> RunRecord:
    if cfg.trainer.get("fast_dev_run"):  # a dry run: its record stays out of the report and of resume/skip
        mode = "dry_run"
    record = RunRecord(
        cfg.paths.results_dir, mode=mode, task=cfg.task.name, attention=cfg.attention_name, seed=cfg.seed,
        config=OmegaConf.to_container(cfg, resolve=True), protocol=cfg.get("protocol"),
    )
    return record.update(**extra)


def efficiency_fields(trainer: pl.Trainer) -> dict[str, Any]:
    """What the profiling callbacks measured (any callback with ``record_fields()``), and whether
    the network ran compiled."""
    fields: dict[str, Any] = {"compile": {"enabled": False}}
    for cb in trainer.callbacks:
        if hasattr(cb, "record_fields"):
            fields.update(cb.record_fields())
    return fields


def _metric(value: Any) -> float | None:
    return None if value is None else float(value)


@dataclass(frozen=True)
class AlreadyFinished:
    """This configuration already finished (resume=auto): the run is skipped, no record is added."""
    data: dict[str, Any]  # the finished record's data

    def result(self) -> dict[str, Any]:
        """What ``run`` returns for it: the finished run's metrics, and ``skipped``: its run id."""
        return {**self.data.get("metrics", {}), "skipped": self.data["run_id"]}


def _plan(cfg: DictConfig) -> tuple[RunRecord | AlreadyFinished, str | None]:
    """Decide between a new run, resuming an unfinished one, or skipping a finished one.

    Only a run whose code behaves as this code does (:mod:`lra.training.fingerprint`) is resumed or
    counts as finished: after an edit that changes the numbers, a finished run of the old code is
    trained again as a new run, and an unfinished one is refused rather than continued by other code.
    Returns ``(record, resume_from)``; ``record`` is :class:`AlreadyFinished` when this
    configuration already finished.
    """
    mode = cfg.get("resume", "auto")  # one of lra.checks.config.RESUME_MODES: run.py checked it
    if not is_rank_zero():  # a DDP worker: rank 0 decided, and writes the one record
        return NullRecord(os.environ[ENV_RUN_ID]), os.environ.get(ENV_RESUME_FROM) or None
    key = run_key(cfg)
    behaviour = behavioural_fingerprint(cfg, build_module)
    if cfg.get("pretrain") is not None and cfg.mode == "train":  # a fine-tune: and what it starts from
        behaviour["pretraining"] = pretraining_behaviour(cfg)
    if cfg.get("ckpt_path"):  # explicit checkpoint: a new record that starts from it
        return new_record(cfg, cfg.mode, run_key=key, fingerprint=behaviour), str(cfg.ckpt_path)
    if cfg.mode != "train" or mode is False:
        return new_record(cfg, cfg.mode, run_key=key, fingerprint=behaviour), None
    unfinished, finished = find_previous(cfg.paths.results_dir, key, behaviour)
    has_last = unfinished is not None and (Path(cfg.paths.checkpoint_dir) / unfinished["run_id"] / LAST).is_file()
    if unfinished is not None and (has_last or mode == "auto"):  # resume=true needs a checkpoint to resume from
        record, resume_from = reopen_unfinished(cfg, unfinished)
        if not record.data.get("fingerprint"):  # a record from before fingerprints: measured from this resume on
            record.update(fingerprint={**behaviour, "measured_at_a_resume": True})
        return record, resume_from
    other_unfinished, other_finished = find_previous(cfg.paths.results_dir, key, behaviour, same=False)
    if other_unfinished is not None and finished is None:
        raise BadInputError(
            f"this configuration's unfinished run {other_unfinished['run_id']} was trained by code that behaves "
            f"differently ({_what_changed(other_unfinished, behaviour)}): resuming would continue it with other "
            "code. Run the same command with resume=false to start a fresh run of this code (the old record and "
            f"checkpoint stay), or check out the code it ran on ({_commit_of(other_unfinished)}) to finish it")
    if mode is True:
        raise DataMissingError(
            f"resume=true but no checkpoint of an unfinished run with this configuration (key {key}) exists "
            f"under {cfg.paths.checkpoint_dir}; run without resume=true to start it"
        )
    if finished is not None:
        log.warning("this configuration already finished (record %s.json); pass resume=false to run it again",
                    finished["run_id"])
        return AlreadyFinished(finished), None
    if other_finished is not None:
        log.warning("this configuration finished before (record %s.json) with code that behaves differently (%s): "
                    "training a new run", other_finished["run_id"], _what_changed(other_finished, behaviour))
    return new_record(cfg, cfg.mode, run_key=key, fingerprint=behaviour), None


def _stretches(data: dict[str, Any]) -> list[dict[str, Any]]:
    return ((data.get("efficiency") or {}).get("wall") or {}).get("segments") or []


def _commit_of(data: dict[str, Any]) -> str:
    """The commit a record's last stretch ran on (else its start's), short, with '+edits' when dirty."""
    last = (_stretches(data) or [data.get("stamp") or {}])[-1]
    commit = str(last.get("git_commit") or "unknown")[:10]
    return commit + ("+edits" if last.get("dirty") else "")


def _what_changed(data: dict[str, Any], behaviour: dict[str, Any]) -> str:
    """'training loss of step 1: 2.33 recorded against 2.41 now; model source a1b2 -> c3d4'."""
    diff = behaviour_difference(data.get("fingerprint"), behaviour) or "fingerprint differs"
    said = [diff.replace(" against ", " recorded against ", 1) + " now"]
    before, now = (data.get("stamp") or {}).get("source_sha1"), source_sha1()
    if before and before != now:
        said.append(f"model source {before} -> {now}")
    return "; ".join(said)


def fit_and_test(cfg: DictConfig, record: RunRecord, resume_from: str | None, stop: GracefulStop) -> dict[str, Any]:
    pl.seed_everything(cfg.seed, workers=True)
    if cfg.mode == "train":
        cpu_hint(cfg.get("protocol"), cfg.trainer.get("accelerator"))
    datamodule = instantiate(cfg.task.datamodule)
    datamodule.prepare_data()  # data problems surface here, before any model or trainer exists
    check_same_data(record, datamodule, resuming=bool(resume_from) and cfg.mode == "train")
    module = build_module(cfg)
    if cfg.get("pretrain") is not None and cfg.mode == "train" and not resume_from:  # self-pretraining hook
        from lra.training.pretrained import start_from_pretrained  # (lra/training/pretrained.py): a fresh fine-tune

        start_from_pretrained(cfg, module, record)  # starts from the pretrained encoder
    if resume_from:
        check_checkpoint(module, resume_from, own=not cfg.get("ckpt_path"))
    trainer = build_trainer(cfg, stop.ckpt_dir, [stop, stop.last], record=record)
    compiler = next((cb for cb in trainer.callbacks if isinstance(cb, CompileNetwork)), None)
    if compiler is not None:  # a bounded number of evaluation shapes, each one static graph
        datamodule.eval_width_multiple = max(1, int(cfg.task.max_len) // 8)
    try:
        return _fit_and_test(cfg, record, resume_from, stop, datamodule, module, trainer)
    except Exception as e:
        storm = compiler.storm(e) if compiler is not None else None
        if storm is None:
            raise
        raise storm from e


def _fit_and_test(cfg: DictConfig, record: RunRecord, resume_from: str | None, stop: GracefulStop,
                  datamodule: Any, module: LRAModule, trainer: pl.Trainer) -> dict[str, Any]:
    ckpt_dir = stop.ckpt_dir
    metrics: dict[str, Any] = {}
    if cfg.mode == "train":
        try:
            trainer.fit(module, datamodule=datamodule, ckpt_path=resume_from)  # its known noise: lra/training/quiet.py
        except (SIGTERMException, StopRequested):
            stop.requested = stop.requested or "SIGTERM"
        except SystemExit:  # Lightning turns a second Ctrl-C into exit(1) after its own clean-up
            if trainer.interrupted:
                raise KeyboardInterrupt(f"stopped at once at step {trainer.global_step}; {_resume_hint(stop)}") from None
            raise
        if stop.requested:
            raise KeyboardInterrupt(f"stopped by {stop.requested} at step {trainer.global_step}; {_resume_hint(stop)}")
        best = best_checkpoint(trainer)
        curve = [list(p) for p in module.val_curve]
        metrics["best_val_acc"] = _metric(best.best_model_score) if best else None
        metrics["best_val_step"] = best_step(curve, best)
        metrics["val_acc"] = curve[-1][1] if curve else None  # the last validation (also after a resume at the end)
        metrics["train_steps"] = trainer.global_step
        metrics["n_val"] = validation_size(datamodule, trainer)  # the report's spread floor under best_val_acc
        record.update(learning_curve=curve)  # before testing loads the best checkpoint
        test_ckpt = best.best_model_path if best is not None and best.best_model_path else None
    else:
        test_ckpt = resume_from
    results = trainer.test(module, datamodule=datamodule, ckpt_path=test_ckpt)
    if results:
        metrics["test_acc"] = _metric(results[0].get("test/acc"))
        metrics["test_loss"] = _metric(results[0].get("test/loss"))
    record.update(metrics=metrics, efficiency=efficiency_fields(trainer), checkpoint_dir=str(ckpt_dir),
                  overrides=hydra_overrides())
    if trainer.world_size == 1:  # DDP ranks each hold a shard: per-example predictions are not gathered
        record.update(predictions=write_predictions(record.path, module.test_predictions()))
    if getattr(datamodule, "truncation", None):  # task.max_len cut training sequences (warned in setup)
        record.update(truncation=datamodule.truncation)
    return metrics


def validation_size(datamodule: Any, trainer: pl.Trainer) -> int | None:
    """Examples every validation reads: the whole split, unless ``limit_val_batches`` cuts it (then
    unknown here: None)."""
    val = (getattr(datamodule, "datasets", None) or {}).get("val")
    limit = trainer.limit_val_batches
    return len(val) if val is not None and isinstance(limit, float) and limit == 1.0 else None


def best_step(curve: list[list], best: ModelCheckpoint | None) -> int | None:
    """The step of the best validation. Ties go to the FIRST best: ``ModelCheckpoint`` replaces its
    best only on a strictly better score, and its state is checkpointed, so a resume keeps the rule."""
    if best is None or best.best_model_score is None or not curve:
        return None
    score = float(best.best_model_score)
    return next((int(step) for step, acc in curve if acc == score), None)


def _resume_hint(stop: GracefulStop) -> str:
    last = stop.ckpt_dir / LAST
    if not last.is_file():
        return "no checkpoint yet: the same command starts again from step 0"
    import torch

    try:
        step = torch.load(last, map_location="cpu", weights_only=False).get("global_step")
    except Exception:  # noqa: BLE001 - only for the message
        step = "?"
    return f"checkpoint of step {step} in {last}: run the same command again to resume"


def _finish_wandb(record: RunRecord) -> None:
    """One W&B run per job: close it whatever happened, so the next job of a sweep gets its own."""
    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.run.summary.update({f"record/{k}": v for k, v in record.data.get("metrics", {}).items()})
        wandb.finish(exit_code=0 if record.data.get("status") in ("running", "finished") else 1)


def run(cfg: DictConfig) -> dict[str, Any]:
    """One train or test run; the record ends as finished, diverged, interrupted or failed."""
    threads = apply_threads(cfg.get("threads"))  # before the record: its stamp says torch_threads
    with identical_run_lock(cfg):  # a second identical command waits, then resumes or skips
        return _run_locked(cfg, threads)


def _run_locked(cfg: DictConfig, threads: int | None) -> dict[str, Any]:
    record, resume_from = _plan(cfg)
    if isinstance(record, AlreadyFinished):  # report its result, add no record
        return record.result()
    # pid/host: a later identical command tells a live run (leave it) from a killed one (resume it)
    record.update(efficiency={"threads": threads}, pid=os.getpid(), host=socket.gethostname(), boot=boot_id()).write()
    os.environ[ENV_RUN_ID] = record.data["run_id"]
    os.environ[ENV_RESUME_FROM] = resume_from or ""
    stop = GracefulStop(last_checkpoint(cfg, Path(cfg.paths.checkpoint_dir) / record.data["run_id"])).install()
    try:
        with record.outcome():
            metrics = fit_and_test(cfg, record, resume_from, stop)
    except FloatingPointError as e:  # recorded as diverged; one paragraph for the user, not a traceback
        raise DivergedError(f"the run diverged: {e}; its record {record.path.name} says diverged") from e
    finally:  # after outcome(): the W&B run is closed with the run's final status
        stop.uninstall()
        _finish_wandb(record)
    path = record.finish("finished")
    log.info("run record: %s", path)
    return metrics
