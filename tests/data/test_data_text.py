"""Text (IMDb, byte level): tfds through mock_data without TensorFlow, the aclImdb folder in tfds's
order, validation = test (LRA) or a held-out slice of train, clear errors without data. (The run.py
end-to-end run of task=text shares one process with retrieval's, in test_data_retrieval.py.)"""
from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np
import pytest
import tensorflow_datasets as tfds

from lra.data.bytes import decode
from lra.data.text import TextDataModule, read_imdb_folder


def make_imdb(root: Path, n: int = 6) -> Path:
    """A tiny unpacked aclImdb/ with n reviews per label and split (plus the unsup folder tfds ignores)."""
    for split in ("train", "test"):
        for label in ("neg", "pos"):
            d = root / "aclImdb" / split / label
            d.mkdir(parents=True)
            for i in range(n):
                body = f"{split} {label} review {i}: <br /><br />caf\u00e9 {'great' if label == 'pos' else 'awful'} film. " * (i + 1)
                (d / f"{i}_{7 if label == 'pos' else 2}.txt").write_text(f"  {body}\n", encoding="utf-8")
    (root / "aclImdb" / "train" / "unsup").mkdir()
    (root / "aclImdb" / "train" / "unsup" / "0_0.txt").write_text("unlabelled")
    return root / "aclImdb"


def test_tfds_source_through_mock_data_without_tensorflow(tmp_path):
    with tfds.testing.mock_data(num_examples=7):
        dm = TextDataModule(str(tmp_path / "data"), max_len=24, batch_size=4, source="tfds", tfds_data_dir=str(tmp_path / "tfds"))
        dm.prepare_data()
        expected = [tfds.data_source("imdb_reviews", split="test", download=False)[i] for i in range(7)]
    assert "tensorflow" not in sys.modules
    dm.setup()
    test = dm.datasets["test"]
    assert len(dm.datasets["train"]) == 7 and len(test) == 7
    for i, ex in enumerate(expected):
        text = ex["text"].encode() if isinstance(ex["text"], str) else ex["text"]
        assert decode(test.ids[i]) == text[:24] and test.lengths[i] == min(len(text), 24)
        assert test.labels[i] == int(ex["label"])
    assert np.array_equal(dm.datasets["val"].ids, test.ids)  # LRA: validation = test


def test_folder_reader_uses_tfds_order_and_raw_bytes(tmp_path):
    root = make_imdb(tmp_path)
    texts, labels = read_imdb_folder(root, "train")
    keys = [f"aclImdb/train/{lab}/{i}_{7 if lab == 'pos' else 2}.txt" for lab in ("neg", "pos") for i in range(6)]
    order = sorted(keys, key=lambda k: int(hashlib.md5(b"train" + k.encode()).hexdigest(), 16))
    assert labels.tolist() == [int("/pos/" in k) for k in order]
    first = order[0].split("/")
    assert texts[0].startswith(f"train {first[2]} review {first[3].split('_')[0]}: <br /><br />caf\u00e9".encode())
    assert texts[0] == texts[0].strip() and len(texts) == 12  # stripped like tfds; unsup ignored


def test_byte_ids_and_holdout_validation(tmp_path):
    root = make_imdb(tmp_path)
    dm = TextDataModule(str(tmp_path / "data"), max_len=40, imdb_dir=str(root), val_split="train_holdout",
                        holdout_fraction=0.25, holdout_seed=1)
    assert dm.source == "folder"
    dm.prepare_data()
    dm.setup()
    train, val, test = dm.datasets["train"], dm.datasets["val"], dm.datasets["test"]
    assert (len(train), len(val), len(test)) == (9, 3, 12)
    texts, _ = read_imdb_folder(root, "train")
    all_train = {t[:40] for t in texts}
    got_train = {decode(x) for x in train.ids}
    got_val = {decode(x) for x in val.ids}
    assert got_train | got_val == all_train and not got_train & got_val
    ids = np.asarray(train.ids)
    assert ids.max() <= 256 and ids.min() >= 0 and (ids[:, 0] > 0).all()  # bytes + 1, 0 = pad
    assert "é".encode()[0] + 1 in np.asarray(train.ids)  # non-ASCII stays as its UTF-8 bytes
    other = TextDataModule(str(tmp_path / "data"), max_len=40, imdb_dir=str(root))
    assert other.cache_dir != dm.cache_dir  # preprocessing settings name the cache


def test_missing_data_names_dataset_and_steps(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"aclImdb/train not found.*aclImdb_v1.tar.gz"):
        TextDataModule(str(tmp_path), max_len=16, source="folder")
    dm = TextDataModule(str(tmp_path), max_len=16, source="tfds", tfds_data_dir=str(tmp_path / "nothing"))
    with pytest.raises(FileNotFoundError, match=r"(?s)'imdb_reviews'.*tfds build imdb_reviews.*array_record.*aclImdb"):
        dm.prepare_data()
