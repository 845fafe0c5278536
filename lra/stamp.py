"""Hardware/software stamp stored in every run record, so figures can be traced to a machine and to
the code that produced them.

The code is named three ways (:func:`code_version`): the HEAD commit; whether the tree differs from
it (``dirty``, with a hash of the difference, so two runs of one uncommitted edit can be told from
two runs of two edits); and ``source_sha1``, a hash of the model's source (every ``.py`` file under
``attention/`` and ``models/``: the code that builds and runs the network), which stays the same
across commits that touch only the benchmark around it. What the code *does* is the behavioural
fingerprint (:mod:`lra.training.fingerprint`); these say which code it was.
"""
from __future__ import annotations

import hashlib
import os
import platform
from importlib import metadata
import subprocess
from pathlib import Path
from typing import Any

import torch


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


ROOT = Path(__file__).resolve().parent.parent
MODEL_SOURCE = ("attention", "models")  # the packages that build and run the network
# what a dirty tree is judged on: the code and configs, not results, data or logs written beside them
CODE_PATHS = ("attention", "models", "lra", "conf", "run.py", "pyproject.toml")


def _git(*args: str, text: bool = True) -> str | bytes | None:
    try:
        out = subprocess.run(["git", *args], capture_output=True, text=text, timeout=10, cwd=ROOT)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def git_commit() -> str | None:
    out = _git("rev-parse", "HEAD")
    return (out or "").strip() or None


def source_sha1(root: Path = ROOT) -> str:
    """SHA-1 over the model's source files (path and content, in path order)."""
    h = hashlib.sha1()
    for package in MODEL_SOURCE:
        for path in sorted((root / package).rglob("*.py")):
            h.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()[:16]


def tree_state() -> dict[str, Any]:
    """``dirty``: the code differs from HEAD (tracked edits or new files under :data:`CODE_PATHS`);
    ``diff_sha1``: a hash of that difference (None when clean or outside git)."""
    diff = _git("diff", "HEAD", "--binary", "--", *CODE_PATHS, text=False)
    new = _git("ls-files", "--others", "--exclude-standard", "--", *CODE_PATHS)
    if diff is None or new is None:
        return {"dirty": None, "diff_sha1": None}
    h = hashlib.sha1(diff)
    for name in sorted(new.split()):
        if name.endswith((".py", ".yaml", ".toml")):
            h.update(name.encode() + b"\0" + (ROOT / name).read_bytes())
    dirty = bool(diff) or h.digest() != hashlib.sha1(b"").digest()
    return {"dirty": dirty, "diff_sha1": h.hexdigest()[:16] if dirty else None}


def code_version() -> dict[str, Any]:
    """Which code is running: commit, dirty state with the difference's hash, and the model's source hash."""
    return {"git_commit": git_commit(), **tree_state(), "source_sha1": source_sha1()}


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def stamp() -> dict[str, Any]:
    info: dict[str, Any] = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "lightning": _version("pytorch-lightning"),
        "platform": platform.platform(),
        "cpu": cpu_model(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "cuda": torch.version.cuda,
        "gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        **code_version(),
    }
    return info
