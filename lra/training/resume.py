"""Resuming killed runs, stopping gracefully on SIGTERM/Ctrl-C, and checking checkpoints.

A run is identified by ``run_key``: a hash of what defines the experiment, so the same command finds
its own unfinished record and checkpoint (resume) or its finished record (skip), whatever logger,
output folder or launch time it has. What is in the key and why: :mod:`lra.identity`.
"""
from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import threading
from pathlib import Path
from typing import Any, Iterator

import pytorch_lightning as pl
import torch
from filelock import FileLock, Timeout
from omegaconf import DictConfig
from pytorch_lightning.utilities.exceptions import SIGTERMException

from lra.badinput import BadInputError, DataMissingError
from lra.identity import behaviour_difference, run_key
from lra.records import NullRecord, RunRecord, is_rank_zero, load_records
from lra.training.checkpoints import LAST, LastCheckpoint, validates_next

RESUMABLE = ("running", "interrupted", "failed")
LOCKED_MODES = ("train", "pretrain")  # runs that train: one process per identity (pretrain: lra/training/pretrain.py)
log = logging.getLogger(__name__)


def find_previous(results_dir: str | Path, key: str, behaviour: dict | None = None,
                  same: bool = True, mode: str = "train") -> tuple[dict | None, dict | None]:
    """The newest unfinished record with this key (of ``mode``: ``train``, or ``pretrain`` for a
    self-pretraining stage), and the newest finished one. With ``behaviour`` (this code's
    fingerprint), only records whose fingerprint agrees with it (``same``; a record from before
    fingerprints agrees with any), or only those whose fingerprint differs (``not same``)."""
    records, _ = load_records(results_dir)
    mine = sorted((r for r in records if r.get("run_key") == key and r["mode"] == mode
                   and (behaviour is None or (behaviour_difference(behaviour, r.get("fingerprint")) is None) == same)),
                  key=lambda r: r.get("started_at") or "")
    unfinished = [r for r in mine if r["status"] in RESUMABLE and not still_running(r)]
    finished = [r for r in mine if r["status"] == "finished"]
    return (unfinished[-1] if unfinished else None), (finished[-1] if finished else None)


def reopen_unfinished(cfg: DictConfig, data: dict[str, Any]) -> tuple[RunRecord, str | None]:
    """An unfinished run's record, marked running again, and its ``last.ckpt`` to resume from (None:
    killed before its first one, so it starts again from step 0 in the same record)."""
    record = RunRecord.reopen(Path(cfg.paths.results_dir) / "runs" / f"{data['run_id']}.json")
    last = Path(cfg.paths.checkpoint_dir) / data["run_id"] / LAST
    if last.is_file():
        record.update(status="running", resumed=True, resume_count=record.data.get("resume_count", 0) + 1, error=None)
        return record, str(last)
    record.update(status="running", restart_count=record.data.get("restart_count", 0) + 1, error=None)
    return record, None


def boot_id() -> str | None:
    """This boot of this machine (Linux; None elsewhere). Host names cannot tell machines apart:
    sandboxes and containers share names such as ``vm``, and their small pids come round again."""
    try:
        return Path("/proc/sys/kernel/random/boot_id").read_text().strip() or None
    except OSError:
        return None


def still_running(record: dict) -> bool:
    """A ``running`` record whose process is alive on this machine: an identical command started
    alongside, not a killed run to resume. Another machine's process, or one from an earlier boot
    (a record committed and checked out elsewhere), cannot be checked: resumable."""
    pid = record.get("pid")
    if record["status"] != "running" or not pid or record.get("host") != socket.gethostname() or pid == os.getpid():
        return False
    if record.get("boot") and record["boot"] != boot_id():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, another user's
        return True
    return True


@contextlib.contextmanager
def identical_run_lock(cfg: DictConfig) -> Iterator[None]:
    """One process at a time per experiment (``run_key``): a second identical command waits for the
    first to end, then resumes or skips it like any later command, instead of training a second
    copy beside it. A killed holder releases the lock with its process. ``resume=false``, an
    explicit ``ckpt_path``, ``mode=test`` and DDP workers (rank 0 decides) take no lock."""
    if cfg.get("mode") not in LOCKED_MODES or cfg.get("resume", "auto") is False or cfg.get("ckpt_path") or not is_rank_zero():
        yield
        return
    key = run_key(cfg)
    path = Path(cfg.paths.checkpoint_dir) / "locks" / f"{key}.lock"
    path.parent.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(path))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        log.warning("an identical run (key %s, lock %s) is in progress in another process: waiting for it to end, "
                    "then this command resumes or skips it (Ctrl-C gives up; resume=false starts a separate run)", key, path)
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def check_same_data(record: RunRecord, datamodule: Any, resuming: bool) -> None:
    """A run trains on one dataset. Record what its cache holds (``data_fingerprint``), and refuse to
    resume a run onto other data: the same settings generated on another machine or by other code,
    or a damaged copy, would continue it silently on different examples. A record from before
    fingerprints takes the data of its next resume."""
    if isinstance(record, NullRecord):
        return
    if not hasattr(datamodule, "fingerprint"):  # every record names its data: the report cannot pool it otherwise
        raise BadInputError(
            f"the DataModule {type(datamodule).__name__} has no `fingerprint` (what its data holds, recorded in every "
            "run record); derive it from lra.data.datamodule.CachedDataModule or give it a `fingerprint` property")
    found, started = datamodule.fingerprint, record.data.get("data_fingerprint")
    if resuming and started is not None and started != found:
        raise BadInputError(
            f"run {record.data['run_id']} trained on {record.data.get('task')} data with fingerprint {started}, and "
            f"the data here ({datamodule.cache_dir}) has fingerprint {found}: resuming would continue it on "
            "other examples. Resume it with the data it started on (copy that folder here), or start a new "
            "run of this configuration with resume=false")
    record.update(data_fingerprint=found).write()   # now: a killed run must keep it


def check_checkpoint(module: pl.LightningModule, path: str | Path, own: bool = False) -> None:
    """Fail clearly when a checkpoint does not fit the configured model. ``own``: the run's own
    ``last.ckpt``, found by an automatic resume (the user named no file, so the advice differs)."""
    path = Path(path)
    if not path.is_file():
        raise DataMissingError(f"checkpoint {path} does not exist; pass an existing .ckpt file")
    try:
        ckpt = torch.load(path, map_location="cpu", weights_only=False)
        state = ckpt["state_dict"]
    except Exception as e:  # noqa: BLE001 - any unreadable file gets the same advice
        if own:
            raise BadInputError(
                f"this configuration's unfinished run cannot resume: its own checkpoint {path} is damaged ({e}); "
                f"run the same command with resume=false to start it afresh{_intact_best(path.parent)}"
            ) from e
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


def _intact_best(directory: Path) -> str:
    for best in sorted(directory.glob("best-*.ckpt"), key=lambda p: p.stat().st_mtime, reverse=True):
        try:
            torch.load(best, map_location="cpu", weights_only=False)["state_dict"]
        except Exception:  # noqa: BLE001 - damaged too: look further
            continue
        return f", or test its intact best checkpoint with mode=test ckpt_path={best}"
    return ""


class StopRequested(Exception):
    """Raised inside training after a first Ctrl-C/SIGTERM: it leaves the fit loop at once
    (``trainer.should_stop`` would first run a full validation)."""


class GracefulStop(pl.Callback):
    """SIGTERM or a first Ctrl-C: during training, finish the current step, save ``last.ckpt`` and
    stop. When a validation follows that step, or one is running, stop at once *without* saving:
    a checkpoint taken before a validation has ended would make the resumed run skip that validation
    (see :mod:`lra.training.checkpoints`), so the run resumes from the previous ``last.ckpt`` and
    redoes at most ``checkpointing.every_n_steps`` steps. Before training (data preparation, setup),
    stop at once (caches are written atomically). A second Ctrl-C stops at once without saving.
    Installed for the whole run by :meth:`install`; ``requested`` names the signal after a stop.
    """

    def __init__(self, last: LastCheckpoint) -> None:
        self.last = last
        self.requested: str | None = None
        self.training = False
        self._previous: dict[int, Any] = {}

    @property
    def ckpt_dir(self) -> Path:
        return self.last.dirpath

    def _handler(self, signum: int, frame: Any) -> None:
        name = signal.Signals(signum).name
        if not self.training:
            raise KeyboardInterrupt(f"stopped by {name} before training started")
        if self.requested and signum == signal.SIGINT:
            raise KeyboardInterrupt(f"stopped at once by a second {name}")
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

    def _stop_requested(self, trainer: pl.Trainer) -> bool:
        if self.requested or getattr(trainer, "received_sigterm", False):
            self.requested = self.requested or "SIGTERM"
        return self.requested is not None

    def on_train_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if self._stop_requested(trainer):
            if not validates_next(trainer):
                self.last.save_now(trainer)
            raise StopRequested(self.requested)

    def on_validation_batch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any) -> None:
        if self.training and self._stop_requested(trainer):
            raise StopRequested(self.requested)

    def on_exception(self, trainer: pl.Trainer, pl_module: pl.LightningModule, exception: BaseException) -> None:
        # Lightning raises SIGTERMException itself between steps (the state of a completed step and
        # its validation: safe to checkpoint) or from inside a validation (not safe: see above).
        if isinstance(exception, SIGTERMException) and self.training and not trainer.validating:
            self.requested = self.requested or "SIGTERM"
            self.last.save_now(trainer)
