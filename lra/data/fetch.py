"""``python run.py mode=fetch task=<name>|all``: download, verify and prepare the real data, without TensorFlow.

Sources (the original public archives) and what each task takes, where its reader looks by default
(:mod:`lra.data.layout`, read by the readers too):

* text: ``aclImdb_v1.tar.gz`` (ai.stanford.edu) -> ``<data_dir>/aclImdb/{train,test}/{neg,pos}``;
* image: ``cifar-10-binary.tar.gz`` (www.cs.toronto.edu) -> ``<data_dir>/cifar-10-batches-py/``, the
  binary records written as the python batches the reader reads;
* retrieval, listops, pathfinder, pathx: ``lra_release.gz`` (storage.googleapis.com/long-range-arena)
  -> ``<data_dir>/lra_release/`` ``tsv_data/`` (3 TSVs), ``listops-1000/``, ``pathfinder<res>/<folder>``.

Verification: IMDb's and CIFAR-10's size and sha256 are read at run time from the checksum registry of
the installed tensorflow-datasets package (``datasets/imdb_reviews/checksums.tsv``,
``url_checksums/cifar10.txt``; nothing is copied into this file). ``lra_release.gz`` is in no registry:
its size is the one the server announces (a cut download is caught, a different file is not), gzip's
CRC-32 and length of the whole unpacked stream are checked (Python's gzip raises on a mismatch), and
``fetch.release_sha256`` pins a sha256 (the one computed is printed, to pin next time).
``LRA_CHECKSUMS=<file>`` (tensorflow-datasets' format: ``url<TAB>size<TAB>sha256<TAB>name``) is read
before the registry: a mirror that serves other bytes must say which.

Every archive passes through :mod:`lra.data.download` (resume, retries, progress) and
:mod:`lra.data.archives` (only the needed members, staged, renamed into place after verification, all
the tasks of one archive or none). One fetch at a time works on an archive: a second one says which
process holds the lock and waits for it, then uses what it put in place. A full or read-only disk is
an error naming the folder and the setting that moves it.
IMDb and CIFAR-10 are kept in ``fetch.download_dir`` (default ``<data_dir>/downloads``); the LRA
release is unpacked while it arrives and not stored, unless ``fetch.keep_archive=true`` (then a killed
fetch resumes its ``.part`` file). An archive already in ``download_dir``, or named by
``fetch.from=FILE``, is used without the network.
"""
from __future__ import annotations

import argparse
import difflib
import gzip
import io
import json
import os
import pickle
import shutil
import socket
import sys
import tarfile
import time
import zlib
from dataclasses import dataclass, field
from datetime import datetime, timezone
from importlib.util import find_spec
from pathlib import Path
from contextlib import contextmanager
from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, Sequence
from urllib.parse import urlsplit

import numpy as np

from lra import CONF_DIR
from lra.badinput import BadInputError, ConfigError, DataMissingError, NotWritableError
from lra.data import archives, layout
from lra.data.archives import Unit
from lra.data.pathfinder_gen import DIFFICULTIES
from lra.data.download import (CHUNK, DISK_ERRORS, Expected, RangeStream, Tally, Transfer, check, download, mirrored,
                               size_text)
from lra.data.progress import human
from lra.files import ensure_writable, write_json

CHECKSUMS_ENV = "LRA_CHECKSUMS"
PROVENANCE = ".fetched.json"


@dataclass(frozen=True)
class Source:
    key: str
    url: str
    registry: Optional[str]       # tensorflow-datasets dataset whose checksum file lists ``url``
    nested: Optional[str] = None  # folder name the archive nests its members under (cut, see archives)
    streamed: bool = False        # unpacked while it arrives unless fetch.keep_archive

    @property
    def filename(self) -> str:
        return urlsplit(self.url).path.rsplit("/", 1)[-1]


SOURCES = {
    "imdb": Source("imdb", "http://ai.stanford.edu/~amaas/data/sentiment/aclImdb_v1.tar.gz", registry="imdb_reviews"),
    "cifar10": Source("cifar10", "https://www.cs.toronto.edu/~kriz/cifar-10-binary.tar.gz", registry="cifar10"),
    "lra_release": Source("lra_release", "https://storage.googleapis.com/long-range-arena/lra_release.gz",
                          registry=None, nested="lra_release", streamed=True),
}
TASKS = ("listops", "text", "retrieval", "image", "pathfinder", "pathx")
ALL = ("listops", "text", "retrieval", "image", "pathfinder")  # the five LRA tasks; Path-X on request only
PATHFINDER_FOLDERS = {name: folder for name, (folder, _) in DIFFICULTIES.items()}
# Where the readers look and what they read there: lra.data.layout. The binary CIFAR-10 archive holds
# the batches the image reader reads as pickles, as <name>.bin records.
CIFAR_BINS = tuple(f"{name}.bin" for name in layout.CIFAR.files)
CIFAR_RECORD = 1 + 3 * 32 * 32


# ----------------------------------------------------------------------------- checksums
def tfds_checksum_files(dataset: str) -> list[Path]:
    """The checksum files of ``dataset`` in the installed tensorflow-datasets package (found without
    importing it): ``datasets/<name>/checksums.tsv`` (newer builders) and ``url_checksums/<name>.txt``."""
    spec = find_spec("tensorflow_datasets")
    if spec is None or not spec.submodule_search_locations:
        return []
    base = Path(list(spec.submodule_search_locations)[0])
    found = [p for p in (base / "datasets" / dataset / "checksums.tsv", base / "url_checksums" / f"{dataset}.txt") if p.is_file()]
    return found or sorted(base.glob(f"*/{dataset}/checksums.tsv"))


def lookup(url: str, files: Iterable[Path]) -> Optional[Expected]:
    """The ``url<TAB>size<TAB>sha256[<TAB>name]`` line for ``url`` in the first file that has one."""
    for path in files:
        for line in Path(path).read_text().splitlines():
            fields = line.split("\t") if "\t" in line else line.split()
            if len(fields) >= 3 and fields[0] == url:
                return Expected(int(fields[1]), fields[2].strip().lower(), f"from {path}")
    return None


def expected_for(source: Source, checksums: Optional[Path], release_sha256: Optional[str]) -> Expected:
    """Size and sha256 ``source`` must have, and where they come from."""
    extra = [checksums] if checksums else []
    if checksums and not Path(checksums).is_file():
        raise DataMissingError(f"{CHECKSUMS_ENV}/fetch.checksums names {checksums}, which does not exist")
    found = lookup(source.url, extra)
    if found is None and source.registry:
        registry = tfds_checksum_files(source.registry)
        found = lookup(source.url, registry)
        if found is None:
            raise ConfigError(
                f"no checksum for {source.url}: the installed tensorflow-datasets package has no registry entry for it "
                f"({', '.join(map(str, registry)) or f'no checksum file for {source.registry!r}'}). Install the tested "
                f"version (pip install -c constraints.txt tensorflow-datasets), or give the size and sha256 in a file "
                f"named by {CHECKSUMS_ENV} (url<TAB>size<TAB>sha256)")
        found = Expected(found.size, found.sha256, f"tensorflow-datasets registry {found.origin[5:]}")
    if found is not None:
        return found
    if release_sha256:
        return Expected(None, release_sha256.lower(), "sha256 pinned by fetch.release_sha256; size as the server announces")
    return Expected(None, None, "no published checksum: size as the server announces, gzip CRC-32 of the content")


# ----------------------------------------------------------------------------- what each task needs
def _cifar_pickles(folder: Path) -> None:
    """The binary batches (``<label byte><3072 bytes R, G, B planes>`` per image) as the python-version
    pickles the image reader reads (same rows, same order: tfds keys both by their running index)."""
    for name in CIFAR_BINS:
        raw = np.fromfile(folder / name, dtype=np.uint8)
        if raw.size == 0 or raw.size % CIFAR_RECORD:
            raise BadInputError(f"CIFAR-10 {name}: {raw.size} bytes is not a whole number of {CIFAR_RECORD}-byte records")
        records = raw.reshape(-1, CIFAR_RECORD)
        with open(folder / name[:-4], "wb") as f:
            pickle.dump({b"labels": records[:, 0].astype(int).tolist(), b"data": np.ascontiguousarray(records[:, 1:])}, f,
                        protocol=4)
        (folder / name).unlink()


def _release_unit(task: str, folder: layout.Folder, dest: Path, use: str) -> Unit:
    """The release's files of ``folder`` (its folder of the same name in the release), put at ``dest``."""
    top = folder.leaf()
    return Unit(task, "lra_release", dest, tuple(f"{top}/{n}" for n in folder.files), f"{top}/", folder.files, use=use)


def task_units(task: str, data_dir: Path, datamodule: Mapping[str, Any], resolution: Optional[int] = None,
               difficulty: Optional[str] = None, members: Optional[Sequence[str]] = None) -> list[Unit]:
    """The folders ``task`` reads, where its config says it reads them (:mod:`lra.data.layout`).
    ``resolution`` and ``difficulty`` are the Pathfinder task's. ``members`` (release folders, e.g.
    ``pathfinder64/curv_baseline``) replace a release task's own."""
    dm, release = dict(datamodule), data_dir / layout.RELEASE

    def dest(folder: layout.Folder) -> Path:
        return folder.at(data_dir, dm.get(folder.setting), resolution)

    if task == "text":
        top = layout.IMDB.leaf()
        return [Unit(task, "imdb", dest(layout.IMDB), tuple(f"{top}/{p}/" for p in layout.IMDB.files), f"{top}/",
                     layout.IMDB.files, use="python run.py task=text")]
    if task == "image":
        return [Unit(task, "cifar10", dest(layout.CIFAR), tuple(f"cifar-10-batches-bin/{n}" for n in CIFAR_BINS),
                     "cifar-10-batches-bin/", layout.CIFAR.files, convert=_cifar_pickles, use="python run.py task=image")]
    if task not in TASKS:
        raise ConfigError(f"mode=fetch: unknown task {task!r}; valid: {', '.join(TASKS)} or all")
    if members:
        out = []
        for m in members:
            m = m.strip("/") + "/"
            note = layout.PATHX_WARNING if m.startswith("pathfinder128/") else ""
            out.append(Unit(task, "lra_release", release / m.rstrip("/"), (m,), m, note=note))
        return out
    if task == "retrieval":
        return [_release_unit(task, layout.AAN, dest(layout.AAN), "python run.py task=retrieval")]
    if task == "listops":
        return [_release_unit(task, layout.LISTOPS, dest(layout.LISTOPS),
                              "python run.py task=listops task.datamodule.source=official")]
    folder = PATHFINDER_FOLDERS.get(difficulty)
    if folder is None:
        raise ConfigError(f"task.difficulty={difficulty!r}; valid: {', '.join(PATHFINDER_FOLDERS)}")
    if resolution is None:
        raise ConfigError(f"task={task} needs task.resolution (e.g. task.resolution=32)")
    member = f"{layout.PATHFINDER.leaf(resolution)}/{folder}/"
    return [Unit(task, "lra_release", dest(layout.PATHFINDER) / folder, (member,), member, layout.PATHFINDER.files,
                 use=f"python run.py task={task} task.datamodule.source=official"
                     + (f" task.resolution={resolution}" if task == "pathfinder" and resolution != 32 else "")
                     + (f" task.difficulty={difficulty}" if difficulty != "hard" else ""),
                 note=layout.PATHX_WARNING if resolution == 128 else "")]


# ----------------------------------------------------------------------------- fetching
@dataclass
class FetchOptions:
    data_dir: Path
    download_dir: Optional[Path] = None         # default <data_dir>/downloads
    from_files: tuple[Path, ...] = ()           # archives already on disk
    keep_archive: bool = False                  # store the LRA release (resumable across runs) instead of streaming it
    release_sha256: Optional[str] = None
    force: bool = False                         # replace data already in place
    checksums: Optional[Path] = None            # extra checksum file (LRA_CHECKSUMS)
    mirror: Optional[str] = None                # LRA_MIRROR
    transfer: Transfer = field(default_factory=Transfer)

    @property
    def downloads(self) -> Path:
        return self.download_dir or self.data_dir / "downloads"


def _local_archive(source: Source, opts: FetchOptions, needed: set[str]) -> Optional[Path]:
    """``fetch.from`` (matched by file name, or the only file when one archive is needed), else a
    copy already in ``download_dir``."""
    for path in opts.from_files:  # a file of another name is only taken when this is the one archive needed
        if path.name == source.filename or (len(opts.from_files) == 1 and len(needed) == 1):
            if not path.is_file():
                raise DataMissingError(f"fetch.from={path}: no such file")
            return path
    kept = opts.downloads / source.filename
    return kept if kept.is_file() else None


def _open_gzip_tar(raw: io.RawIOBase):
    buffered = io.BufferedReader(raw, CHUNK)
    return buffered, gzip.GzipFile(fileobj=buffered, mode="rb")


@dataclass
class Placed:
    """What one archive's fetch has put in place so far (read when it is interrupted)."""

    units: list[Unit] = field(default_factory=list)
    old: list[Path] = field(default_factory=list)  # replaced folders (fetch.force) not removed yet


def _unpack_error(e: OSError, units: list[Unit]) -> NotWritableError:
    where = ", ".join(sorted({str(u.dest.parent) for u in units}))
    return NotWritableError(f"cannot write the unpacked files under {where} ({e.strerror or e}); nothing was put in "
                            f"place and data already there is untouched. Free space on that disk (or make it "
                            f"writable), or point paths.data_dir (or the task's folder setting) at another one")


def _fetch_source(source: Source, units: list[Unit], opts: FetchOptions, needed: set[str],
                  placed: Optional[Placed] = None) -> tuple[str, int, str, Expected]:
    """Get ``source`` and put every unit in place, all or none; returns (where it came from, size,
    sha256, expected). ``placed`` records the progress for the caller's Ctrl-C message."""
    placed = Placed() if placed is None else placed
    log = opts.transfer.log
    expected = expected_for(source, opts.checksums, opts.release_sha256 if source.key == "lra_release" else None)
    url = mirrored(source.url, opts.mirror)
    label = f"[fetch] {source.filename}"
    local = _local_archive(source, opts, needed)
    if local is None and not (source.streamed and not opts.keep_archive):
        log(f"{label}: downloading {url}" + (f" ({size_text(expected.size)})" if expected.size else ""))
        download(url, opts.downloads / source.filename, expected, opts.transfer, label)
        local = opts.downloads / source.filename
    if local is not None:
        check(str(local), expected, local.stat().st_size, None, local=True)  # a wrong size fails before unpacking
        raw: io.RawIOBase = io.FileIO(local, "r")
        origin = str(local)
        log(f"{label}: unpacking {', '.join(u.task for u in units)} from {local}")
    else:
        log(f"{label}: streaming {url} (unpacked as it arrives, not stored; fetch.keep_archive=true stores it)")
        raw = RangeStream(url, expected, opts.transfer, label)
        origin = url
    staged = {u: archives.staging_dir(u) for u in units}
    tally = Tally(raw)
    try:
        buffered, gz = _open_gzip_tar(tally)
        try:
            archives.extract(gz, units, staged, source.nested, source.filename)
            while gz.read(CHUNK):  # to the end: gzip checks its CRC-32 and length of the whole content
                pass
            while buffered.read(CHUNK):
                pass
        except (gzip.BadGzipFile, tarfile.TarError, EOFError, zlib.error) as e:
            raise BadInputError(f"{source.filename} ({origin}) is not an intact .tar.gz ({type(e).__name__}: {e}); "
                                f"nothing was put in place. Delete it if it is a download, or pass the original "
                                f"archive with fetch.from=FILE") from None
        except OSError as e:
            if e.errno not in DISK_ERRORS:
                raise
            raise _unpack_error(e, units) from None
        if isinstance(raw, RangeStream) and expected.size is None:
            expected = Expected(raw.total, expected.sha256, expected.origin)
        check(origin, expected, tally.size, tally.sha256, local=local is not None)  # fetch.from is checked here
        ready: dict[Unit, Path] = {}
        try:  # every unit checked and converted before any is put in place: all or none, in any order
            for unit in units:
                ready[unit] = archives.finalise(unit, staged[unit], source.filename, log)
                write_json(ready[unit] / PROVENANCE, {
                    "task": unit.task, "archive": source.filename, "url": source.url, "read_from": origin,
                    "size": tally.size, "sha256": tally.sha256, "verified": expected.origin,
                    "members": list(unit.members), "fetched_at": datetime.now(timezone.utc).isoformat(timespec="seconds")})
        except OSError as e:
            if e.errno not in DISK_ERRORS:
                raise
            raise _unpack_error(e, units) from None
        placed.old = archives.place_all([(ready[u], u.dest) for u in units])
        placed.units = list(units)
        for unit in units:
            files, size = archives.folder_size(unit.dest, skip=PROVENANCE)
            log(f"[fetch] {unit.task}: {files} files ({size_text(size)}) -> {unit.dest}")
        while placed.old:  # the replaced copies, once the new ones are in place and said so
            shutil.rmtree(placed.old[0])
            placed.old.pop(0)
    finally:
        tally.close()
        for path in staged.values():
            archives.discard(path)
    return origin, tally.size, tally.sha256, expected


def _in_place(unit: Unit, force: bool) -> bool:
    """True when ``unit`` is already complete at its destination (and not to be replaced); an
    incomplete destination is refused rather than touched."""
    if not unit.dest.exists() or force:
        return False
    lacking = unit.missing(unit.dest)
    if lacking:
        raise BadInputError(f"{unit.dest} exists but is incomplete (no {', '.join(lacking)}); it was left as it is. "
                            f"Move it away, or pass fetch.force=true to replace it with a fresh copy")
    return True


def _holder_path(lock: Path) -> Path:
    return lock.with_name(lock.name + ".holder")


def write_holder_note(lock: Path) -> None:
    """Who holds ``lock`` (pid, host, since when, command), for a fetch that has to wait for it."""
    write_json(_holder_path(lock), {"pid": os.getpid(), "host": socket.gethostname(),
                                    "since": datetime.now().astimezone().isoformat(timespec="seconds"),
                                    "command": " ".join(["python", *sys.argv])})


def _holder_text(lock: Path) -> str:
    """Who holds ``lock``, from the note its holder wrote beside it."""
    try:
        h = json.loads(_holder_path(lock).read_text())
        return (f"another fetch holds {lock} (pid {h['pid']} on {h['host']}, since {h['since']}: "
                f"{h['command']})")
    except (OSError, ValueError, KeyError, TypeError):
        return f"another fetch holds {lock} (its holder left no note of who it is)"


@contextmanager
def source_lock(lock: Path, label: str, log: Callable[[str], None]) -> Iterator[None]:
    """Hold ``lock`` (one fetch per archive). A second fetch says who holds it and that it waits, then
    waits: the holder may be putting the same data in place, which this one then finds there. The
    holder's note (pid, host, start, command) is written beside the lock while it is held."""
    from filelock import FileLock, Timeout

    held = FileLock(str(lock))
    try:
        held.acquire(timeout=0)
    except Timeout:
        log(f"{label}: {_holder_text(lock)}: waiting for it to finish (Ctrl-C stops this fetch only)")
        held.acquire()
    try:
        write_holder_note(lock)
        yield
    finally:
        try:
            _holder_path(lock).unlink()
        except OSError:
            pass
        held.release()


def _interrupted(source: Source, placed: Placed, downloads: Path) -> str:
    """The Ctrl-C line: what of ``source`` is in place, and what is left for the next fetch."""
    if placed.units:
        tasks = ", ".join(f"{u.task} -> {u.dest}" for u in placed.units)
        left = (f"; the old copies {', '.join(map(str, placed.old))} are left and the next fetch removes them"
                if placed.old else "")
        return f"[fetch] interrupted after {source.filename} was put in place ({tasks}){left}"
    part = downloads / (source.filename + ".part")
    kept = (f"; the partial download {part} ({size_text(part.stat().st_size)}) is kept: run the same "
            f"command to resume" if part.exists() else "")
    return f"[fetch] interrupted: nothing of {source.filename} was put in place{kept}"


def _writable_downloads(opts: FetchOptions) -> None:
    """The download folder (holding the locks) must be writable once anything is to be fetched."""
    if opts.download_dir is None:
        ensure_writable(opts.downloads, "data dir")
        return
    try:
        ensure_writable(opts.downloads, "fetch.download_dir")
    except NotWritableError as e:
        why = getattr(e.__cause__, "strerror", None) or e.__cause__
        raise NotWritableError(f"fetch.download_dir={opts.download_dir} cannot be created or written ({why}); point "
                               f"fetch.download_dir at a writable directory, or leave it unset (then archives go "
                               f"to <data_dir>/downloads)") from None


def fetch(units: list[Unit], opts: FetchOptions) -> list[str]:
    """Fetch every unit not already in place; returns the summary lines (also printed). Nothing is
    written (the download folder and its locks included) when every unit is in place already."""
    log, start = opts.transfer.log, time.monotonic()
    by_source: dict[str, list[Unit]] = {}
    seen: set[Path] = set()
    for unit in units:
        if unit.dest.resolve() in seen:  # one unit per folder (two tasks may name the same one)
            continue
        seen.add(unit.dest.resolve())
        if unit.note:
            log(f"[warning] {unit.note}")
        _in_place(unit, opts.force)  # an incomplete folder fails before any download
        by_source.setdefault(unit.source, []).append(unit)
    needed = set(by_source)
    names = {SOURCES[k].filename for k in needed}
    stray = [p for p in opts.from_files if p.name not in names] if len(opts.from_files) > 1 or len(needed) > 1 else []
    if stray and needed:
        raise ConfigError(f"fetch.from={', '.join(map(str, stray))}: the name matches none of the archives this fetch "
                          f"needs ({', '.join(sorted(names))}); rename the file, or fetch one task at a time")
    lines: list[str] = []
    there = "(already there; fetch.force=true fetches it again)"
    idle = {key for key, units_of in by_source.items()  # in place, nothing to clean up: nothing is written
            if all(_in_place(u, opts.force) and not archives.leftovers(u) for u in units_of)}
    if len(idle) < len(by_source):
        _writable_downloads(opts)
    for key, units_of in by_source.items():
        source = SOURCES[key]
        if key in idle:  # no lock either: a read-only data folder that holds the data is fine
            lines += [f"{u.task} -> {u.dest} {there}" for u in units_of]
            continue
        with source_lock(opts.downloads / f".{source.filename}.lock", f"[fetch] {source.filename}", log):
            for unit in units_of:  # what a stopped fetch left (the lock says none runs)
                archives.recover(unit, log)
            done = [u for u in units_of if _in_place(u, opts.force)]  # another fetch may have finished it
            lines += [f"{u.task} -> {u.dest} {there}" for u in done]
            todo = [u for u in units_of if u not in done]
            if not todo:
                continue
            placed = Placed()
            try:
                origin, size, sha, expected = _fetch_source(source, todo, opts, needed, placed)
            except KeyboardInterrupt:
                log(_interrupted(source, placed, opts.downloads))
                raise
        log(f"[fetch] {source.filename}: {size:,} bytes, sha256 {sha} ({expected.origin})")
        lines += [f"{u.task} -> {u.dest} (use: {u.use})" if u.use else f"{u.task} -> {u.dest}" for u in todo]
    kept = [s.filename for s in SOURCES.values() if (opts.downloads / s.filename).is_file()]
    tail = f"; archives kept in {opts.downloads}: {', '.join(kept)}" if kept else ""
    log(f"[fetch] done in {human(time.monotonic() - start)}: {'; '.join(lines)}{tail}")
    return lines


# ----------------------------------------------------------------------------- command lines
def _task_names(value: str) -> list[str]:
    names = list(ALL) if value == "all" else [t for t in value.split(",") if t]
    for name in names:
        if name not in TASKS:
            close = difflib.get_close_matches(name, [*TASKS, "all"], n=1)
            raise ConfigError(f"mode=fetch: unknown task {name!r}; valid: {', '.join(TASKS)}, or all"
                              + (f"; did you mean task={close[0]}?" if close else ""))
    return names


def options_from(fetch_cfg: Mapping[str, Any], data_dir: Path, log: Callable[[str], None] = print) -> FetchOptions:
    """:class:`FetchOptions` from the ``fetch:`` block of the config (conf/config.yaml)."""
    c = dict(fetch_cfg)
    for key in ("retries",):
        if not isinstance(c.get(key), int) or c[key] < 0:
            raise ConfigError(f"fetch.{key}={c.get(key)!r} must be a whole number >= 0, e.g. fetch.{key}=5")
    for key in ("retry_wait_s", "timeout_s"):
        if not isinstance(c.get(key), (int, float)) or isinstance(c.get(key), bool) or c[key] < 0 or (key == "timeout_s" and c[key] == 0):
            raise ConfigError(f"fetch.{key}={c.get(key)!r} must be a number {'> 0' if key == 'timeout_s' else '>= 0'}")
    sha = c.get("release_sha256")
    if sha and (len(str(sha)) != 64 or any(ch not in "0123456789abcdefABCDEF" for ch in str(sha))):
        raise ConfigError(f"fetch.release_sha256={sha!r} is not a sha256 (64 hex digits)")
    froms = c.get("from") or ()
    froms = (froms,) if isinstance(froms, (str, Path)) else tuple(froms)
    return FetchOptions(
        data_dir=data_dir, download_dir=Path(str(c["download_dir"])).expanduser() if c.get("download_dir") else None,
        from_files=tuple(Path(str(p)).expanduser() for p in froms), keep_archive=bool(c.get("keep_archive")),
        release_sha256=str(sha) if sha else None, force=bool(c.get("force")),
        checksums=Path(str(c["checksums"])).expanduser() if c.get("checksums") else None, mirror=c.get("mirror") or None,
        transfer=Transfer(retries=c["retries"], retry_wait_s=float(c["retry_wait_s"]), timeout_s=float(c["timeout_s"]), log=log))


def _compose(conf_dir: Path, overrides: list[str]):
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(conf_dir), version_base="1.3"):
        return compose("config", overrides=overrides)


def run_overrides(argv: Sequence[str], conf_dir: Path,
                  check_overrides: Callable[[list[str], Path], None] = lambda argv, conf_dir: None) -> list[str]:
    """``python run.py mode=fetch task=text,image [key=value ...]``: the same overrides as a run (a
    task's own folders, ``paths.data_dir``, ``task.resolution``) plus the ``fetch.*`` options. No Hydra
    run is started (no outputs/ folder); ``task=all`` fetches the five LRA tasks. ``check_overrides``
    is run.py's command-line check (it names the closest setting to a typo)."""
    from omegaconf import OmegaConf

    tasks, rest = None, []
    for arg in argv:
        if arg in ("-m", "--multirun", "mode=fetch"):
            continue
        if arg.startswith("task="):
            tasks = arg[len("task="):]
        else:
            rest.append(arg)
    if not tasks:
        raise ConfigError(f"mode=fetch needs the data to fetch: task=text, task=image,retrieval or task=all "
                          f"(the five LRA tasks); valid tasks: {', '.join(TASKS)}")
    names = _task_names(tasks)
    shared = [a for a in rest if not a.startswith("task.")]
    per_task = [a for a in rest if a.startswith("task.")]
    check_overrides([f"task={names[0]}", *shared], conf_dir)
    units, used, cfg = [], set(), None
    for name in names:
        base = _compose(conf_dir, [f"task={name}", *shared])
        mine = [a for a in per_task if OmegaConf.select(base, a.split("=", 1)[0], default="<absent>") != "<absent>"]
        used.update(mine)
        cfg = _compose(conf_dir, [f"task={name}", *shared, *mine]) if mine else base
        task = OmegaConf.to_container(cfg.task, resolve=True)
        data_dir = Path(str(cfg.paths.data_dir)).expanduser()
        members = cfg.fetch.get("members")
        units += task_units(name, data_dir, task.get("datamodule") or {}, task.get("resolution"), task.get("difficulty"),
                            list(members) if members else None)
    unused = [a for a in per_task if a not in used]
    if unused:
        check_overrides([f"task={names[0]}", *unused], conf_dir)  # names the closest setting
        raise ConfigError(f"{', '.join(unused)}: no task of {', '.join(names)} has this setting")
    opts = options_from(OmegaConf.to_container(cfg.fetch, resolve=True), Path(str(cfg.paths.data_dir)).expanduser())
    return fetch(units, opts)


def command_line_plan(args: argparse.Namespace, conf_dir: Path = CONF_DIR) -> tuple[list[Unit], FetchOptions]:
    """The units and options of ``python -m lra.data.fetch``. What its flags leave unsaid is the run's
    config (``paths.data_dir``, the ``fetch:`` block, each task's resolution and difficulty), so both
    fetch command lines have one set of defaults, written in conf/ only."""
    from omegaconf import OmegaConf

    names = [n for t in args.tasks for n in _task_names(t)]
    if not names:
        raise ConfigError(f"no task to fetch; valid: {', '.join(TASKS)}, or all")
    given = {"from": args.from_files, "download_dir": args.download_dir, "keep_archive": args.keep_archive,
             "release_sha256": args.release_sha256, "force": args.force, "retries": args.retries, "members": args.members}
    units = []
    for name in names:
        cfg = _compose(conf_dir, [f"task={name}"])
        task, settings = (OmegaConf.to_container(c, resolve=True) for c in (cfg.task, cfg.fetch))
        settings.update({k: v for k, v in given.items() if v is not None})
        data_dir = Path(args.data_dir or str(cfg.paths.data_dir)).expanduser()
        resolution = args.resolution if args.resolution and name == "pathfinder" else task.get("resolution")
        units += task_units(name, data_dir, {}, resolution, args.difficulty or task.get("difficulty"),
                            settings.get("members") or None)
    return units, options_from(settings, data_dir)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m lra.data.fetch text image retrieval [--from FILE ...]``: the same fetch without a Hydra
    run, for scripts; its defaults are the config's (:func:`command_line_plan`)."""
    ap = argparse.ArgumentParser(prog="python -m lra.data.fetch", description=__doc__.split("\n\n")[0],
                                 epilog="python run.py mode=fetch task=... does the same with the run's config")
    ap.add_argument("tasks", nargs="+", help=f"{', '.join(TASKS)} or all")
    ap.add_argument("--data-dir", default=None, help="default: paths.data_dir ($LRA_DATA_DIR, else data)")
    ap.add_argument("--download-dir", default=None, help="where archives are kept and looked for (default: fetch.download_dir)")
    ap.add_argument("--from", dest="from_files", nargs="+", default=None, metavar="FILE", help="archives already on disk")
    ap.add_argument("--members", nargs="+", default=None, help="LRA release folders to extract instead of the tasks' own")
    ap.add_argument("--resolution", type=int, default=None, help="pathfinder's (default: task.resolution)")
    ap.add_argument("--difficulty", default=None, choices=sorted(PATHFINDER_FOLDERS), help="default: task.difficulty")
    ap.add_argument("--keep-archive", action="store_true", default=None)
    ap.add_argument("--release-sha256", default=None)
    ap.add_argument("--force", action="store_true", default=None)
    ap.add_argument("--retries", type=int, default=None, help="default: fetch.retries")
    args = ap.parse_args(argv)
    from lra.badinput import UserError, exit_user_error

    try:
        fetch(*command_line_plan(args))
    except UserError as e:
        exit_user_error(e)
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
