"""Files every layer writes: crash-safe writes (a temporary sibling, fsync, then rename into place) and
the writable-directory check that names the setting to change.

Permissions follow the umask, as a plain ``open()`` would give: ``mkstemp`` creates its file 0600
(private on purpose), and the rename would carry that mode to records, reports, plots and generated
data, which collaborators on shared storage (docs/clusters.md's SLURM setup) then cannot read."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from lra.badinput import NotWritableError

WHERE_SET = {"data dir": "LRA_DATA_DIR (or paths.data_dir)", "results dir": "LRA_RESULTS_DIR (or paths.results_dir)",
             "checkpoint dir": "LRA_CHECKPOINT_DIR (or paths.checkpoint_dir)", "report out dir": "report.out_dir"}


# Where each of the suite's folders is when no setting says: the environment variable, else a folder of
# that name in the working directory. Every entry point reads them here (run.py through conf/config.yaml's
# paths, whose ${oc.env:...} interpolations a test keeps equal to this table; python -m lra.bench and its
# protocols through default_dir).
FOLDERS: dict[str, tuple[str, str]] = {"data_dir": ("LRA_DATA_DIR", "data"),
                                       "results_dir": ("LRA_RESULTS_DIR", "results"),
                                       "checkpoint_dir": ("LRA_CHECKPOINT_DIR", "checkpoints")}


def default_dir(key: str) -> Path:
    """``paths.<key>`` as run.py resolves it: ``$LRA_RESULTS_DIR`` (for ``results_dir``), else ``./results``."""
    env, fallback = FOLDERS[key]
    return Path(os.environ.get(env) or fallback)


def current_umask() -> int:
    """The process umask, read without changing it where Linux reports it (``/proc/self/status``;
    the set-and-restore fallback is not thread-safe, so it is only used elsewhere)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _tmp_sibling(path: Path) -> tuple[int, str]:
    """A temporary file next to ``path`` with the mode ``open()`` would give (0666 minus the umask)."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.fchmod(fd, 0o666 & ~current_umask())
    return fd, tmp


def write_bytes(path: Path, data: bytes, exclusive: bool = False) -> None:
    """Atomically write ``data`` to ``path``. With ``exclusive`` an existing file is never replaced
    (``FileExistsError``), which is how run records avoid overwriting another run's record."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = _tmp_sibling(path)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        if exclusive:
            os.link(tmp, path)  # fails if path exists: never clobbers
            os.unlink(tmp)
        else:
            os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def write_text(path: Path, text: str, exclusive: bool = False) -> None:
    write_bytes(path, text.encode("utf-8"), exclusive=exclusive)


def write_json(path: Path, obj: Any, exclusive: bool = False) -> None:
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n", exclusive=exclusive)


def ensure_writable(directory: Path, what: str = "data dir") -> Path:
    """Create ``directory`` or fail with a message naming it and the fix."""
    directory = Path(directory).expanduser().resolve()
    try:
        directory.mkdir(parents=True, exist_ok=True)
        probe = directory / f".write-test-{os.getpid()}"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as e:
        setting = WHERE_SET.get(what, "the setting that names it")
        raise NotWritableError(
            f"{what} {directory} cannot be created or written ({e.strerror}); "
            f"point {setting} at a writable directory"
        ) from e
    return directory
