"""``python run.py ARGS`` without paying the imports each time: a server process imports the suite
once, then forks one child per run. A child is a real process of its own (it can SIGKILL itself,
exits with run.py's status, writes its own stdout/stderr), so kill-and-resume tests stay honest; it
differs from ``python run.py`` only in skipping the ~5 s interpreter start and imports. Tests that
are about the command itself keep using :func:`tests.conftest.run_cli`.

    with RunServer() as server:
        result = server.run(["model=tiny", ...], cwd=tmp_path, env={...})

The server never runs torch work itself (so no thread pool exists when it forks); it serves one
request at a time, reading a JSON line and answering one.
"""
from __future__ import annotations

import importlib
import json
import os
import runpy
import signal
import subprocess
import sys
import threading
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NoReturn

from lra.files import current_umask

ROOT = Path(__file__).resolve().parent.parent


@dataclass
class Result:
    returncode: int  # negative: killed by that signal (as subprocess reports it)
    stdout: str
    stderr: str


class RunServer:
    def __init__(self, env: dict[str, str] | None = None) -> None:
        """``env``: the server's environment (default: this process's now)."""
        self.proc: subprocess.Popen | None = None
        self.env = dict(os.environ if env is None else env)

    def __enter__(self) -> "RunServer":
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.forkrun"], cwd=ROOT, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     env={**self.env, "WANDB_MODE": "offline", "PYTHONPATH": str(ROOT)})
        if self.proc.stdout.readline().strip() != "ready":
            raise RuntimeError("the run server did not start")
        return self

    def __exit__(self, *exc) -> None:
        self.proc.stdin.close()
        self.proc.wait(timeout=60)

    def run(self, args: list[str], cwd: Path, env: dict[str, str] | None = None, check: bool = True,
            hook: str | None = None, whole_env: bool = False, timeout: float = 600) -> Result:
        """``env`` is added to the server's environment, or is the whole of the child's with
        ``whole_env`` (a test's environment as it is now, monkeypatches included). The child takes
        this process's umask, as a subprocess would. ``hook`` (``"module:function"``) is called in
        the child before the run: a test-only patch such as
        :func:`tests.killpoints.signal_during_data_build`. A run past ``timeout`` seconds is killed
        and fails the test (a hang, not a measurement)."""
        cwd = Path(cwd)
        out, err = cwd / ".run.stdout", cwd / ".run.stderr"
        request = {"args": args, "cwd": str(cwd), "env": env or {}, "out": str(out), "err": str(err),
                   "hook": hook, "whole_env": whole_env, "umask": current_umask()}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        pid = json.loads(self._answer())["pid"]
        expired = threading.Event()
        timer = threading.Timer(timeout, lambda: (expired.set(), _kill(pid)))
        timer.start()
        try:
            result = Result(json.loads(self._answer())["returncode"], out.read_text(), err.read_text())
        finally:
            timer.cancel()
        if expired.is_set():
            raise AssertionError(f"run.py {' '.join(args)} still ran after {timeout} s: killed")
        if check and result.returncode != 0:
            raise AssertionError(f"run.py {' '.join(args)} failed ({result.returncode}):\n"
                                 f"{result.stdout[-3000:]}\n{result.stderr[-5000:]}")
        return result

    def _answer(self) -> str:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the run server died")
        return line


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:  # it ended as the timer fired
        pass


def run_all(jobs: list, servers: int = 2) -> list:
    """``job(server)`` for every job, on ``servers`` run servers side by side (the CI machine has two
    cores); results in the order of ``jobs``. A job's exception is re-raised here."""
    from concurrent.futures import ThreadPoolExecutor
    from queue import Queue

    pool: Queue = Queue()
    opened = [RunServer().__enter__() for _ in range(servers)]
    for server in opened:
        pool.put(server)

    def one(job):
        server = pool.get()
        try:
            return job(server)
        finally:
            pool.put(server)

    try:
        with ThreadPoolExecutor(servers) as executor:
            return list(executor.map(one, jobs))
    finally:
        for server in opened:
            server.__exit__()


def become_run_py(args: list[str], cwd: str | Path, env: dict[str, str], out: str | Path, err: str | Path,
                  plant: Callable[[], None] | None = None, after: Callable[[], None] | None = None,
                  own_group: bool = False, whole_env: bool = False, umask: int | None = None) -> NoReturn:
    """In a forked child: become ``python run.py ARGS`` (stdout and stderr to the files ``out`` and
    ``err``) and exit with its status; never returns. ``plant()`` runs first (test hooks), ``after()``
    once run.py has returned, still in the child. ``own_group``: lead a process group of its own, as a
    shell job does, so that a Ctrl-C sent to the group reaches the run's workers too. ``env`` is
    added to the environment, or replaces it with ``whole_env``."""
    code = 1
    try:
        if own_group:
            os.setpgid(0, 0)
        if umask is not None:
            os.umask(umask)
        os.chdir(cwd)
        if whole_env:
            os.environ.clear()
        os.environ.update(env)
        for fd, path in ((1, out), (2, err)):
            handle = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
            os.dup2(handle, fd)
            os.close(handle)
        # the parent's stream objects may write elsewhere (pytest's capture): the child's own files
        sys.stdout = open(1, "w", buffering=1, encoding="utf-8", closefd=False)
        sys.stderr = open(2, "w", buffering=1, encoding="utf-8", closefd=False)
        sys.stdin = open(os.devnull)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
        if plant is not None:
            plant()
        sys.argv = [str(ROOT / "run.py"), *args]
        sys.path.insert(0, str(ROOT))
        try:
            runpy.run_path(sys.argv[0], run_name="__main__")  # as `python run.py` (Hydra finds conf/ by it)
            code = 0
        except SystemExit as e:
            code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
        except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught exception
            traceback.print_exc()
    finally:
        try:
            if after is not None:
                after()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)


def _hook(name: str | None) -> Callable[[], None] | None:
    if not name:
        return None
    module, function = name.split(":")
    return getattr(importlib.import_module(module), function)


def serve() -> None:
    import run  # noqa: F401 - the point: everything a run imports, imported once
    import lra.training.train  # noqa: F401
    import tests.killpoints  # noqa: F401

    print("ready", flush=True)
    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:
            become_run_py(request["args"], request["cwd"], request["env"], request["out"], request["err"],
                          plant=_hook(request.get("hook")), whole_env=request["whole_env"], umask=request["umask"])
        print(json.dumps({"pid": pid}), flush=True)
        _, status = os.waitpid(pid, 0)
        code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        print(json.dumps({"returncode": code}), flush=True)


if __name__ == "__main__":
    serve()
