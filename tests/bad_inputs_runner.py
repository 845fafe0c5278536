"""Test-only entry: many ``python run.py ARGS`` cases in one interpreter, as a user meets them.

    python -m tests.bad_inputs_runner CASES.json RESULTS.json

The heavy imports (torch, Lightning, Hydra, the suite) happen once here; every case then runs in a
forked child that runs ``run.py`` as ``__main__`` exactly as ``python run.py`` does, with its own working folder,
environment, stdout/stderr files and real exit status (an uncaught exception prints its traceback
and exits 1, as the interpreter would). A case with ``"inject_bug": true`` replaces the run with one
that raises a ``RuntimeError``: an unexpected error must keep its traceback.
"""
from __future__ import annotations

import json
import os
import runpy
import sys
import time
import traceback
from pathlib import Path

import pytorch_lightning  # noqa: F401 - imported once for every child
import torch  # noqa: F401

import lra.checks.config
import lra.data.image  # noqa: F401
import lra.data.listops  # noqa: F401
import lra.data.pathfinder  # noqa: F401
import lra.data.retrieval  # noqa: F401
import lra.data.text  # noqa: F401
import lra.training.train  # noqa: F401

RUN_PY = str(Path(__file__).resolve().parent.parent / "run.py")


def _child(case: dict, out: Path, err: Path) -> int:
    os.chdir(case["cwd"])
    os.environ.update(case.get("env") or {})
    for fd, path in ((1, out), (2, err)):
        handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(handle, fd)
        os.close(handle)
    sys.argv = [RUN_PY, *case["args"]]
    if case.get("inject_bug"):
        def broken(cfg):
            raise RuntimeError("an injected bug")
        lra.checks.config.check_config = broken  # run.py imports it by name when it runs below
    try:
        runpy.run_path(RUN_PY, run_name="__main__")  # exactly `python run.py ARGS`
        return 0
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught exception
        traceback.print_exc()
        return 1
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


def start_case(case: dict, scratch: Path) -> int:
    out, err = scratch / f"{case['id']}.out", scratch / f"{case['id']}.err"
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            code = _child(case, out, err)
        finally:
            os._exit(code)
    return pid


def main(cases_path: str, results_path: str, parallel: int = 2) -> None:
    """Run the cases ``parallel`` at a time (children are independent: own folders per sweep/run)."""
    cases = json.loads(Path(cases_path).read_text())
    scratch = Path(results_path).parent / "runner-output"
    scratch.mkdir(parents=True, exist_ok=True)
    pending, running, results = list(cases), {}, {}
    while pending or running:
        while pending and len(running) < parallel:
            case = pending.pop(0)
            running[start_case(case, scratch)] = (case, time.perf_counter())
        pid, status = os.wait()
        case, started = running.pop(pid)
        results[case["id"]] = {
            "id": case["id"], "rc": os.waitstatus_to_exitcode(status), "seconds": round(time.perf_counter() - started, 2),
            "stdout": (scratch / f"{case['id']}.out").read_text(errors="replace"),
            "stderr": (scratch / f"{case['id']}.err").read_text(errors="replace")}
    Path(results_path).write_text(json.dumps([results[c["id"]] for c in cases], indent=1))


if __name__ == "__main__":
    main(*sys.argv[1:3])
