"""Text (LRA byte-level IMDb sentiment): reader, byte tokenisation, DataModule.

Data: IMDb reviews, 25k train / 25k test, labels neg=0 / pos=1, from either

* ``tfds``: the ``imdb_reviews`` dataset of tensorflow-datasets, prepared as array_record and read
  with ``tfds.data_source`` (no TensorFlow), or
* ``folder``: the original archive unpacked (``aclImdb/{train,test}/{neg,pos}/*.txt``); texts are
  stripped like tfds does and put in tfds's record order (see :mod:`lra.data.tfds_source`; keys are the
  archive paths ``aclImdb/train/pos/0_9.txt``), so both sources give the same arrays.

``source=auto`` (default) uses the folder when it exists, tfds otherwise.

Tokens (LRA): UTF-8 bytes + 1, 0 = padding, truncated/padded to ``max_len`` (4000 as in the LRA
paper, Nyströmformer and AdaMRA; the LRA public config uses 1000). Validation: LRA evaluates on the
test split and has no validation split, so ``val_split=test`` (default) makes val = test;
``val_split=train_holdout`` holds out ``holdout_fraction`` of train (seeded permutation) instead.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from lra.data import bytes as byte_tok
from lra.data import layout, tfds_source
from lra.badinput import BadInput, ConfigError, DataMissingError
from lra.data.cache import save_split
from lra.data.datamodule import CachedDataModule

SOURCES = ("auto", "tfds", "folder")
VAL_SPLITS = ("test", "train_holdout")


def read_imdb_folder(root: Path, split: str, bad: BadInput | None = None) -> tuple[list[bytes], np.ndarray]:
    """Texts and labels of ``aclImdb/<split>`` in tfds's record order."""
    root = Path(root)
    keys, texts, labels = [], [], []
    for label, name in enumerate(layout.IMDB_LABELS):
        d = root / split / name
        if not d.is_dir():
            raise DataMissingError(f"IMDb folder incomplete: {d} is missing (expected the unpacked aclImdb_v1.tar.gz)")
        for f in sorted(d.glob("*.txt")):
            try:
                text = f.read_bytes().strip()
            except OSError as e:
                if bad is None:
                    raise
                bad.report(str(f), f"unreadable ({e.strerror})")
                continue
            keys.append(f"aclImdb/{split}/{name}/{f.name}")
            texts.append(text)
            labels.append(label)
    order = tfds_source.tfds_order(keys, split)
    return [texts[i] for i in order], np.asarray(labels, np.int64)[order]


class TextDataModule(CachedDataModule):
    task_name = "text"

    def __init__(
        self,
        data_dir: str,
        max_len: int = 4000,
        batch_size: int = 32,
        source: str = "auto",
        tfds_data_dir: str | None = None,
        imdb_dir: str | None = None,
        val_split: str = "test",
        holdout_fraction: float = 0.1,
        holdout_seed: int = 0,
        on_error: str = "skip",
        max_bad_fraction: float = 0.01,
        **kwargs: Any,
    ) -> None:
        super().__init__(data_dir, max_len, batch_size, **kwargs)
        if source not in SOURCES:
            raise ConfigError(f"unknown task.datamodule.source={source!r}; valid: {', '.join(SOURCES)}")
        if val_split not in VAL_SPLITS:
            raise ConfigError(f"unknown task.datamodule.val_split={val_split!r}; valid: {', '.join(VAL_SPLITS)}")
        if val_split == "train_holdout" and not 0.0 < holdout_fraction < 1.0:
            raise ConfigError(f"task.datamodule.holdout_fraction={holdout_fraction} must lie in (0, 1)")
        BadInput("imdb", on_error, max_bad_fraction)  # validates the policy early
        self.tfds_dir = Path(tfds_data_dir).expanduser() if tfds_data_dir else tfds_source.default_tfds_dir()
        self.imdb_dir = layout.IMDB.at(self.data_dir, imdb_dir)
        self.source = ("folder" if (self.imdb_dir / "train").is_dir() else "tfds") if source == "auto" else source
        if self.source == "folder" and not (self.imdb_dir / "train").is_dir():
            raise DataMissingError(self._missing_folder())
        self.val_split, self.holdout_fraction, self.holdout_seed = val_split, float(holdout_fraction), int(holdout_seed)
        self.on_error, self.max_bad_fraction = on_error, float(max_bad_fraction)

    def _fetch(self) -> str:
        return (f"Get it with: python run.py mode=fetch task=text (downloads aclImdb_v1.tar.gz, 84 MB, checks it "
                f"against tensorflow-datasets' checksum and unpacks it into {self.imdb_dir}; no TensorFlow).")

    def _missing_folder(self) -> str:
        return (f"IMDb folder {self.imdb_dir}/train not found. {self._fetch()} Or download aclImdb_v1.tar.gz from "
                f"https://ai.stanford.edu/~amaas/data/sentiment/ and unpack it "
                f"so that {self.imdb_dir}/train/pos exists (or set task.datamodule.imdb_dir); or provide the tfds "
                f"dataset with task.datamodule.source=tfds")

    def settings(self) -> dict[str, Any]:
        where = str(self.imdb_dir.resolve()) if self.source == "folder" else str(self.tfds_dir.resolve())
        out = {"format": 1, "max_len": self.max_len, "source": self.source, "path": where, "val_split": self.val_split}
        if self.val_split == "train_holdout":
            out.update(holdout_fraction=self.holdout_fraction, holdout_seed=self.holdout_seed)
        return out

    def _alternative(self) -> str:
        return (f"\nAlternatively unpack aclImdb_v1.tar.gz (https://ai.stanford.edu/~amaas/data/sentiment/) so that "
                f"{self.imdb_dir}/train/pos exists.")

    def check_sources(self) -> None:
        if self.source == "tfds":
            tfds_source.require("imdb_reviews", self.tfds_dir, self._alternative(), fetch=self._fetch())

    def _read(self, split: str, bad: BadInput) -> tuple[list[bytes], np.ndarray]:
        if self.source == "folder":
            return read_imdb_folder(self.imdb_dir, split, bad)
        ds = tfds_source.load("imdb_reviews", split, self.tfds_dir, alternative=self._alternative(), fetch=self._fetch())
        texts, labels = [], []
        for ex in tfds_source.records(ds):
            texts.append(byte_tok.as_bytes(ex["text"]))
            labels.append(int(ex["label"]))
        return texts, np.asarray(labels, np.int64)

    def build(self, directory: Path) -> None:
        bad = BadInput(f"imdb ({self.source})", self.on_error, self.max_bad_fraction)
        train_texts, train_labels = self._read("train", bad)
        test_texts, test_labels = self._read("test", bad)
        bad.finish(len(train_texts) + len(test_texts) + bad.count)
        if self.val_split == "train_holdout":
            perm = np.random.default_rng(self.holdout_seed).permutation(len(train_texts))
            k = int(round(self.holdout_fraction * len(train_texts)))
            val_idx, train_idx = np.sort(perm[:k]), np.sort(perm[k:])
            val = ([train_texts[i] for i in val_idx], train_labels[val_idx])
            train = ([train_texts[i] for i in train_idx], train_labels[train_idx])
        else:
            train, val = (train_texts, train_labels), None
        ids, lengths = byte_tok.encode(train[0], self.max_len)
        save_split(directory, "train", ids, lengths, train[1])
        ids, lengths = byte_tok.encode(test_texts, self.max_len)
        save_split(directory, "test", ids, lengths, test_labels)
        if val is None:  # LRA: validation = test; share the files instead of storing them twice
            for kind in ("ids", "lengths", "labels"):
                _link_or_copy(directory / f"test_{kind}.npy", directory / f"val_{kind}.npy")
        else:
            ids, lengths = byte_tok.encode(val[0], self.max_len)
            save_split(directory, "val", ids, lengths, val[1])
        print(f"[text] {len(train[0])} train / {len(val[0]) if val else len(test_texts)} val / {len(test_texts)} test "
              f"reviews from {self.source}, max_len {self.max_len}")


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)
    except OSError:
        import shutil

        shutil.copyfile(src, dst)
