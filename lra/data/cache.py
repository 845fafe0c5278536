"""Cached, model-ready arrays under ``<data_dir>/<task>/<key>/``.

The key is a hash of every setting that changes preprocessing, so changing one never reuses a
stale cache. A cache directory is built in a temporary sibling and renamed into place only when
complete (a ``COMPLETE`` marker is written last), under a file lock, so an interrupted build never
leaves a cache that looks complete and two processes never build the same one at once.

The key says which settings built a cache, not what it holds: the same settings on another machine
or code version could generate other data. :func:`fingerprint` (a hash of the arrays, written at the
build) says what it holds; a run records it, and a resume onto different data is refused.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
from filelock import FileLock

from lra.files import ensure_writable, write_json, write_text

MARKER = "COMPLETE"
FINGERPRINT = "fingerprint"


def settings_key(settings: dict[str, Any]) -> str:
    blob = json.dumps(settings, sort_keys=True, default=str).encode()
    return hashlib.sha1(blob).hexdigest()[:12]


def is_complete(directory: Path) -> bool:
    return (Path(directory) / MARKER).exists()


def build_once(target: Path, build: Callable[[Path], None], settings: dict[str, Any] | None = None) -> Path:
    """Make ``target`` by calling ``build(tmp_dir)`` unless a complete copy exists."""
    target = Path(target)
    if is_complete(target):
        return target
    ensure_writable(target.parent)
    with FileLock(str(target) + ".lock"):
        if is_complete(target):  # another process finished it while we waited
            return target
        tmp = target.parent / f".{target.name}.building-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        try:
            build(tmp)
            if settings is not None:
                write_json(tmp / "settings.json", settings)
            fingerprint(tmp)
            (tmp / MARKER).write_text("ok\n")
            if target.exists():  # leftover of an older layout or an aborted rename
                shutil.rmtree(target)
            os.rename(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def fingerprint(directory: Path) -> str:
    """sha256 of a cache's arrays (every ``.npy``, headers included, in name order), 16 hex digits:
    computed at the build and kept beside them; a cache built before fingerprints gets it on first use."""
    directory = Path(directory)
    kept = directory / FINGERPRINT
    if kept.is_file():
        return kept.read_text().strip()
    digest = hashlib.sha256()
    for path in sorted(directory.glob("*.npy")):
        digest.update(path.name.encode() + b"\0")
        with open(path, "rb") as f:
            while chunk := f.read(1 << 22):
                digest.update(chunk)
    value = digest.hexdigest()[:16]
    try:
        write_text(kept, value + "\n")
    except OSError:  # a read-only data folder: computed again next time
        pass
    return value


def save_split(directory: Path, split: str, ids: np.ndarray, lengths: np.ndarray, labels: np.ndarray) -> None:
    """Store one split: ``ids`` ``[M, N]`` (or ``[M, 2, N]``), ``lengths`` ``[M]`` (or ``[M, 2]``), ``labels`` ``[M]``."""
    if not (len(ids) == len(lengths) == len(labels)):
        raise ValueError(f"split {split}: ids/lengths/labels disagree in size ({len(ids)}, {len(lengths)}, {len(labels)})")
    dtype = np.uint8 if ids.size == 0 or ids.max() < 256 else np.int16 if ids.max() < 2**15 else np.int32
    np.save(Path(directory) / f"{split}_ids.npy", ids.astype(dtype, copy=False))
    np.save(Path(directory) / f"{split}_lengths.npy", lengths.astype(np.int32, copy=False))
    np.save(Path(directory) / f"{split}_labels.npy", labels.astype(np.int64, copy=False))


def load_split(directory: Path, split: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    d = Path(directory)
    return (
        np.load(d / f"{split}_ids.npy", mmap_mode="r"),
        np.load(d / f"{split}_lengths.npy", mmap_mode="r"),
        np.load(d / f"{split}_labels.npy", mmap_mode="r"),
    )
