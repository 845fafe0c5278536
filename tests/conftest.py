"""Shared fixtures. Tests never touch the network: W&B runs offline, data is generated small.

Parallel workers (the README's ``pytest -n auto --dist loadgroup``): a test that uses a fixture of
module scope or wider, written here (a trained run, a started server, generated data), runs on the
worker that built it, so every such fixture is built once; tests that must not share the machine
with each other carry an explicit ``xdist_group`` (``ddp``: gloo processes on a port found free
just before; ``inductor``: one worker pays Inductor's first-compile cost)."""
from __future__ import annotations

import json
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


def run_env(cwd: Path, env: dict | None = None) -> dict:
    """A test run's environment: this process's now, offline W&B, data and results under ``cwd``."""
    return {**os.environ, "WANDB_MODE": "offline", "LRA_DATA_DIR": str(cwd / "data"),
            "LRA_RESULTS_DIR": str(cwd / "results"), **(env or {})}


def run_cli(args: list[str], cwd: Path, env: dict | None = None, timeout: int = 300, check: bool = True) -> subprocess.CompletedProcess:
    """Run ``python run.py ARGS`` in ``cwd`` (data and results land under ``cwd``)."""
    proc = subprocess.run([sys.executable, str(ROOT / "run.py"), *args], cwd=cwd, env=run_env(cwd, env),
                          capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"run.py {' '.join(args)} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


SESSION_ENV = dict(os.environ)  # before any test's monkeypatch


@pytest.fixture(scope="session")
def run_server():
    """One run server per worker (:mod:`tests.forkrun`), started at its first use: ``python run.py``
    without the ~9 s of CPU of a fresh interpreter's imports."""
    from tests.forkrun import RunServer

    with RunServer(SESSION_ENV) as server:
        yield server


@pytest.fixture
def cli(tmp_path, run_server):
    """``python run.py ARGS`` in ``tmp_path``, forked from the worker's run server with the test's
    environment as it is now, as :func:`run_cli` would run it. Tests about the interpreter itself
    (imports, start-up) call :func:`run_cli`. ``hook``: as in :meth:`tests.forkrun.RunServer.run`."""
    def _run(*args: str, check: bool = True, env: dict | None = None, timeout: float = 300,
             hook: str | None = None):
        return run_server.run(list(args), tmp_path, env=run_env(tmp_path, env), check=check, whole_env=True,
                              timeout=timeout, hook=hook)
    _run.cwd = tmp_path
    return _run


@pytest.hookimpl(tryfirst=True)  # before pytest-xdist reads the groups
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if item.get_closest_marker("xdist_group") is None and _uses_shared_fixture(item):
            item.add_marker(pytest.mark.xdist_group(item.module.__name__))


PER_WORKER = {"run_server"}  # a service each worker starts for itself, not something built once to share


def _uses_shared_fixture(item: pytest.Item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    defs = [d for ds in (info.name2fixturedefs.values() if info else ()) for d in ds]
    # baseid "": pytest's own (tmp_path_factory)
    return any(d.baseid and d.scope != "function" and d.argname not in PER_WORKER for d in defs)


# The settings grid's size and time (tests/attention/test_reference_grid.py), summed over workers.
@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:  # noqa: ANN001 - pytest-xdist's hook, on the controller
    from tests.attention.settings_grid import TIMES

    for config, times in json.loads(getattr(node, "workeroutput", {}).get("settings_grid", "{}")).items():
        TIMES[config].extend(times)


def pytest_sessionfinish(session: pytest.Session) -> None:
    if hasattr(session.config, "workeroutput"):  # a worker: hand its grid times to the controller
        from tests.attention.settings_grid import TIMES

        session.config.workeroutput["settings_grid"] = json.dumps(TIMES)


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001 - pytest's hook
    from tests.attention.settings_grid import TIMES, every_config, grid

    if not TIMES:
        return
    ran = sum(len(t) for t in TIMES.values())
    total = sum(len(grid(c)) for c in every_config())
    secs = sum(sum(t) for t in TIMES.values())
    slowest = sorted(TIMES, key=lambda c: -sum(TIMES[c]))[:3]
    terminalreporter.write_line(
        f"settings grid: {ran} point runs ({total} points, each eager and graph-safe) over {len(TIMES)} configs in {secs:.1f} s "
        f"(slowest: {', '.join(f'{c} {len(TIMES[c])} points {sum(TIMES[c]):.1f} s' for c in slowest)})")
