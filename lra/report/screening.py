"""Validation before aggregation: every record file under ``runs/`` is checked before any table is
built, and every record that no table uses is listed with its reason (the report's "Excluded
records" section and ``excluded.csv``).

Checks, written down:

* The file: valid JSON with the fields every writer sets (:func:`lra.records.read_record`), and its
  name is ``<run_id>.json`` (a copied or renamed record would count twice).
* Status ``finished``; anything else is listed as not finished, with its full error text.
* A training record (``mode=train``): ``seed`` a non-negative int (not ``"0"``, not missing),
  ``protocol`` a name, ``config`` holding the experiment-defining sections (the cell identity is
  computed from it: :mod:`lra.report.cells`) and agreeing with the record's own ``seed``,
  ``protocol``, ``attention`` and ``task``; not a ``trainer.fast_dev_run`` smoke test; the reported
  metric a finite fraction in [0, 1] (46.0 is a percentage, not an accuracy).
* Its prediction file, when the record names one: named ``<run_id>.preds.npz`` (not another run's),
  readable and complete (``pred``, ``correct``, ``label``, ``length``, equally long, as many
  examples as the record says), ``correct == (pred == label)`` everywhere, and its accuracy equal to
  the record's ``test_acc`` and ``predictions.accuracy`` (within half an example).
* Every other field a table reads has its type checked here, so a malformed one is an exclusion
  with its reason, never a crash: ``overrides`` a list of strings, the learning curve
  ``[[step, fraction], ...]``, ``metrics.best_val_step``, the training throughput and memory, the
  stamp and start time, the prediction arrays' integer labels and lengths.
* A bench record (``mode=bench``): a bench block whose per-length results are objects with a
  positive int ``length`` and a ``status``; an ``ok`` result has finite, positive ``ms`` and
  ``examples_per_s`` and a finite, non-negative ``peak_mb``.
* Other modes (``mode=test``: a checkpoint evaluation) feed no table and are listed as such.

A record that fails a check is excluded as a whole: one bad field makes the rest of it suspect.
"""
from __future__ import annotations

import hashlib
import math
import os
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from lra.identity import identity
from lra.records import read_record, record_files

PRED_KEYS = ("pred", "correct", "label", "length")
# exclusion kinds, in the order the report lists them
MALFORMED, NOT_FINISHED, FAILED_CHECK, SUPERSEDED, NOT_USED = (
    "malformed", "not finished", "failed a check", "superseded duplicate", "not used")
KINDS = (MALFORMED, NOT_FINISHED, FAILED_CHECK, SUPERSEDED, NOT_USED)
METRICS = ("test_acc", "best_val_acc")


class CheckFailed(ValueError):
    """A record that fails validation; the message is the reason the report prints."""


def code_label(version: dict[str, Any]) -> str:
    """'1a2b3c4d5e' for a commit, '1a2b3c4d5e+9f8e7d6c' for that commit with uncommitted edits."""
    commit = str(version.get("git_commit") or "unknown")[:10]
    return commit + (f"+{str(version.get('diff_sha1') or 'edits')[:8]}" if version.get("dirty") else "")


@dataclass
class Run:
    """A record that passed validation, with its checked prediction arrays (None: it names none)."""
    file: str
    rec: dict[str, Any]
    preds: dict[str, np.ndarray] | None = None
    ident: dict[str, Any] = field(default_factory=dict)  # identity(config), seed included
    _test_set: str | None = field(default=None, repr=False)

    @property
    def run_id(self) -> str:
        return str(self.rec["run_id"])

    @property
    def seed(self) -> int:
        return int(self.rec["seed"])

    @property
    def chrono(self) -> tuple[str, str]:
        return (str(self.rec.get("started_at") or ""), self.run_id)

    @property
    def commits(self) -> list[str]:
        """The code versions this run's stretches ran on (every resume's, from its wall-clock
        segments; a record without them: its start's), short, ``+<diff hash>`` for a dirty tree."""
        segments = ((self.rec.get("efficiency") or {}).get("wall") or {}).get("segments") or []
        return sorted({code_label(s) for s in segments} or {code_label(self.rec.get("stamp") or {})})

    @property
    def behaviour(self) -> dict[str, Any] | None:
        """The record's behavioural fingerprint (None before fingerprints: pools with any)."""
        return self.rec.get("fingerprint") or None

    def value(self, metric: str) -> float:
        """The metric in accuracy points (x 100)."""
        return 100.0 * float(self.rec["metrics"][metric])

    def best_val_step(self) -> int | None:
        step = (self.rec.get("metrics") or {}).get("best_val_step")
        return step if isinstance(step, int) and not isinstance(step, bool) else None

    @property
    def n_test(self) -> int | None:
        return int(self.preds["correct"].size) if self.preds is not None else None

    @property
    def test_set(self) -> str | None:
        """A fingerprint of the test set the predictions were made on (labels and lengths, in order):
        part of what a cell pools on, so a reordered or other test set never pools silently."""
        if self.preds is None:
            return None
        if self._test_set is None:
            h = hashlib.sha1(np.ascontiguousarray(self.preds["label"]).astype(np.int64).tobytes())
            h.update(np.ascontiguousarray(self.preds["length"]).astype(np.int64).tobytes())
            self._test_set = h.hexdigest()[:12]
        return self._test_set


@dataclass(frozen=True)
class Exclusion:
    file: str
    kind: str
    reason: str
    run_id: str = ""
    mode: str = ""
    task: str = ""
    attention: str = ""
    seed: str = ""
    status: str = ""

    @classmethod
    def of(cls, file: str, rec: dict[str, Any] | None, kind: str, reason: str) -> "Exclusion":
        rec = rec or {}
        return cls(file, kind, reason, *(str(rec.get(k, "")) for k in ("run_id", "mode", "task", "attention", "seed", "status")))


class Ledger:
    """Every record file, used or excluded: the report's header counts come from here."""

    def __init__(self) -> None:
        self.files = 0
        self.excluded: list[Exclusion] = []
        self.folders = ["runs/"]  # where the records were read, relative to the report's results folder

    def exclude(self, run: Run, kind: str, reason: str) -> None:
        self.excluded.append(Exclusion.of(run.file, run.rec, kind, reason))

    def count(self, kind: str) -> int:
        return sum(e.kind == kind for e in self.excluded)

    @property
    def used(self) -> int:
        return self.files - len(self.excluded)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_fraction(name: str, value: Any) -> float:
    """A metric that must be an accuracy fraction."""
    if value is None:
        raise CheckFailed(f"metrics.{name} is null (the run recorded no {name})")
    if not _number(value):
        raise CheckFailed(f"metrics.{name}={value!r} is not a number")
    if not math.isfinite(value):
        raise CheckFailed(f"metrics.{name}={value} is not finite")
    if not 0.0 <= value <= 1.0:
        hint = " (a percentage? records store fractions)" if 1.0 < value <= 100.0 else ""
        raise CheckFailed(f"metrics.{name}={value} is outside [0, 1]{hint}")
    return float(value)


def _positive(value: Any) -> bool:
    return _number(value) and math.isfinite(value) and value > 0


def _int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _optional(rec: dict[str, Any], dotted: str, ok: Callable[[Any], bool], want: str) -> None:
    """A field the report reads when present: absent or null is fine, another type is not."""
    value = _section(rec, dotted)
    if value is not None and not ok(value):
        raise CheckFailed(f"{dotted}={value!r} is not {want}")


def check_common(rec: dict[str, Any]) -> None:
    """Fields every table may read: the stamp, the start time, the efficiency block."""
    for dotted, ok, want in (("stamp", lambda v: isinstance(v, dict), "an object"),
                             ("stamp.git_commit", lambda v: isinstance(v, str), "a string"),
                             ("stamp.cpu", lambda v: isinstance(v, str), "a string"),
                             ("stamp.gpu", lambda v: isinstance(v, str), "a string"),
                             ("started_at", lambda v: isinstance(v, str), "a string"),
                             ("task", lambda v: isinstance(v, str) and bool(v), "a task name"),
                             ("attention", lambda v: isinstance(v, str) and bool(v), "a variant name"),
                             ("efficiency", lambda v: isinstance(v, dict), "an object"),
                             ("config", lambda v: isinstance(v, dict), "an object"),
                             ("config.model", lambda v: isinstance(v, dict), "an object")):
        _optional(rec, dotted, ok, want)


def check_train_fields(rec: dict[str, Any]) -> None:
    """The training record's fields that tables read besides the metric."""
    fp = rec.get("fingerprint")
    if fp is not None and not (isinstance(fp, dict) and isinstance(fp.get("losses"), list) and isinstance(fp.get("logits"), list)):
        raise CheckFailed(f"fingerprint={fp!r} is not a behavioural fingerprint (losses and logits)")
    if fp is not None and "backfilled" not in fp and not rec.get("data_fingerprint"):
        # every record written since fingerprints carries both; only the backfilled older ones may lack data's
        raise CheckFailed("no data_fingerprint: a record of a run since behavioural fingerprints names the data it trained on")
    overrides = rec.get("overrides")
    if overrides is not None and (not isinstance(overrides, list) or not all(isinstance(o, str) for o in overrides)):
        raise CheckFailed(f"overrides={overrides!r} is not a list of strings (the run's command-line overrides)")
    curve = rec.get("learning_curve")
    if curve is not None:
        if not isinstance(curve, list):
            raise CheckFailed(f"learning_curve={curve!r} is not a list of [step, accuracy] points")
        for point in curve:
            if not (isinstance(point, list) and len(point) == 2 and _int(point[0]) and _number(point[1])
                    and math.isfinite(point[1]) and 0.0 <= point[1] <= 1.0):
                raise CheckFailed(f"learning_curve point {point!r} is not [step, accuracy fraction]")
    for dotted, ok, want in (("metrics.best_val_step", _int, "an int"),
                             ("efficiency.throughput", lambda v: isinstance(v, dict), "an object"),
                             ("efficiency.throughput.train", lambda v: isinstance(v, dict), "an object"),
                             ("efficiency.throughput.train.examples_per_s", _positive, "a positive number"),
                             ("efficiency.peak_memory", lambda v: isinstance(v, dict), "an object"),
                             ("efficiency.peak_memory.train_mb", _positive, "a positive number"),
                             ("config.task", lambda v: isinstance(v, dict), "an object"),
                             ("config.task.max_len", _int, "an int")):
        _optional(rec, dotted, ok, want)


def check_bench(rec: dict[str, Any]) -> None:
    """The bench block the efficiency tables and SMAT read."""
    bench = (rec.get("efficiency") or {}).get("bench")
    if not isinstance(bench, dict) or not isinstance(bench.get("results"), list):
        raise CheckFailed("no bench block with per-length results")
    for dotted, ok, want in (("efficiency.threads", _int, "an int"), ("efficiency.bench.batch_size", _int, "an int"),
                             ("efficiency.bench.protocol", lambda v: isinstance(v, str), "a string"),
                             ("efficiency.bench.memory_method", lambda v: isinstance(v, str), "a string"),
                             ("efficiency.bench.task_shapes", lambda v: isinstance(v, dict), "an object")):
        _optional(rec, dotted, ok, want)
    for i, r in enumerate(bench["results"]):
        where = f"efficiency.bench.results[{i}]"
        if not isinstance(r, dict):
            raise CheckFailed(f"{where}={r!r} is not an object")
        if not _int(r.get("length")) or r["length"] <= 0:
            raise CheckFailed(f"{where}.length={r.get('length')!r} is not a positive int")
        if not isinstance(r.get("status"), str):
            raise CheckFailed(f"{where}.status={r.get('status')!r} is not a string")
        if r["status"] != "ok":
            continue
        for key, floor in (("ms", 0.0), ("examples_per_s", 0.0), ("peak_mb", None)):
            value = r.get(key)
            if key not in r:
                raise CheckFailed(f"{where} (length {r['length']}, ok) has no {key}")
            good = _number(value) and math.isfinite(value) and (value > floor if floor is not None else value >= 0)
            if not good:
                raise CheckFailed(f"{where}.{key}={value!r} is not a {'positive' if floor is not None else 'non-negative'} number")


def _section(config: dict[str, Any], dotted: str) -> Any:
    node: Any = config
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


def check_train(rec: dict[str, Any], metric: str) -> dict[str, Any]:
    """The training-record checks; returns the record's experiment identity (seed included)."""
    seed = rec.get("seed")
    if "seed" not in rec or seed is None:
        raise CheckFailed("no seed: runs of unknown seed cannot be told apart")
    if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
        raise CheckFailed(f"seed={seed!r} is not a non-negative int")
    protocol = rec.get("protocol")
    if not isinstance(protocol, str) or not protocol:
        raise CheckFailed(f"protocol={protocol!r}: a training record names the protocol it followed")
    config = rec.get("config")
    if not isinstance(config, dict) or not config.get("task") or not config.get("attention"):
        raise CheckFailed("config lacks the experiment-defining sections (task, attention, ...): "
                          "which experiment it ran cannot be told")
    for key, dotted in (("seed", "seed"), ("protocol", "protocol"), ("attention", "attention_name"), ("task", "task.name")):
        stored = _section(config, dotted)
        if stored is not None and stored != rec[key]:
            raise CheckFailed(f"{key}={rec[key]!r} disagrees with its config ({dotted}={stored!r}): edited by hand?")
    if _section(config, "trainer.fast_dev_run"):
        raise CheckFailed("trainer.fast_dev_run: a smoke test of a batch or two, not a result")
    metrics = rec.get("metrics")
    if not isinstance(metrics, dict) or not metrics:
        raise CheckFailed("no metrics")
    if metric not in metrics:
        raise CheckFailed(f"no metrics.{metric}")
    check_fraction(metric, metrics[metric])
    try:
        from omegaconf import OmegaConf

        return identity(OmegaConf.create(config))
    except Exception as e:  # noqa: BLE001 - any config the identity cannot read is reported, not raised
        raise CheckFailed(f"config unreadable ({type(e).__name__}: {e})") from e


def check_predictions(results_dir: Path, rec: dict[str, Any]) -> dict[str, np.ndarray] | None:
    """The record's checked prediction arrays (None when it names no file)."""
    named = rec.get("predictions")
    if named is None:
        return None
    name = named.get("file") if isinstance(named, dict) else None
    if not isinstance(name, str) or not name:
        raise CheckFailed(f"predictions={named!r} names no file")
    expected = f"{rec['run_id']}.preds.npz"
    if Path(name).name != expected:
        raise CheckFailed(f"its predictions file {name} belongs to another run (this run's is {expected})")
    try:
        with np.load(results_dir / "runs" / Path(name).name) as z:
            arrays = {k: z[k] for k in z.files}
    except FileNotFoundError:
        raise CheckFailed(f"its predictions file {name} is missing") from None
    except (OSError, ValueError, EOFError, KeyError, zipfile.BadZipFile) as e:
        raise CheckFailed(f"its predictions file {name} is unreadable ({type(e).__name__}: {e}); truncated?") from e
    missing = [k for k in PRED_KEYS if k not in arrays]
    if missing:
        raise CheckFailed(f"its predictions file lacks {', '.join(missing)}")
    sizes = {k: int(np.asarray(arrays[k]).shape[0]) if np.asarray(arrays[k]).ndim else -1 for k in PRED_KEYS}
    if len(set(sizes.values())) != 1:
        raise CheckFailed(f"its predictions arrays differ in length ({', '.join(f'{k} {v}' for k, v in sizes.items())})")
    for key in ("label", "length"):
        if not np.issubdtype(np.asarray(arrays[key]).dtype, np.integer):
            raise CheckFailed(f"its predictions' {key} array holds {np.asarray(arrays[key]).dtype}, not integers")
    if (np.asarray(arrays["length"]) < 0).any():
        raise CheckFailed("its predictions' lengths include negative values")
    n = sizes["correct"]
    if n <= 0 or n != named.get("n"):
        raise CheckFailed(f"its predictions file holds {n} examples, the record says {named.get('n')}")
    correct = np.asarray(arrays["correct"]).astype(bool)
    agree = correct == (np.asarray(arrays["pred"]) == np.asarray(arrays["label"]))
    if not agree.all():
        raise CheckFailed(f"its predictions contradict themselves: correct != (pred == label) on {int((~agree).sum())} examples")
    acc, tol = float(correct.mean()), 0.5 / n + 1e-6
    test_acc = check_fraction("test_acc", (rec.get("metrics") or {}).get("test_acc"))
    for what, value in (("metrics.test_acc", test_acc), ("predictions.accuracy", named.get("accuracy"))):
        if not _number(value) or abs(acc - float(value)) > tol:
            raise CheckFailed(f"its predictions give accuracy {acc:.4f}, the record's {what} is {value}")
    arrays["correct"] = correct
    return arrays


def screen(results_dir: str | Path, metric: str, also: Sequence[str | Path] = ()) -> tuple[list[Run], Ledger]:
    """Every record file checked: the runs the tables may use (finished, passed), and the ledger of
    the rest. Duplicates and unused runs are added to the ledger later, by the tables' builders.

    ``also`` (``report.also``): other results folders whose records join these, read and never
    written; each run's predictions are read from its own folder, and its file is named relative
    to ``results_dir`` (``../<folder>/runs/<run id>.json``)."""
    results_dir = Path(results_dir)
    ledger, runs = Ledger(), []
    for folder in (results_dir, *map(Path, also)):
        prefix = "" if folder == results_dir else os.path.relpath(folder / "runs", results_dir) + "/"
        if prefix:
            ledger.folders.append(prefix)
        runs += _screen_folder(folder, prefix, metric, ledger)
    return runs, ledger


def _screen_folder(folder: Path, prefix: str, metric: str, ledger: Ledger) -> list[Run]:
    runs = []
    for path in record_files(folder):
        ledger.files += 1
        try:
            rec = read_record(path)
        except (OSError, ValueError) as e:
            ledger.excluded.append(Exclusion.of(prefix + path.name, None, MALFORMED, f"unreadable record ({e})"))
            continue
        run = Run(prefix + path.name, rec)
        if path.stem != str(rec["run_id"]):
            ledger.exclude(run, FAILED_CHECK, f"the file name {path.name} does not match its run_id "
                                              f"{rec['run_id']} (a copied or renamed record)")
            continue
        if rec["status"] != "finished":
            quiet = ("(no error recorded: still running, or killed before it could record one)" if rec["status"] == "running"
                     else "(no error recorded)")
            ledger.exclude(run, NOT_FINISHED, str(rec.get("error") or quiet))
            continue
        try:
            if rec["mode"] == "train":
                check_common(rec)
                run.ident = check_train(rec, metric)
                check_train_fields(rec)
                run.preds = check_predictions(folder, rec)
            elif rec["mode"] == "bench":
                check_common(rec)
                check_bench(rec)
            else:
                ledger.exclude(run, NOT_USED, f"mode={rec['mode']}: only training (mode=train) and bench records feed tables")
                continue
        except CheckFailed as e:
            ledger.exclude(run, FAILED_CHECK, str(e))
            continue
        runs.append(run)
    return runs
