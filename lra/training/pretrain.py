"""The self-pretraining (SPT) stage of a run with ``+pretrain=<objective>`` (``conf/pretrain/``).

``python run.py experiment=xiong2021 +pretrain=mlm task=listops attention=adamra`` runs two stages:

1. Pretraining (:func:`pretrain_stage`): a run of its own, with the config of
   :func:`pretraining_config` (``mode=pretrain``, the pretraining budget in ``trainer.max_steps``),
   its own record (``mode: pretrain``), ``run_key`` and checkpoint folder. It trains
   :class:`models.pretraining.MaskedLMModule` on the task's training split and ends by writing
   the encoder it carries (``encoder.pt``, the network's weights at the last step) next to its
   checkpoints. It is found again by its identity (and, as any run, only by code whose
   behavioural fingerprint agrees): a finished one is reused (a sweep that fine-tunes several
   times pretrains once), an unfinished one resumes from its ``last.ckpt``, and two identical
   launches go through :func:`lra.training.resume.identical_run_lock`.
2. Fine-tuning: the ordinary training run of the configured protocol (:mod:`lra.training.train`,
   started by ``run.py`` right after this stage), whose identity includes the ``pretrain``
   section, so the report never pools it with runs from scratch. At its first start (not on a
   resume: its own checkpoint holds everything)
   :func:`lra.training.pretrained.start_from_pretrained` loads the pretrained embeddings and
   encoder into the fresh network (the classification head stays as initialised) and names the
   pretraining record in the fine-tune's record (``pretraining``).

The pretraining stage always resumes or reuses (``resume=`` applies to the fine-tune). Its
``last.ckpt`` is removed once its record says finished and ``encoder.pt`` is written: a finished
run is never resumed, and the encoder file is all a later fine-tune reads.
"""
from __future__ import annotations

import io
import logging
import os
import socket
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from hydra.utils import instantiate
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.utilities.exceptions import SIGTERMException

from lra.badinput import BadInputError, ConfigError, DivergedError
from lra.files import write_bytes
from lra.identity import run_key
from lra.records import RunRecord, hydra_overrides
from lra.training.checkpoints import LAST
from lra.training.pretrained import ENCODER, ENV_PRETRAINING, MODE, pretraining_config
from lra.training.resume import (GracefulStop, StopRequested, boot_id, check_checkpoint, check_same_data, find_previous,
                                 identical_run_lock, reopen_unfinished)
from lra.training.threads import apply_threads
from lra.training.fingerprint import behavioural_fingerprint
from lra.training.train import (_commit_of, _finish_wandb, _what_changed, build_network, build_trainer, efficiency_fields,
                                last_checkpoint, new_record)
from models.pretraining import OBJECTIVES, MaskedLMModule, non_causal_mixers

log = logging.getLogger(__name__)


def build_pretraining_module(pre: DictConfig) -> MaskedLMModule:
    """The pretraining LightningModule of a :func:`pretraining_config`: the run's network with one
    more embedding row (the mask token) and a per-token head."""
    network = instantiate(pre.model, mixer=instantiate(pre.attention), vocab_size=int(pre.task.vocab_size) + 1)
    return MaskedLMModule(network, vocab_size=int(pre.task.vocab_size), objective=pre.pretrain.objective,
                          mask_ratio=float(pre.pretrain.mask_ratio), seed=int(pre.seed),
                          total_steps=int(pre.trainer.max_steps), **OmegaConf.to_container(pre.optim, resolve=True))


def check_pretraining(cfg: DictConfig) -> None:
    """Stage 3 (lra.checks.build): the pretraining module builds, and a causal objective has a
    variant with a causal mask; one error line naming the key otherwise."""
    objective = cfg.pretrain.get("objective")
    if objective not in OBJECTIVES:
        return  # stage 2 (lra.checks.config) named it
    devices, nodes = cfg.trainer.get("devices", 1), cfg.trainer.get("num_nodes", 1)
    if _several_devices(devices, nodes):
        raise ConfigError(f"+pretrain={objective} runs on one device (trainer.devices={devices}, trainer.num_nodes={nodes}): "
                          "the pretraining stage has no DDP launch of its own yet; use trainer.devices=1")
    if objective == "causal":
        unable = non_causal_mixers(build_network(cfg))
        if unable:
            raise ConfigError(
                f"pretrain.objective=causal needs a causal attention mask, and attention={cfg.attention_name} "
                f"({type(unable[0]).__name__}) has none: of this suite's variants only softmax has one (the "
                "efficient ones are bidirectional by construction); use +pretrain=mlm for this variant")
    build_pretraining_module(pretraining_config(cfg))


def _several_devices(devices: Any, nodes: Any) -> bool:
    if isinstance(nodes, int) and nodes > 1:
        return True
    if isinstance(devices, int):
        return devices > 1 or devices == -1
    if isinstance(devices, str):
        return "," in devices or devices.strip() not in ("1", "auto")
    try:
        return len(devices) > 1
    except TypeError:
        return False


# ----------------------------------------------------------------------------- stage 1: pretraining
def pretrain_stage(cfg: DictConfig) -> dict[str, Any]:
    """Run, resume or reuse the pretraining this run needs; returns its finished record's data."""
    threads = apply_threads(cfg.get("threads"))  # before the record: its stamp says torch_threads
    pre = pretraining_config(cfg)
    with identical_run_lock(pre):  # a second identical launch waits, then finds it finished
        record, resume_from = _plan(pre)
        if isinstance(record, dict):
            log.info("self-pretraining already done: record %s.json", record["run_id"])
            os.environ[ENV_PRETRAINING] = record["run_id"]  # the one the fine-tune starts from
            return record
        record.update(efficiency={"threads": threads}, pid=os.getpid(), host=socket.gethostname(), boot=boot_id()).write()
        stop = GracefulStop(_last_checkpoint(pre, record)).install()
        try:
            with record.outcome():
                _pretrain(pre, record, resume_from, stop)
        except FloatingPointError as e:
            raise DivergedError(f"self-pretraining diverged: {e}; its record {record.path.name} says diverged") from e
        finally:
            stop.uninstall()
            _finish_wandb(record)
        record.finish("finished")
        last = stop.ckpt_dir / LAST
        if last.is_file():  # a finished run is never resumed; encoder.pt is what fine-tunes read
            last.unlink()
        log.info("self-pretraining record: %s", record.path)
        os.environ[ENV_PRETRAINING] = record.data["run_id"]
        return record.data


def _last_checkpoint(pre: DictConfig, record: RunRecord) -> Any:
    return last_checkpoint(pre, Path(pre.paths.checkpoint_dir) / record.data["run_id"])


def _plan(pre: DictConfig) -> tuple[RunRecord | dict[str, Any], str | None]:
    """A finished pretraining (its record's data), an unfinished one to resume, or a new one; as for
    a training run (lra.training.train._plan), only one whose code behaves as this code does
    (:mod:`lra.training.fingerprint`, measured on the pretraining module) is resumed or reused."""
    key = run_key(pre)
    behaviour = behavioural_fingerprint(pre, build_pretraining_module)
    unfinished, finished = find_previous(pre.paths.results_dir, key, behaviour, mode=MODE)
    if unfinished is not None:
        return reopen_unfinished(pre, unfinished)
    if finished is not None:
        return finished, None
    other_unfinished, other_finished = find_previous(pre.paths.results_dir, key, behaviour, same=False, mode=MODE)
    if other_unfinished is not None:
        raise BadInputError(
            f"this configuration's unfinished self-pretraining {other_unfinished['run_id']} was trained by code that "
            f"behaves differently ({_what_changed(other_unfinished, behaviour)}): resuming would continue it with other "
            f"code. Check out the code it ran on ({_commit_of(other_unfinished)}) to finish it, or move its record "
            f"runs/{other_unfinished['run_id']}.json out of {pre.paths.results_dir} to pretrain afresh with this code")
    if other_finished is not None:
        log.warning("this configuration was self-pretrained before (record %s.json) by code that behaves differently "
                    "(%s): pretraining again", other_finished["run_id"], _what_changed(other_finished, behaviour))
    return new_record(pre, MODE, run_key=key, fingerprint=behaviour), None


def _pretrain(pre: DictConfig, record: RunRecord, resume_from: str | None, stop: GracefulStop) -> None:
    pl.seed_everything(pre.seed, workers=True)
    datamodule = instantiate(pre.task.datamodule)
    datamodule.prepare_data()
    check_same_data(record, datamodule, resuming=bool(resume_from))
    module = build_pretraining_module(pre)
    if resume_from:
        check_checkpoint(module, resume_from, own=True)
    trainer = build_trainer(pre, stop.ckpt_dir, [stop, stop.last], record=record)  # its own W&B run, named by its record
    try:
        trainer.fit(module, datamodule=datamodule, ckpt_path=resume_from)  # resume noise: lra.training.quiet
    except (SIGTERMException, StopRequested):
        stop.requested = stop.requested or "SIGTERM"
    except SystemExit:
        if trainer.interrupted:
            raise KeyboardInterrupt(f"self-pretraining stopped at once at step {trainer.global_step}; "
                                    "run the same command again to resume") from None
        raise
    if stop.requested:
        raise KeyboardInterrupt(f"self-pretraining stopped by {stop.requested} at step {trainer.global_step}; "
                                "run the same command again to resume it")
    encoder = stop.ckpt_dir / ENCODER
    buffer = io.BytesIO()
    torch.save(module.network.state_dict(), buffer)
    write_bytes(encoder, buffer.getbuffer())  # atomically: a kill here leaves no half file
    curve, losses = [list(p) for p in module.val_curve], [list(p) for p in module.val_loss_curve]
    record.update(
        learning_curve=curve, loss_curve=losses, encoder=str(encoder), checkpoint_dir=str(stop.ckpt_dir),
        overrides=hydra_overrides(), efficiency=efficiency_fields(trainer),
        metrics={"train_steps": trainer.global_step, "val_acc": curve[-1][1] if curve else None,
                 "val_loss": losses[-1][1] if losses else None,
                 "best_val_acc": max((acc for _, acc in curve), default=None)},
        note="self-pretraining: val_acc/val_loss are the accuracy and cross-entropy of the predicted tokens (masked "
             "ones for mlm, the next ones for causal) on the validation split, with the same masks at every "
             "validation; the encoder a fine-tune starts from is the last step's (encoder)")
