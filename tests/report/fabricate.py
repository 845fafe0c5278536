"""Fabricated results folders for the report's tests: records with real-looking configs (so
:func:`lra.identity.identity` applies to them as to real runs) and prediction files with a chosen number of
correct test examples. Everything is deterministic."""
from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import numpy as np

from lra.report.build import build_report

N_TEST = 200


def config(attention: str, task: str, seed: Any, protocol: str = "quick", **changes: Any) -> dict[str, Any]:
    """A resolved run config as run.py stores it; ``changes``: dotted keys (``optim__lr`` = optim.lr)."""
    cfg: dict[str, Any] = {
        "mode": "train", "seed": seed, "protocol": protocol, "attention_name": attention, "threads": 1,
        "attention": {"_partial_": True, "_target_": f"attention.{attention}.Attention", "dropout": 0.0},
        "task": {"name": task, "max_len": 64, "dual": False, "num_classes": 10, "max_steps": 600,
                 "datamodule": {"seed": seed, "data_dir": "/data", "num_workers": 0, "max_len": 64,
                                "generator": {"seed": 0, "n_test": N_TEST}}},
        "model": {"d_model": 32, "n_layers": 1, "n_heads": 2, "d_ffn": 64, "d_head": 64, "pool": "mean", "dropout": 0.0},
        "optim": {"lr": 0.003, "schedule": "linear", "weight_decay": 0.0},
        "trainer": {"max_steps": 600, "default_root_dir": "/somewhere", "enable_progress_bar": True},
        "paths": {"results_dir": "/results"}, "logger": None,
    }
    for dotted, value in changes.items():
        node = cfg
        *parents, leaf = dotted.split("__")
        for part in parents:
            node = node[part]
        node[leaf] = value
    return cfg


class Results:
    """A results folder under construction: ``train(...)`` writes a record and its prediction file."""

    def __init__(self, root: Path, n_test: int = N_TEST, lengths: np.ndarray | None = None) -> None:
        self.root, self.runs = Path(root), Path(root) / "runs"
        self.runs.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(7)
        self.n = n_test
        self.labels = rng.integers(0, 10, n_test)
        self.lengths = rng.integers(5, 61, n_test) if lengths is None else lengths
        self.order = rng.permutation(n_test)
        self.clock = 0

    def correct(self, k: int, shift: int = 0) -> np.ndarray:
        """Exactly k correct examples (positions from a fixed permutation, rotated by ``shift``)."""
        c = np.zeros(self.n, dtype=bool)
        c[np.roll(self.order, shift)[:k]] = True
        return c

    def _started(self) -> str:
        self.clock += 1
        return f"2026-01-01T00:{self.clock // 60:02d}:{self.clock % 60:02d}+00:00"

    def write(self, rec: dict[str, Any], name: str | None = None) -> Path:
        path = self.runs / f"{name or rec['run_id']}.json"
        path.write_text(json.dumps(rec))
        return path

    def train(self, attention: str, seed: Any, k: int | None = None, task: str = "listops", protocol: str = "quick",
              run_id: str | None = None, preds: bool = True, shift: int = 0, changes: dict[str, Any] | None = None,
              overrides: list[str] | None = None, commit: str = "aaaaaaaaaaaa", **fields: Any) -> dict[str, Any]:
        """A finished training record with ``k`` of the test examples correct (default: 40%)."""
        run_id = run_id or f"{task}-{attention}-s{seed}-{self.clock}"
        c = self.correct(self.n * 2 // 5 if k is None else k, shift)
        rec: dict[str, Any] = {
            "schema": 1, "run_id": run_id, "mode": "train", "task": task, "attention": attention, "seed": seed,
            "protocol": protocol, "status": "finished", "config": config(attention, task, seed, protocol, **(changes or {})),
            "metrics": {"test_acc": float(c.mean()), "best_val_acc": float(c.mean())}, "efficiency": {},
            "stamp": {"cpu": "Test CPU", "gpu": None, "git_commit": commit}, "started_at": self._started(),
            "finished_at": None, "error": None,
            "overrides": overrides if overrides is not None else ["experiment=quick", f"attention={attention}", f"seed={seed}"],
            "learning_curve": [[100, 0.2], [200, float(c.mean())]],
        }
        if preds:
            pred = np.where(c, self.labels, (self.labels + 1) % 10).astype(np.int16)
            np.savez(self.runs / f"{run_id}.preds.npz", pred=pred, correct=c, label=self.labels.astype(np.int16),
                     length=self.lengths.astype(np.int32))
            rec["predictions"] = {"file": f"{run_id}.preds.npz", "n": self.n, "accuracy": float(c.mean())}
        rec.update(fields)
        self.write(rec)
        return rec

    def sweep(self, attention: str, ks: list[int], **kw: Any) -> list[dict[str, Any]]:
        """Seeds 0, 1, ... with ``ks[i]`` correct examples."""
        return [self.train(attention, seed, k, **kw) for seed, k in enumerate(ks)]

    def edit(self, rec: dict[str, Any], **fields: Any) -> dict[str, Any]:
        """Rewrite a record with some fields changed (metrics merged)."""
        new = copy.deepcopy(rec)
        for key, value in fields.items():
            if key == "metrics":
                new["metrics"].update(value)
            else:
                new[key] = value
        self.write(new)
        return new

    def report(self, **kw: Any) -> tuple[str, dict[str, str], dict[str, bytes]]:
        return build_report(self.root, **kw)
