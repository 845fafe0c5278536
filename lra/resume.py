"""Resuming killed runs, stopping gracefully on SIGTERM/Ctrl-C, and checking checkpoints.

A run is identified by ``run_key``: a hash of its resolved config without paths, the resume switch
and the checkpoint cadence, so the same command finds its own unfinished record and checkpoint.
"""
from __future__ import annotations

import hashlib
import json
import signal
import threading
from pathlib import Path
from typing import Any

import pytorch_lightning as pl
import torch
from omegaconf import DictConfig, OmegaConf
from pytorch_lightning.utilities.exceptions import SIGTERMException

from lra.badinput import BadInputError, DataMissingError
from lra.records import load_records

VOLATILE = ("paths", "resume", "checkpointing", "hydra", "ckpt_path")
RESUMABLE = ("running", "interrupted", "failed")


def run_key(cfg: DictConfig) -> str:
    data = OmegaConf.to_container(cfg, resolve=True)
    for key in VOLATILE:
        data.pop(key, None)
    if isinstance(data.get("trainer"), dict):
        data["trainer"].pop("enable_progress_bar", None)
        data["trainer"].pop("default_root_dir", None)
    return hashlib.sha1(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:16]


def find_previous(results_dir: str | Path, key: str) -> tuple[dict | None, dict | None]:
    """The newest unfinished record with this key, and the newest finished one."""
    records, _ = load_records(results_dir)
    mine = sorted((r for r in records if r.get("run_key") == key and r["mode"] == "train"),
                  key=lambda r: r.get("started_at") or "")
    unfinished = [r for r in mine if r["status"] in RESUMABLE]
    finished = [r for r in mine if r["status"] == "finished"]
    return (unfinished[-1] if unfinished else None), (finished[-1] if finished else None)


def check_checkpoint(module: pl.LightningModule, path: str | Path) -> None:
    """Fail clearly when a checkpoint does not fit the configured model."""
    path = Path(path)
    if not path.is_file():
        raise DataMissingError(f"checkpoint {path} does not exist; pass an existing .ckpt file")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
        state = ckpt["state_dict"]
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same advice
        raise BadInputError(f"checkpoint {path} is not a readable Lightning checkpoint ({e}); pass a .ckpt written by this suite") from e
    expected = {k: tuple(v.shape) for k, v in module.state_dict().items() if not k.endswith("_extra_state")}
    found = {k: tuple(v.shape) for k, v in state.items() if hasattr(v, "shape") and not k.endswith("_extra_state")}
    missing = sorted(set(expected) - set(found))
    unexpected = sorted(set(found) - set(expected))
    shapes = sorted(k for k in set(expected) & set(found) if expected[k] != found[k])
    if missing or unexpected or shapes:
        detail = "; ".join(
            f"{what}: {', '.join(keys[:4])}{' ...' if len(keys) > 4 else ''}"
            for what, keys in (("missing", missing), ("unexpected", unexpected), ("shape mismatch", shapes)) if keys
        )
        raise BadInputError(
            f"checkpoint {path} does not match the configured model ({detail}); resume with the same "
            "attention/model/task settings the checkpoint was trained with, or start a new run with resume=false"
        )


class GracefulStop(pl.Callback):
    """SIGTERM or a first Ctrl-C: during training, finish the current step, save ``last.ckpt`` and
    stop; before training (data preparation, setup), stop at once (caches are written atomically).

    A second Ctrl-C interrupts at once. Installed for the whole run by :meth:`install`;
    ``requested`` names the signal after a stop.
    """

    def __init__(self, ckpt_dir: str | Path) -> None:
        self.ckpt_dir = Path(ckpt_dir)
        self.requested: str | None = None
        self.training = False
        self._previous: dict[int, Any] = {}

    def _handler(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if not self.training or (self.requested and signum == signal.SIGINT):
            raise KeyboardInterrupt(f"stopped by {name} before a checkpoint could be taken")
        self.requested = name

    def install(self) -> "GracefulStop":
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._handler)
        return self

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.training = True

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.training = False

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if self.requested or getattr(trainer, "received_sigterm", False):
            self.requested = self.requested or "SIGTERM"
            trainer.save_checkpoint(self.ckpt_dir / "last.ckpt")
            trainer.should_stop = True

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        # Lightning's own SIGTERM handling raises SIGTERMException from inside validation: the
        # weights are those of a completed step, so they are safe to checkpoint.
        if isinstance(exception, SIGTERMException) and self.training:
            self.requested = self.requested or "SIGTERM"
            trainer.save_checkpoint(self.ckpt_dir / "last.ckpt")
