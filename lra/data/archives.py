"""Unpacking only the members a reader needs from a tar archive read front to back, all or nothing.

A :class:`Unit` is one folder a reader reads (``aclImdb/``, ``tsv_data/``, a Pathfinder difficulty
folder): the archive members it takes, the prefix cut from their names, and where it goes.
:func:`extract` reads the archive once in tarfile's stream mode (no seeking, so a 7.7 GB tarball can
come straight from the network and is never stored) and writes each unit's members into a staging
folder beside its destination. The caller verifies the archive, then :func:`finalise` checks and
converts every staged unit and :func:`place_all` renames them into place, all of them or none (the
outcome does not depend on the order of the tasks); until then nothing a reader looks at changes, and
:func:`discard` removes the staging folders on any failure or Ctrl-C. A folder replaced with
``fetch.force`` is renamed aside (``.<name>.replaced-<pid>``) and removed once the new one is in
place; :func:`recover` finishes that for a fetch that was stopped part-way (it removes the old copy
when the new one is in place, and renames it back when not).

Member names: a leading ``./`` is dropped, and with ``nested="lra_release"`` every leading
``lra_release/``. The LRA release holds two copies of some folders (``lra_release/listops-1000`` and
``lra_release/lra_release/listops-1000``, the same for ``pathfinder128``; reported in
google-research/long-range-arena#38): each unit takes the deepest copy, the one the LRA authors'
``dataset_setup.sh`` moves into place.

One rule for what the original archives never hold, wherever it is in the archive (in a member a task
takes or not): a name that is absolute or climbs out (``..``), a symbolic or hard link, a device or
FIFO. Each stops the extraction with an error naming the member; nothing is put in place (a link
skipped in silence would turn a linked folder into a plain one, so skipping is not offered).
"""
from __future__ import annotations

import os
import shutil
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Optional

from lra.badinput import BadInputError

CHUNK = 1 << 20
STAGING = ".fetching-"
REPLACED = ".replaced-"


@dataclass(frozen=True)
class Unit:
    task: str
    source: str                       # key of the archive it comes from (lra.data.fetch.SOURCES)
    dest: Path                        # the folder the reader reads
    members: tuple[str, ...]          # archive names (normalised): files, or folders ending in "/"
    strip: str                        # cut from the front of a member's name: the rest is its path under dest
    required: tuple[str, ...] = ()    # paths under dest a complete unit has
    convert: Optional[Callable[[Path], None]] = None  # turns the staged members into what the reader reads
    use: str = ""                     # the command that reads it
    note: str = ""                    # a warning shown when it is fetched

    def relative(self, name: str) -> Optional[str]:
        """Path under ``dest`` of archive member ``name``, or None when the unit does not take it."""
        for m in self.members:
            if name == m or (m.endswith("/") and name.startswith(m)):
                return name[len(self.strip):]
        return None

    def missing(self, folder: Path) -> list[str]:
        """What a complete ``folder`` lacks (empty list: complete)."""
        if self.required:
            return [r for r in self.required if not (folder / r).exists()]
        return [] if folder.exists() and any(folder.iterdir()) else ["its files"]


def staging_dir(unit: Unit) -> Path:
    return unit.dest.parent / f".{unit.dest.name}{STAGING}{os.getpid()}"


def stale_staging(unit: Unit) -> list[Path]:
    """Staging folders a killed earlier fetch left beside ``unit.dest``."""
    if not unit.dest.parent.is_dir():
        return []
    return sorted(unit.dest.parent.glob(f".{unit.dest.name}{STAGING}*"))


def leftovers(unit: Unit) -> list[Path]:
    """Staging folders and replaced copies a stopped fetch left beside ``unit.dest`` (see :func:`recover`)."""
    if not unit.dest.parent.is_dir():
        return []
    return stale_staging(unit) + sorted(unit.dest.parent.glob(f".{unit.dest.name}{REPLACED}*"))


def replaced_dir(dest: Path) -> Path:
    """Where :func:`place_all` moves an existing ``dest`` while the new copy takes its place."""
    return dest.with_name(f".{dest.name}{REPLACED}{os.getpid()}")


def recover(unit: Unit, log: Callable[[str], None] = print) -> None:
    """Finish what a fetch stopped part-way left beside ``unit.dest`` (call it holding the source's
    lock, so that no fetch is running there): staging folders are removed; an old copy renamed aside
    by ``fetch.force`` is removed when the new folder is in place, and renamed back when it is not
    (the replacement never finished: the old data is all there is)."""
    for old in leftovers(unit):
        if STAGING in old.name:
            discard(old)
        elif unit.dest.exists():
            log(f"[fetch] {unit.task}: removing {old}, the old copy an interrupted fetch.force left")
            shutil.rmtree(old)
        else:
            os.rename(old, unit.dest)
            log(f"[fetch] {unit.task}: {unit.dest} restored from {old}, where an interrupted fetch.force left it")


def normalise(name: str, nested: Optional[str]) -> tuple[str, int]:
    """``(name without ./ and nested prefixes, how many nested prefixes were cut)``."""
    while name.startswith("./"):
        name = name[2:]
    depth = 0
    while nested and name.startswith(nested + "/"):
        name, depth = name[len(nested) + 1:], depth + 1
    return name, depth


def _unsafe(name: str) -> bool:
    """Absolute, or climbs out with ``..`` (str.split: it runs for every member of millions)."""
    return name.startswith("/") or ".." in name.split("/")


def refusal(member: tarfile.TarInfo) -> Optional[str]:
    """Why ``member`` stops the extraction (the rule in the module docstring), or None."""
    if _unsafe(member.name):
        return f"a member named {member.name!r}, which points outside its folder"
    if member.issym() or member.islnk():
        kind = "symbolic" if member.issym() else "hard"
        return f"a {kind} link {member.name!r} -> {member.linkname!r}"
    if not (member.isfile() or member.isdir()):
        return f"a device or FIFO member {member.name!r}"
    return None


def extract(tar_stream: IO[bytes], units: list[Unit], staging: dict[Unit, Path], nested: Optional[str],
            archive: str) -> dict[Unit, int]:
    """Write the members of every unit under ``staging[unit]/d<depth>/``; returns files per unit."""
    counts = {u: 0 for u in units}
    with tarfile.open(fileobj=tar_stream, mode="r|") as tar:
        for member in tar:
            why = refusal(member)
            if why:
                raise BadInputError(f"{archive} has {why}: the extraction stopped there and nothing was put in place "
                                    f"(archives are refused for absolute names, '..', links and devices wherever "
                                    f"they are). This is not the original archive; get that one")
            name, depth = normalise(member.name, nested)
            for unit in units:
                rel = unit.relative(name)
                if rel is None:
                    continue
                if not member.isfile():
                    break  # folders are created as files arrive
                target = staging[unit] / f"d{depth}" / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                src = tar.extractfile(member)
                with open(target, "wb") as out:
                    shutil.copyfileobj(src, out, CHUNK)
                counts[unit] += 1
                break
    return counts


def finalise(unit: Unit, staged: Path, archive: str, log: Callable[[str], None] = print) -> Path:
    """The staged copy to use (the deepest), checked complete and converted; returns its folder."""
    copies = sorted((p for p in staged.glob("d*") if p.is_dir()), key=lambda p: int(p.name[1:]))
    if not copies:
        raise BadInputError(f"{archive} has none of {', '.join(unit.members)} ({unit.task}): it is not the "
                            f"expected archive; nothing was put in place")
    chosen = copies[-1]
    if len(copies) > 1:
        log(f"[fetch] {unit.task}: {archive} holds {len(copies)} copies of {', '.join(unit.members)}; using the "
            f"innermost one ({'lra_release/' * int(chosen.name[1:])}{unit.strip})")
    ready = staged / "ready"
    os.rename(chosen, ready)
    for m in unit.members:
        rel = ready / m[len(unit.strip):]
        if not rel.exists() or (m.endswith("/") and not any(rel.iterdir())):
            raise BadInputError(f"{archive} has no {m} ({unit.task}): it is not the expected archive (or a "
                                f"truncated one); nothing was put in place")
    if unit.convert is not None:
        unit.convert(ready)
    lacking = unit.missing(ready)
    if lacking:
        raise BadInputError(f"{archive} gave an incomplete {unit.task} folder (no {', '.join(lacking)}); nothing "
                            f"was put in place")
    return ready


def place_all(pairs: list[tuple[Path, Path]]) -> list[Path]:
    """Rename each ``ready`` folder to its ``dest``, all or none: an existing ``dest`` (``fetch.force``)
    is renamed aside first, and a failure or Ctrl-C part-way renames everything back, so a later
    failure never leaves some tasks new and others old. Returns the old copies; the caller removes
    them (:func:`shutil.rmtree`) once it has said what is in place, and :func:`recover` removes what
    an interrupted removal left."""
    moved: list[list] = []  # [ready, dest, old copy or None, ready renamed to dest]
    try:
        for ready, dest in pairs:
            dest.parent.mkdir(parents=True, exist_ok=True)
            step = [ready, dest, None, False]
            moved.append(step)
            if dest.exists():
                step[2] = replaced_dir(dest)
                os.rename(dest, step[2])
            os.rename(ready, dest)
            step[3] = True
    except BaseException:
        for ready, dest, old, placed in reversed(moved):
            try:
                if placed:
                    os.rename(dest, ready)
                if old is not None:
                    os.rename(old, dest)
            except OSError:
                pass  # left for recover(): it renames the old copy back when dest is not there
        raise
    return [old for _, _, old, _ in moved if old is not None]


def discard(path: Path) -> None:
    shutil.rmtree(path, ignore_errors=True)


def folder_size(folder: Path, skip: str = "") -> tuple[int, int]:
    """(files, bytes) under ``folder``, leaving out files named ``skip``."""
    files = size = 0
    for root, _, names in os.walk(folder):
        for n in names:
            if n == skip:
                continue
            files += 1
            size += os.path.getsize(os.path.join(root, n))
    return files, size
