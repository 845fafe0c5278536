"""Run records: one JSON file per run under ``<results_dir>/runs/``, the report's input (with, for
ListOps, the folder's test-set descriptions under ``testsets/``, :func:`write_description`).

A record is created when a run starts (status ``running``) and rewritten atomically as the run
progresses; its file name holds a unique run id, and the first write refuses to replace an
existing file, so no run ever overwrites another's record.
"""
from __future__ import annotations

import datetime as _dt
import json
import os
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

from lra.files import write_bytes, write_json, write_text
from lra.files import ensure_writable
from lra.stamp import stamp

SCHEMA = 1
STATUSES = ("running", "finished", "failed", "interrupted", "diverged")


def utcnow() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


class RunRecord:
    def __init__(
        self, results_dir: str | Path, mode: str, task: str, attention: str, seed: int,
        config: dict[str, Any], protocol: str | None = None, run_id: str | None = None,
    ) -> None:
        runs = ensure_writable(Path(results_dir), "results dir") / "runs"
        runs.mkdir(exist_ok=True)
        if run_id is None:
            now = _dt.datetime.now(_dt.timezone.utc).strftime("%Y%m%dT%H%M%S")
            run_id = f"{now}-{mode}-{task}-{attention}-s{seed}-{uuid.uuid4().hex[:6]}"
        self.path = runs / f"{run_id}.json"
        self.data: dict[str, Any] = {
            "schema": SCHEMA, "run_id": run_id, "mode": mode, "task": task, "attention": attention,
            "seed": seed, "protocol": protocol, "status": "running", "config": config,
            "metrics": {}, "efficiency": {}, "stamp": stamp(), "started_at": utcnow(),
            "finished_at": None, "error": None,
        }
        self._written = False

    @classmethod
    def reopen(cls, path: str | Path) -> "RunRecord":
        """Continue an existing record (a resumed run keeps its one record)."""
        self = cls.__new__(cls)
        self.path = Path(path)
        self.data = json.loads(self.path.read_text())
        self._written = True
        return self

    def update(self, **fields: Any) -> "RunRecord":
        for key, value in fields.items():
            if isinstance(value, dict) and isinstance(self.data.get(key), dict):
                self.data[key].update(value)
            else:
                self.data[key] = value
        return self

    def write(self) -> Path:
        write_json(self.path, self.data, exclusive=not self._written)
        self._written = True
        return self.path

    @contextmanager
    def outcome(self) -> Iterator["RunRecord"]:
        """Record how the enclosed work ended if it raised: a non-finite loss is ``diverged``,
        Ctrl-C/SIGTERM ``interrupted``, anything else ``failed`` (with the error); then re-raise."""
        try:
            yield self
        except FloatingPointError as e:
            self.finish("diverged", error=str(e))
            raise
        except KeyboardInterrupt as e:
            self.finish("interrupted", error=str(e) or "KeyboardInterrupt")
            raise
        except BaseException as e:
            self.finish("failed", error=f"{type(e).__name__}: {e}")
            raise

    def finish(self, status: str = "finished", error: str | None = None) -> Path:
        if status not in STATUSES:
            raise ValueError(f"unknown run status {status!r}; valid: {', '.join(STATUSES)}")
        self.update(status=status, error=error, finished_at=utcnow())
        return self.write()


class NullRecord(RunRecord):
    """The record of a non-zero DDP rank: same data, never written (rank 0 writes the one record)."""

    def __init__(self, run_id: str) -> None:
        self.path = Path(os.devnull)
        self.data = {"run_id": run_id}
        self._written = True

    def write(self) -> Path:
        return self.path


def is_rank_zero() -> bool:
    """True unless a launcher (torchrun, Lightning's DDP launcher, SLURM) marks a non-zero rank."""
    return all(int(os.environ.get(v, 0) or 0) == 0 for v in ("RANK", "LOCAL_RANK", "NODE_RANK", "SLURM_PROCID"))


def hydra_overrides() -> list[str] | None:
    """The command-line overrides of this Hydra job (what the report uses to tell a protocol run from
    a custom one, :mod:`lra.report.protocols`); None outside Hydra (unknown)."""
    from hydra.core.hydra_config import HydraConfig

    if not HydraConfig.initialized():
        return None
    return [str(o) for o in HydraConfig.get().overrides.task]


def write_predictions(record_path: str | Path, arrays: dict[str, Any]) -> dict[str, Any] | None:
    """Save per-example test predictions next to the record (``<run_id>.preds.npz``, atomically);
    returns the record's ``predictions`` field (file name relative to the record, count, accuracy)."""
    if not arrays:
        return None
    import io

    import numpy as np

    path = Path(record_path).with_suffix(".preds.npz")
    buf = io.BytesIO()
    np.savez_compressed(buf, **arrays)
    write_bytes(path, buf.getvalue())
    correct = np.asarray(arrays["correct"])
    return {"file": path.name, "n": int(correct.size), "accuracy": float(correct.mean()) if correct.size else None}


def load_predictions(results_dir: str | Path, rec: dict[str, Any]) -> dict[str, Any] | None:
    """The arrays a record names (None when it names none or the file is unreadable)."""
    import numpy as np

    name = (rec.get("predictions") or {}).get("file")
    if not name:
        return None
    try:
        with np.load(Path(results_dir) / "runs" / Path(name).name) as z:
            return {k: z[k] for k in z.files}
    except (OSError, ValueError):
        return None


REQUIRED = ("run_id", "mode", "task", "attention", "status")


def record_files(results_dir: str | Path) -> list[Path]:
    """The record files under ``<results_dir>/runs/``, in name order."""
    return sorted((Path(results_dir) / "runs").glob("*.json"))


def read_record(path: str | Path) -> dict[str, Any]:
    """One record file; ``ValueError`` (with the reason) when it is not a JSON object holding the
    fields every writer sets (``OSError`` when it cannot be read)."""
    rec = json.loads(Path(path).read_text())
    if not isinstance(rec, dict):
        raise ValueError(f"not a JSON object but {type(rec).__name__}")
    missing = [k for k in REQUIRED if k not in rec]
    if missing:
        raise ValueError(f"missing fields {', '.join(missing)}")
    return rec


def load_records(results_dir: str | Path) -> tuple[list[dict[str, Any]], list[str]]:
    """All readable records, and a message per malformed file (named) that was skipped."""
    records, problems = [], []
    for path in record_files(results_dir):
        try:
            records.append(read_record(path))
        except (OSError, ValueError) as e:
            problems.append(f"{path.name}: skipped malformed record ({e})")
    return records, problems


# ----------------------------------------------------------------------------- test-set descriptions
TEST_SETS = "testsets"  # <results_dir>/testsets/<task>-<data fingerprint>.json


def description_file(results_dir: str | Path, task: str, data_fingerprint: str) -> Path:
    """Where a results folder keeps the description of one task's test set, named by the fingerprint
    of the data cache it was read from (the ``data_fingerprint`` runs record)."""
    return Path(results_dir) / TEST_SETS / f"{task}-{data_fingerprint}.json"


def write_description(results_dir: str | Path, description: dict[str, Any]) -> Path:
    """Write a test-set description (per test example, in split order, what the prediction files do
    not hold: for ListOps the outermost operator and depth; see :mod:`lra.data.describe`). One key a
    line, keys in the given order: the same description always gives the same bytes."""
    path = description_file(results_dir, str(description["task"]), str(description["data_fingerprint"]))
    lines = [f"  {json.dumps(k)}: {json.dumps(v, sort_keys=True)}" for k, v in description.items()]
    write_text(path, "{\n" + ",\n".join(lines) + "\n}\n")
    return path


def load_descriptions(results_dir: str | Path, task: str) -> tuple[list[tuple[str, dict[str, Any]]], list[str]]:
    """The task's test-set descriptions of a results folder, as (file name, content) in name order, and
    a message per unreadable file (named): the report says what it could not use."""
    found, problems = [], []
    for path in sorted((Path(results_dir) / TEST_SETS).glob(f"{task}-*.json")):
        try:
            content = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            problems.append(f"{TEST_SETS}/{path.name}: unreadable ({e})")
            continue
        if not isinstance(content, dict):
            problems.append(f"{TEST_SETS}/{path.name}: not a JSON object")
            continue
        found.append((path.name, content))
    return found, problems
