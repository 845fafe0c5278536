"""Shared fixtures. Tests never touch the network: W&B runs offline, data is generated small."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

os.environ["WANDB_MODE"] = "offline"
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = Path(__file__).resolve().parent.parent

# A generated ListOps small enough for seconds-long runs through run.py.
TINY_LISTOPS = [
    "model=tiny",
    "task.max_len=64",
    "task.batch_size=16",
    "task.datamodule.generator.n_train=200",
    "task.datamodule.generator.n_val=40",
    "task.datamodule.generator.n_test=40",
    "task.datamodule.generator.min_length=5",
    "task.datamodule.generator.max_length=60",
    "logger=none",
]


# Tests use tiny tensors: one intra-op thread avoids oversubscribing the 2-core CI machine
# (run.py subprocesses take conf's `threads: 1`).
torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
    yield


def run_cli(args: list[str], cwd: Path, env: dict | None = None, timeout: int = 300, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``python run.py ARGS`` in ``cwd`` (data and results land under ``cwd``)."""
    full_env = {**os.environ, "WANDB_MODE": "offline", "LRA_DATA_DIR": str(cwd / "data"),
                "LRA_RESULTS_DIR": str(cwd / "results"), **(env or {})}
    proc = subprocess.run([sys.executable, str(ROOT / "run.py"), *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"run.py {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


@pytest.fixture
def cli(tmp_path):
    def _run(*args: str, **kwargs):
        return run_cli(list(args), tmp_path, **kwargs)
    _run.cwd = tmp_path
    return _run
