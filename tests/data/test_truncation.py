"""``task.max_len`` below the data's length: the cut is warned about and kept for the run record."""
from __future__ import annotations

import logging
from pathlib import Path

import numpy as np

from lra.data.cache import save_split
from lra.data.datamodule import CachedDataModule


class _Toy(CachedDataModule):
    """Four training sequences of true lengths 3, 12, 8, 5 stored with cap ``max_len``."""

    task_name = "toy"

    def settings(self) -> dict:
        return {"max_len": self.max_len, "fixed": self.fixed_length}

    def build(self, directory: Path) -> None:
        true = np.array([3, 12, 8, 5])
        lengths = np.minimum(true, self.max_len)
        ids = np.zeros((4, self.max_len), np.int64)
        for split in ("train", "val", "test"):
            save_split(directory, split, ids, lengths, np.zeros(4, np.int64))


def _setup(dm: CachedDataModule) -> CachedDataModule:
    dm.prepare_data()
    dm.setup()
    return dm


def test_cut_sequences_are_warned_and_counted(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        dm = _setup(_Toy(str(tmp_path), max_len=8))
    assert dm.truncation == {"max_len": 8, "train_sequences_cut": 2, "train_sequences": 4}
    assert "task.max_len=8 cuts 2 of 4 toy training sequences (50.0%)" in caplog.text


def test_no_cut_no_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        dm = _setup(_Toy(str(tmp_path), max_len=13))
    assert dm.truncation is None and "cuts" not in caplog.text


def test_fixed_length_tasks_never_count_a_cut(tmp_path):
    class Fixed(_Toy):
        fixed_length = True

    assert _setup(Fixed(str(tmp_path), max_len=8)).truncation is None
