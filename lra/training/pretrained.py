"""What a self-pretrained fine-tune starts from (``+pretrain=<objective>``): the pretraining stage's
config (:func:`pretraining_config`, whose ``run_key`` finds the pretraining again) and the transfer
of its encoder into a fresh fine-tune (:func:`start_from_pretrained`, called by
:func:`lra.training.train.fit_and_test` at a fine-tune's first start). The stage itself:
:mod:`lra.training.pretrain` (apart, so that ``train`` imports this module and ``pretrain``
imports ``train`` without a cycle).

What carries (Amos et al. 2024's ``load_pretrained_model`` loads all but the prediction head):
token and position embeddings, the encoder blocks and final norm, the CLS embedding (``pool=cls``)
and any trained state of the mixers; not the classification head (fresh, as initialised by the
fine-tune's seed), not the mask token's embedding row, not the mixers' random-stream state (the
fine-tune keeps its own, as from scratch).
"""
from __future__ import annotations

import copy
import json
import os
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from omegaconf import DictConfig, OmegaConf, open_dict

from lra.badinput import DataMissingError
from lra.identity import run_key
from lra.records import RunRecord
from lra.training.resume import find_previous
from models.network import LRAClassifier

MODE = "pretrain"
ENCODER = "encoder.pt"
ENV_PRETRAINING = "LRA_PRETRAINING_RUN"  # the pretraining the stage just ran or found (its fingerprint agreed)
NOT_CARRIED = ("head.",)  # the classification head: a fine-tune starts a fresh one


def pretraining_config(cfg: DictConfig) -> DictConfig:
    """The pretraining stage's own config: the run's, with ``mode=pretrain`` and the pretraining
    budget, warm-up, learning rate and validation interval in the settings the trainer reads (and
    in ``task.*``, whose fine-tune values would otherwise make every fine-tune budget another
    pretraining). The ``pretrain`` section is resolved against the run's config first."""
    settings = OmegaConf.to_container(cfg.pretrain, resolve=True)
    steps = int(settings["max_steps"])
    settings["val_every"] = settings.get("val_every") or max(1, steps // 10)
    pre = copy.deepcopy(cfg)
    with open_dict(pre):
        pre.mode = MODE
        pre.pretrain = settings
        pre.resume = "auto"   # always reused or resumed: resume= is the fine-tune's
        pre.ckpt_path = None  # a fine-tune's starting checkpoint is not the pretraining's
        pre.task.max_steps = pre.trainer.max_steps = steps
        pre.task.warmup_steps = pre.optim.warmup_steps = int(settings["warmup_steps"])
        pre.task.val_every = pre.trainer.val_check_interval = int(settings["val_every"])
        pre.optim.lr = float(settings["lr"])
        if pre.get("callbacks") and pre.callbacks.get("checkpoint") is not None:
            pre.callbacks.checkpoint = None  # no best-validation weights: the last step's encoder is carried
        out = str(cfg.paths.output_dir)
        for node in (pre.get("logger") or {}).values():  # a logger writing in the job's folder (CSV) gets its own
            if isinstance(node, DictConfig) and "save_dir" in node and str(node.save_dir) == out:  # subfolder there
                node.save_dir = str(Path(out) / MODE)
    return pre


def encoder_path(cfg: DictConfig, pretraining: dict[str, Any]) -> Path:
    """Where a finished pretraining's ``encoder.pt`` is: under this run's checkpoint folder (a
    folder moved or committed elsewhere is found there), else where its record says."""
    here = Path(cfg.paths.checkpoint_dir) / pretraining["run_id"] / ENCODER
    return here if here.is_file() else Path(str(pretraining.get("encoder") or here))


def carried_state(encoder: dict[str, torch.Tensor], network: LRAClassifier) -> dict[str, torch.Tensor]:
    """The pretrained weights a fine-tune starts from: every network weight but the classification
    head and the mixers' random-stream state, the token table without the mask token's row."""
    own = network.state_dict()
    state = {k: v for k, v in encoder.items()
             if not k.startswith(NOT_CARRIED) and not k.endswith("_extra_state") and k in own}
    rows = own["embed.tokens.weight"].shape[0]
    state["embed.tokens.weight"] = encoder["embed.tokens.weight"][:rows]
    return state


def _chosen(cfg: DictConfig, key: str) -> dict[str, Any] | None:
    """The finished pretraining this fine-tune starts from: the one the stage just ran or found in
    this process (``run.py`` runs the stage first; its fingerprint agreed with this code), else the
    newest finished one with the key."""
    chosen = os.environ.get(ENV_PRETRAINING)
    path = Path(cfg.paths.results_dir) / "runs" / f"{chosen}.json"
    if chosen and path.is_file():
        data = json.loads(path.read_text())
        if data.get("run_key") == key and data.get("status") == "finished":
            return data
    return find_previous(cfg.paths.results_dir, key, mode=MODE)[1]


def pretraining_behaviour(cfg: DictConfig) -> dict[str, Any] | None:
    """The behavioural fingerprint of the pretraining a fine-tune starts from (the stage's choice),
    without its bookkeeping: part of the fine-tune's own, so a fine-tune of another pretraining code
    is another experiment (trained anew, pooled apart), while the seeds of one experiment, each with
    its own pretraining of the same code, still agree."""
    finished = _chosen(cfg, run_key(pretraining_config(cfg)))
    fp = (finished or {}).get("fingerprint") or {}
    return {k: fp[k] for k in ("version", "losses", "logits") if k in fp} or None


def start_from_pretrained(cfg: DictConfig, module: pl.LightningModule, record: RunRecord) -> None:
    """Load the pretrained embeddings and encoder into a fresh fine-tune, and name the pretraining
    in the fine-tune's record."""
    pre = pretraining_config(cfg)
    finished = _chosen(cfg, run_key(pre))
    if finished is None:
        raise DataMissingError(f"no finished self-pretraining with this configuration (key {run_key(pre)}) is "
                               f"recorded under {cfg.paths.results_dir}; run the same command without changes to pretrain first")
    path = encoder_path(cfg, finished)
    if not path.is_file():
        raise DataMissingError(
            f"the self-pretraining {finished['run_id']} finished but its encoder {path} is gone; put the file back, or "
            f"move its record runs/{finished['run_id']}.json out of {cfg.paths.results_dir} to pretrain again")
    state = carried_state(torch.load(path, map_location="cpu", weights_only=True), module.network)
    missing, unexpected = module.network.load_state_dict(state, strict=False)
    left = [k for k in missing if not k.startswith(NOT_CARRIED) and not k.endswith("_extra_state")]
    if left or unexpected:
        raise DataMissingError(f"the self-pretrained encoder {path} does not fit this network (missing {left[:4]}, "
                               f"unexpected {list(unexpected)[:4]}); it was written by other code")
    runs = Path(cfg.paths.results_dir) / "runs"
    record.update(pretraining={
        "run_id": finished["run_id"], "record": str(runs / f"{finished['run_id']}.json"), "encoder": str(path),
        "run_key": finished.get("run_key"), "objective": finished["config"]["pretrain"]["objective"],
        "steps": (finished.get("metrics") or {}).get("train_steps"),
        "wall_s": ((finished.get("efficiency") or {}).get("wall") or {}).get("train_s"),
    }).write()
