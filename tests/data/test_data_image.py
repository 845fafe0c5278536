"""Image (CIFAR-10 grey pixels): LRA's grey formula on hand-picked colours, tfds through mock_data
without TensorFlow, the python pickles in tfds's order with the 90/10 split, black pixels not masked."""
from __future__ import annotations

import hashlib
import json
import pickle
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow_datasets as tfds
from PIL import Image

from lra.data.image import ImageDataModule, lra_grey

# (R, G, B) -> floor((0.2989 R + 0.5870 G + 0.1140 B) / 255 * 255.5), worked by hand
GREY = {(0, 0, 0): 0, (255, 255, 255): 255, (255, 0, 0): 76, (0, 255, 0): 149, (0, 0, 255): 29,
        (10, 20, 30): 18, (128, 128, 128): 128, (200, 100, 50): 124, (1, 1, 1): 1, (37, 201, 99): 140}


def test_grey_formula_on_hand_picked_colours():
    rgb = np.array(list(GREY), np.uint8).reshape(2, 5, 3)
    assert lra_grey(rgb).ravel().tolist() == list(GREY.values())
    # not PIL's convert('L'), which rounds (299 R + 587 G + 114 B) / 1000: pure green gives 150 there
    assert Image.new("RGB", (1, 1), (0, 255, 0)).convert("L").getpixel((0, 0)) == 150


def _pickles(root: Path, per_batch: int = 4) -> tuple[Path, np.ndarray, np.ndarray]:
    """cifar-10-batches-py with 5 x per_batch train and per_batch test images; train image 3 is black."""
    d = root / "cifar-10-batches-py"
    d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    images = rng.integers(1, 256, (6 * per_batch, 32, 32, 3), dtype=np.uint8)
    images[3] = 0
    labels = rng.integers(0, 10, 6 * per_batch)
    names = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]
    for b, name in enumerate(names):
        part = slice(b * per_batch, (b + 1) * per_batch)
        data = images[part].transpose(0, 3, 1, 2).reshape(per_batch, 3072)  # channel-major rows, as CIFAR
        with open(d / name, "wb") as f:
            pickle.dump({b"data": data, b"labels": labels[part].tolist()}, f)
    return d, images, labels


def test_pickles_in_tfds_order_with_90_10_split_and_black_pixels_unmasked(tmp_path):
    d, images, labels = _pickles(tmp_path)
    dm = ImageDataModule(str(tmp_path / "data"), batch_size=32, cifar_dir=str(d))
    assert dm.source == "folder"
    dm.prepare_data()
    dm.setup()
    order = sorted(range(20), key=lambda i: int(hashlib.md5(b"train" + str(i).encode()).hexdigest(), 16))
    train, val, test = dm.datasets["train"], dm.datasets["val"], dm.datasets["test"]
    assert (len(train), len(val), len(test)) == (18, 2, 4)
    assert np.array_equal(np.asarray(train.labels), labels[order[:18]])
    assert np.array_equal(np.asarray(val.ids), lra_grey(images[order[18:]]).reshape(2, 1024))
    assert np.asarray(train.lengths).tolist() == [1024] * 18
    pos = order.index(3)
    split, row = (train, pos) if pos < 18 else (val, pos - 18)
    item = split[row]
    assert (item["ids"] == 0).all() and item["mask"].all()  # a black image: every pixel is a real token
    batch = next(iter(dm.val_dataloader()))
    assert batch["ids"].shape == (2, 1024) and bool(batch["mask"].all())


def test_tfds_source_through_mock_data_without_tensorflow(tmp_path):
    with tfds.testing.mock_data(num_examples=10):
        dm = ImageDataModule(str(tmp_path / "data"), source="tfds", tfds_data_dir=str(tmp_path / "tfds"))
        dm.prepare_data()
        train = tfds.data_source("cifar10", split="train", download=False)
        first, last = train[0], train[9]
    assert "tensorflow" not in sys.modules
    dm.setup()
    assert [len(dm.datasets[s]) for s in ("train", "val", "test")] == [9, 1, 10]
    assert np.array_equal(dm.datasets["train"].ids[0], lra_grey(first["image"]).reshape(-1))
    assert np.array_equal(dm.datasets["val"].ids[0], lra_grey(last["image"]).reshape(-1))
    assert dm.datasets["val"].labels[0] == int(last["label"])


def test_missing_data_names_dataset_and_steps(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"data_batch_1 is missing.*cifar-10-python.tar.gz"):
        ImageDataModule(str(tmp_path), source="folder")
    dm = ImageDataModule(str(tmp_path), source="tfds", tfds_data_dir=str(tmp_path / "nothing"))
    with pytest.raises(FileNotFoundError, match=r"(?s)'cifar10'.*does not exist.*tfds build cifar10"):
        dm.prepare_data()
    with pytest.raises(ValueError, match="1024"):
        ImageDataModule(str(tmp_path), max_len=1000)


@pytest.mark.slow
def test_image_end_to_end(cli, tmp_path):
    d, _, _ = _pickles(tmp_path, per_batch=8)
    cli("task=image", "model=tiny", "logger=none", "task.batch_size=8", "task.max_steps=2", "task.val_every=2",
        "task.warmup_steps=1", "trainer.enable_progress_bar=false", f"task.datamodule.cifar_dir={d}")
    (rec,) = [json.loads(p.read_text()) for p in (cli.cwd / "results" / "runs").glob("*.json")]
    assert rec["status"] == "finished" and rec["task"] == "image" and 0.0 <= rec["metrics"]["test_acc"] <= 1.0
