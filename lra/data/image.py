"""Image (LRA sequential CIFAR-10): reader, LRA grey conversion, DataModule.

Data: CIFAR-10 from either

* ``tfds``: the ``cifar10`` dataset of tensorflow-datasets (array_record) read with
  ``tfds.data_source`` (no TensorFlow), or
* ``folder``: the original python pickles ``cifar-10-batches-py/{data_batch_1..5,test_batch}``, put in
  tfds's record order (keys = the running index of the batch files, as tfds's builder uses; see
  :mod:`lra.data.tfds_source`), so both sources give the same splits.

``source=auto`` (default) uses the folder when it exists, tfds otherwise. Splits as LRA:
``train[:90%]`` (45k) / ``train[90%:]`` (5k) / ``test`` (10k).

Tokens: LRA converts with ``tf.image.rgb_to_grayscale`` then casts to uint8, i.e. in float32
``floor((0.2989 R + 0.5870 G + 0.1140 B) / 255 * 255.5)`` (NOT PIL's ``convert('L')``, which rounds
``(299 R + 587 G + 114 B) / 1000``); the 1024 grey values row-major are the tokens (vocabulary 256,
no normalisation). No padding: every length is 1024, so black pixels (value 0) are real tokens.
"""
from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import numpy as np

from lra.data import layout, tfds_source
from lra.badinput import BadInputError, ConfigError, DataMissingError
from lra.data.cache import save_split
from lra.data.datamodule import CachedDataModule

SOURCES = ("auto", "tfds", "folder")
GREY_WEIGHTS = np.array([0.2989, 0.5870, 0.1140], dtype=np.float32)
SEQ_LEN = 1024


def lra_grey(rgb: np.ndarray) -> np.ndarray:
    """``[..., 3]`` uint8 RGB -> ``[...]`` uint8 grey exactly as tf.image.rgb_to_grayscale + uint8 cast:
    scale to [0, 1] in float32, weighted sum, times 255.5, truncate."""
    x = rgb.astype(np.float32) * np.float32(1.0 / 255.0)
    grey = x[..., 0] * GREY_WEIGHTS[0] + x[..., 1] * GREY_WEIGHTS[1] + x[..., 2] * GREY_WEIGHTS[2]
    return (grey * np.float32(255.5)).astype(np.uint8)


def read_cifar_folder(root: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    """``[M, 32, 32, 3]`` uint8 images and labels of the python pickles, in tfds's record order."""
    images, labels = [], []
    for name in layout.CIFAR_FILES[split]:
        path = Path(root) / name
        if not path.exists():
            raise DataMissingError(f"CIFAR-10 file missing: {path} (expected the unpacked cifar-10-python.tar.gz)")
        try:
            with open(path, "rb") as f:
                batch = pickle.load(f, encoding="bytes")
            data = np.asarray(batch[b"data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)
            lab = np.asarray(batch[b"labels"], dtype=np.int64)
        except Exception as e:
            raise BadInputError(f"CIFAR-10 file {path} is unreadable ({type(e).__name__}: {e}); re-download cifar-10-python.tar.gz") from e
        if len(data) != len(lab):
            raise BadInputError(f"CIFAR-10 file {path}: {len(data)} images but {len(lab)} labels")
        images.append(data)
        labels.append(lab)
    images_a, labels_a = np.concatenate(images), np.concatenate(labels)
    order = tfds_source.tfds_order(range(len(labels_a)), split)
    return images_a[order], labels_a[order]


class ImageDataModule(CachedDataModule):
    task_name = "image"
    fixed_length = True

    def __init__(
        self,
        data_dir: str,
        max_len: int = SEQ_LEN,
        batch_size: int = 256,
        source: str = "auto",
        tfds_data_dir: str | None = None,
        cifar_dir: str | None = None,
        train_fraction: float = 0.9,
        **kwargs: Any,
    ) -> None:
        super().__init__(data_dir, max_len, batch_size, **kwargs)
        if max_len != SEQ_LEN:
            raise ConfigError(f"task.max_len={max_len} must be {SEQ_LEN} for image (32x32 pixels, one token each)")
        if source not in SOURCES:
            raise ConfigError(f"unknown task.datamodule.source={source!r}; valid: {', '.join(SOURCES)}")
        if not 0.0 < train_fraction < 1.0:
            raise ConfigError(f"task.datamodule.train_fraction={train_fraction} must lie in (0, 1)")
        self.tfds_dir = Path(tfds_data_dir).expanduser() if tfds_data_dir else tfds_source.default_tfds_dir()
        self.cifar_dir = layout.CIFAR.at(self.data_dir, cifar_dir)
        exists = (self.cifar_dir / layout.CIFAR.files[0]).exists()
        self.source = ("folder" if exists else "tfds") if source == "auto" else source
        if self.source == "folder" and not exists:
            raise DataMissingError(self._missing_folder())
        self.train_fraction = float(train_fraction)

    def _fetch(self) -> str:
        return (f"Get it with: python run.py mode=fetch task=image (downloads cifar-10-binary.tar.gz, 170 MB, checks "
                f"it against tensorflow-datasets' checksum and writes the batches into {self.cifar_dir}; no TensorFlow).")

    def _missing_folder(self) -> str:
        return (f"CIFAR-10 pickles not found: {self.cifar_dir / layout.CIFAR.files[0]} is missing. {self._fetch()} Or download "
                f"cifar-10-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html and unpack it so that "
                f"{self.cifar_dir}/data_batch_1 exists (or set task.datamodule.cifar_dir); "
                f"or provide the tfds dataset with task.datamodule.source=tfds")

    def settings(self) -> dict[str, Any]:
        where = str(self.cifar_dir.resolve()) if self.source == "folder" else str(self.tfds_dir.resolve())
        return {"format": 1, "source": self.source, "path": where, "train_fraction": self.train_fraction}

    def _alternative(self) -> str:
        return (f"\nAlternatively unpack cifar-10-python.tar.gz (https://www.cs.toronto.edu/~kriz/cifar.html) so that "
                f"{self.cifar_dir}/data_batch_1 exists.")

    def check_sources(self) -> None:
        if self.source == "tfds":
            tfds_source.require("cifar10", self.tfds_dir, self._alternative(), fetch=self._fetch())

    def _read(self, split: str) -> tuple[np.ndarray, np.ndarray]:
        if self.source == "folder":
            return read_cifar_folder(self.cifar_dir, split)
        ds = tfds_source.load("cifar10", split, self.tfds_dir, alternative=self._alternative(), fetch=self._fetch())
        images, labels = [], []
        for ex in tfds_source.records(ds):
            images.append(np.asarray(ex["image"], dtype=np.uint8))
            labels.append(int(ex["label"]))
        return np.stack(images), np.asarray(labels, np.int64)

    def build(self, directory: Path) -> None:
        train_images, train_labels = self._read("train")
        test_images, test_labels = self._read("test")
        for name, imgs in (("train", train_images), ("test", test_images)):
            if imgs.ndim != 4 or imgs.shape[1:] != (32, 32, 3):
                raise BadInputError(f"CIFAR-10 {name} images have shape {imgs.shape[1:]}, expected (32, 32, 3)")
        cut = int(round(self.train_fraction * len(train_labels)))  # tfds: train[:90%] of 50k = 45k
        parts = {"train": (train_images[:cut], train_labels[:cut]), "val": (train_images[cut:], train_labels[cut:]),
                 "test": (test_images, test_labels)}
        for split, (imgs, labels) in parts.items():
            ids = lra_grey(imgs).reshape(len(imgs), SEQ_LEN)
            save_split(directory, split, ids, np.full(len(ids), SEQ_LEN, np.int32), labels)
        print(f"[image] {cut} train / {len(train_labels) - cut} val / {len(test_labels)} test images from {self.source}")
