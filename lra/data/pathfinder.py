"""Pathfinder and Path-X (LRA): generated release, release reader, seeded split, DataModule.

Layout (the LRA release's, also what the generator writes)::

    pathfinder<res>/<folder>/imgs/<k>/sample_<i>.png     8-bit grey, res x res
    pathfinder<res>/<folder>/metadata/<k>.npy            one row per image

``<folder>`` is ``curv_baseline`` (easy), ``curv_contour_length_9`` (intermediate) or
``curv_contour_length_14`` (hard; what LRA reports). In the release the metadata files are TEXT
despite their name (space-separated: field 0 ``imgs/<k>``, field 1 file name, field 3 label); the
generator writes real ``np.save`` string arrays with the same columns (unicode under Python 3, bytes
under Python 2, as the original generator ran); all three are read (the ``\\x93NUMPY`` magic decides). Empty PNGs (the release has some) are skipped and counted; other unreadable PNGs
and bad metadata rows go through :class:`lra.badinput.BadInput` (skip and count, fail above 1%).

Tokens: the 8-bit pixel values row-major (``res * res`` tokens, vocabulary 256), NO padding: every
length is ``res * res`` so pixel 0 is a real token (ports that build the mask as ``ids != 0`` mask
black pixels; not here).

Split (``task.datamodule.split``): ``lra`` (default) reproduces LRA's. LRA's tfds builder
(``lra_benchmarks/data/pathfinder.py``) yields every metadata row under the key
``f"{field0}_{field1}_{n}"`` (``imgs/<k>_sample_<i>.png_<n>``, ``n`` = the row's 1-based number in its
metadata file) into the tfds split named by the difficulty (``easy``/``intermediate``/``hard``); tfds
stores a split in ``md5(split name + key)`` order (:func:`lra.data.tfds_source.tfds_order`), and LRA's
input pipeline takes ``[:80%]``, ``[80%:90%]``, ``[90%:]`` of that order (tfds rounds each boundary
to the closest example) and only THEN drops empty images. So the order is derived over every row,
empty and unreadable ones included, and those are dropped after the cut; each split keeps tfds's
order. ``seeded`` is the earlier split: the images in metadata order permuted with
``numpy.random.default_rng(split_seed)`` and cut 80/10/10.

Path-X is ``resolution=128, difficulty=hard`` (16384 tokens), configured as ``task=pathx``.
"""
from __future__ import annotations

import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any, Iterator

import numpy as np
from filelock import FileLock
from PIL import Image

from lra.data import layout, tfds_source
from lra.badinput import BadInput, BadInputError, ConfigError, DataMissingError
from lra.data.cache import MARKER, is_complete, save_split, settings_key
from lra.data.datamodule import CachedDataModule
from lra.data.pathfinder_gen import DIFFICULTIES, RESOLUTIONS, generate_release, lra_params
from lra.data.workers import WorkerPool

log = logging.getLogger(__name__)
NPY_MAGIC = b"\x93NUMPY"
SPLITS = ("lra", "seeded")


# ----------------------------------------------------------------------------- reader
def _folder_order(path: Path) -> tuple:
    return (0, int(path.stem), "") if path.stem.isdigit() else (1, 0, path.stem)


def _text(field: object) -> str:
    """One metadata field as text: ``np.save`` of Python 2 ``str`` rows (the original generator) stores
    bytes (dtype ``S``), Python 3 stores unicode (dtype ``U``); ``str(b'imgs/0')`` would be ``"b'imgs/0'"``."""
    return field.decode("utf-8", "replace") if isinstance(field, bytes) else str(field)


def read_metadata(path: Path) -> Iterator[tuple[int, list[str]]]:
    """(line number, fields) of one metadata file: text, or a real ``.npy`` of unicode or bytes strings."""
    path = Path(path)
    with open(path, "rb") as f:
        magic = f.read(len(NPY_MAGIC))
    if magic == NPY_MAGIC:
        rows = np.load(path, allow_pickle=False)
        for i, row in enumerate(np.atleast_2d(rows), 1):
            yield i, [_text(x) for x in row]
        return
    with open(path, encoding="utf-8", errors="replace") as f:
        for i, line in enumerate(f, 1):
            if line.strip():
                yield i, line.split()


def _read_folder(args: tuple) -> dict[str, Any]:
    """Read the images one metadata file lists. Returns pixels, labels and what went wrong."""
    root, meta, res = args
    root, meta = Path(root), Path(meta)
    pixels, labels, bad, empty, total, keys, all_keys = [], [], [], 0, 0, [], []
    try:
        rows = list(read_metadata(meta))
    except Exception as e:  # unreadable metadata: every image it lists is lost, report the file
        return {"pixels": np.zeros((0, res * res), np.uint8), "labels": np.zeros(0, np.int64), "keys": [],
                "all_keys": [], "bad": [(str(meta), f"unreadable metadata ({type(e).__name__}: {e})")], "empty": 0,
                "total": 1}
    for line, fields in rows:
        total += 1
        where = f"{meta}:{line}"
        key = f"{fields[0]}_{fields[1]}_{line}" if len(fields) >= 2 else None  # LRA's tfds example key
        if key is not None:
            all_keys.append(key)
        if len(fields) < 4 or fields[3] not in ("0", "1"):
            bad.append((where, f"expected 'imgs/<k> <file> <n> <label 0|1> ...', got {' '.join(fields)[:120]!r}"))
            continue
        png = root / fields[0] / fields[1]
        try:
            if png.stat().st_size == 0:
                empty += 1
                continue
            with Image.open(png) as im:
                im = im if im.mode == "L" else im.convert("L")
                a = np.asarray(im, dtype=np.uint8)
        except Exception as e:
            bad.append((str(png), f"unreadable PNG ({type(e).__name__}: {e})"))
            continue
        if a.shape != (res, res):
            bad.append((str(png), f"image is {a.shape[1]}x{a.shape[0]}, expected {res}x{res}"))
            continue
        pixels.append(a.reshape(-1))
        labels.append(int(fields[3]))
        keys.append(key)
    return {"pixels": np.stack(pixels) if pixels else np.zeros((0, res * res), np.uint8),
            "labels": np.asarray(labels, np.int64), "keys": keys, "all_keys": all_keys, "bad": bad, "empty": empty,
            "total": total}


def read_release(root: Path, resolution: int, bad: BadInput | None = None, workers: int | None = None,
                 log: Any = print) -> tuple[np.ndarray, np.ndarray]:
    """All images of one difficulty folder in metadata order: ``pixels [M, res*res]`` uint8, labels."""
    pixels, labels, _, _ = read_release_keyed(root, resolution, bad, workers, log)
    return pixels, labels


def read_release_keyed(root: Path, resolution: int, bad: BadInput | None = None, workers: int | None = None,
                       log: Any = print) -> tuple[np.ndarray, np.ndarray, list[str], list[str]]:
    """:func:`read_release` plus LRA's tfds key of every read image and of every metadata row
    (empty and unreadable images included: they count in LRA's split boundaries)."""
    root = Path(root)
    metas = sorted((root / "metadata").glob("*.npy"), key=_folder_order)
    if not metas:
        raise DataMissingError(f"no metadata/*.npy under {root}: point task.datamodule.official_dir at the release's pathfinder<res> folder")
    bad = bad or BadInput(f"pathfinder {root}")
    jobs = [(str(root), str(m), resolution) for m in metas]
    workers = max(1, min(workers or os.cpu_count() or 1, len(jobs)))
    start = time.perf_counter()
    parts, total, empty = [], 0, 0
    with WorkerPool(workers if len(jobs) > 1 else 1) as pool:
        for part in pool.map(_read_folder, jobs):
            for where, why in part["bad"]:
                bad.report(where, why)
            total += part["total"]
            empty += part["empty"]
            parts.append(part)
    bad.finish(total)
    pixels = np.concatenate([p["pixels"] for p in parts])
    labels = np.concatenate([p["labels"] for p in parts])
    keys = [k for p in parts for k in p["keys"]]
    all_keys = [k for p in parts for k in p["all_keys"]]
    if log:
        log(f"[pathfinder] read {len(labels)} of {total} images from {root} in {time.perf_counter() - start:.1f}s "
            f"({empty} empty PNGs skipped, {bad.count} unreadable skipped; {labels.mean() if len(labels) else 0:.1%} positive)")
    if len(labels) == 0:
        raise BadInputError(f"no readable Pathfinder image under {root}: check the release files (or use task.datamodule.source=generate)")
    return pixels, labels, keys, all_keys


def _closest(percent: int, n: int) -> int:
    """tfds's percent-slice boundary (``rounding="closest"``)."""
    return int(round(percent * n / 100.0))


def lra_split_indices(keys: list[str], all_keys: list[str], split_name: str) -> dict[str, np.ndarray]:
    """LRA's ``<split>[:80%]``, ``[80%:90%]``, ``[90%:]`` of tfds's order of ``all_keys``, restricted to
    ``keys`` (the readable images; their positions are returned, in tfds's order)."""
    order = tfds_source.tfds_order(all_keys, split_name)
    n = len(all_keys)
    train, val = (_closest(round(100 * sum(layout.PATHFINDER_SPLIT[:i])), n) for i in (1, 2))  # percents, as tfds
    cuts = {"train": (0, train), "val": (train, val), "test": (val, n)}
    position = {k: i for i, k in enumerate(keys)}
    return {split: np.array([position[all_keys[j]] for j in order[a:b] if all_keys[j] in position], dtype=np.int64)
            for split, (a, b) in cuts.items()}


def split_indices(n: int, seed: int, fractions: tuple[float, float, float] = layout.PATHFINDER_SPLIT) -> dict[str, np.ndarray]:
    """Deterministic seeded 80/10/10 partition of ``range(n)`` (each part sorted)."""
    perm = np.random.default_rng(seed).permutation(n)
    n_train, n_val = int(round(fractions[0] * n)), int(round(fractions[1] * n))
    return {"train": np.sort(perm[:n_train]), "val": np.sort(perm[n_train:n_train + n_val]),
            "test": np.sort(perm[n_train + n_val:])}


# ----------------------------------------------------------------------------- DataModule
class PathfinderDataModule(CachedDataModule):
    task_name = "pathfinder"
    fixed_length = True

    def __init__(
        self,
        data_dir: str,
        max_len: int = 1024,
        batch_size: int = 256,
        resolution: int = 32,
        difficulty: str = "hard",
        source: str = "generate",
        official_dir: str | None = None,
        generator: dict[str, Any] | None = None,
        split: str = "lra",
        split_seed: int = 0,
        on_error: str = "skip",
        max_bad_fraction: float = 0.01,
        **kwargs: Any,
    ) -> None:
        super().__init__(data_dir, max_len, batch_size, **kwargs)
        resolution = int(resolution)
        if resolution not in RESOLUTIONS:
            raise ConfigError(f"task.resolution={resolution} not supported; valid: {', '.join(map(str, RESOLUTIONS))}")
        if difficulty not in DIFFICULTIES:
            raise ConfigError(f"task.difficulty={difficulty!r}; valid: {', '.join(DIFFICULTIES)}")
        if max_len != resolution * resolution:
            raise ConfigError(f"task.max_len={max_len} must equal resolution^2 = {resolution * resolution} "
                             f"(pathfinder images are read whole, one token per pixel)")
        if split not in SPLITS:
            raise ConfigError(f"unknown task.datamodule.split={split!r}; valid: {', '.join(SPLITS)}")
        if source not in ("generate", "official"):
            raise ConfigError(f"unknown task.datamodule.source={source!r}; valid: generate, official")
        BadInput("pathfinder", on_error, max_bad_fraction)  # validates the policy early
        self.resolution, self.difficulty, self.source = resolution, difficulty, source
        self.folder = DIFFICULTIES[difficulty][0]
        self.split, self.split_seed = split, int(split_seed)
        self.on_error, self.max_bad_fraction = on_error, float(max_bad_fraction)
        gen = {"seed": 0, "n_images": 200_000, "per_folder": 1000, "workers": None, "params": {}}
        gen.update(dict(generator or {}))
        self.gen = gen
        self.params = lra_params(resolution, difficulty, **dict(gen.get("params") or {}))
        self.official_dir = layout.PATHFINDER.at(self.data_dir, official_dir, resolution)
        if source == "official" and resolution == 128:
            log.warning(layout.PATHX_WARNING[0].upper() + layout.PATHX_WARNING[1:])
        if source == "official" and not is_complete(self.cache_dir):
            self._check_official()

    # -- where the release files are --------------------------------------------------------
    def _generated_key(self) -> dict[str, Any]:
        return {"params": self.params.as_dict(), "seed": int(self.gen["seed"]),
                "n_images": int(self.gen["n_images"]), "per_folder": int(self.gen["per_folder"])}

    def release_dir(self) -> Path:
        """The difficulty folder read to build the cache."""
        if self.source == "official":
            return self.official_dir / self.folder
        key = settings_key(self._generated_key())
        return self.data_dir.resolve() / "pathfinder" / f"generated-{key}" / f"pathfinder{self.resolution}" / self.folder

    def _check_official(self) -> None:
        folder = self.official_dir / self.folder
        if not (folder / "metadata").is_dir():
            args = (f" task.resolution={self.resolution}" if self.resolution != 32 else "") + (
                f" task.difficulty={self.difficulty}" if self.difficulty != "hard" else "")
            raise DataMissingError(
                f"Pathfinder release folder missing: {folder / 'metadata'} not found. Get it with: python run.py "
                f"mode=fetch task=pathfinder{args} (reads the LRA release lra_release.gz as it downloads and keeps only "
                f"pathfinder{self.resolution}/{self.folder}/). Or download lra_release.gz from "
                f"the Long Range Arena GitHub release, unpack it, and point task.datamodule.official_dir at its "
                f"'pathfinder{self.resolution}' folder (it holds {', '.join(f for f, _ in DIFFICULTIES.values())}); "
                f"or use task.datamodule.source=generate to generate the images here")

    def check_sources(self) -> None:
        if self.source == "official":
            self._check_official()

    def settings(self) -> dict[str, Any]:
        src = {"official": str(self.official_dir.resolve())} if self.source == "official" else {"generated": self._generated_key()}
        return {"format": 1, "resolution": self.resolution, "difficulty": self.difficulty,
                "split": self.split, **({"split_seed": self.split_seed} if self.split == "seeded" else {}),
                "fractions": list(layout.PATHFINDER_SPLIT), **src}

    # -- building ---------------------------------------------------------------------------
    def _generate(self) -> Path:
        """Generate the release folder once (resumable: finished sub-folders are kept)."""
        folder = self.release_dir()
        if is_complete(folder):
            return folder
        folder.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(folder) + ".lock"):
            if is_complete(folder):
                return folder
            partial = folder.with_name(folder.name + ".partial")
            partial.mkdir(parents=True, exist_ok=True)
            n = int(self.gen["n_images"])
            print(f"[pathfinder] generating {n} images of pathfinder{self.resolution}/{self.folder} into {partial}")
            start = time.perf_counter()
            generate_release(partial, self.params, n, seed=int(self.gen["seed"]), per_folder=int(self.gen["per_folder"]),
                             workers=self.gen.get("workers"))
            elapsed = time.perf_counter() - start
            print(f"[pathfinder] generated {n} images in {elapsed:.1f}s: {n / max(elapsed, 1e-9):.1f} images/s")
            (partial / MARKER).write_text("ok\n")
            if folder.exists():
                shutil.rmtree(folder)
            os.rename(partial, folder)
        return folder

    def build(self, directory: Path) -> None:
        folder = self._generate() if self.source == "generate" else self.release_dir()
        if self.source == "official":
            self._check_official()
        bad = BadInput(f"pathfinder{self.resolution}/{self.folder}", self.on_error, self.max_bad_fraction)
        pixels, labels, keys, all_keys = read_release_keyed(folder, self.resolution, bad, workers=self.gen.get("workers"))
        n = self.resolution * self.resolution
        parts = (lra_split_indices(keys, all_keys, self.difficulty) if self.split == "lra"
                 else split_indices(len(labels), self.split_seed))
        for split, idx in parts.items():
            save_split(directory, split, pixels[idx], np.full(len(idx), n, np.int32), labels[idx])
