"""The shared DataModule: prepare (build the cache once) -> setup (memory-map) -> loaders.

A task subclasses :class:`CachedDataModule` and provides ``task_name``, ``settings()`` (everything
that changes preprocessing: it names the cache) and ``build(tmp_dir)`` (writes the three splits with
:func:`lra.data.cache.save_split`). Batches are dicts ``ids [B, N]``, ``mask [B, N]`` (True = real token)
and ``label [B]``; a two-document task stores ``[M, 2, N]`` ids and gets ``[B, 2, N]`` batches.
"""
from __future__ import annotations

import logging
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, Dataset, default_collate

from lra.badinput import ConfigError
from lra.data.cache import build_once, fingerprint, load_split, settings_key
from lra.files import ensure_writable
from lra.data.sampling import StepStreamSampler

SPLITS = ("train", "val", "test")
log = logging.getLogger(__name__)


class ArrayDataset(Dataset):
    """Indexes memory-mapped arrays; the mask comes from the stored lengths (padding at the end)."""

    def __init__(self, ids: np.ndarray, lengths: np.ndarray, labels: np.ndarray, max_len: int | None = None) -> None:
        self.ids, self.lengths, self.labels = ids, lengths, labels
        self.max_len = max_len or ids.shape[-1]
        self.positions = np.arange(self.max_len)

    def __len__(self) -> int:
        return len(self.labels)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        ids = np.asarray(self.ids[i][..., : self.max_len], dtype=np.int64)
        length = np.asarray(self.lengths[i])
        mask = self.positions[: ids.shape[-1]] < np.minimum(length, self.max_len)[..., None]
        return {
            "ids": torch.from_numpy(ids),
            "mask": torch.from_numpy(mask),
            "label": torch.tensor(int(self.labels[i])),
            "index": torch.tensor(int(i)),  # evaluation batches come length-sorted: predictions are put back in order
        }


class CachedDataModule(pl.LightningDataModule):
    task_name: str = "task"
    fixed_length: bool = False  # True: every example is exactly max_len long (images), nothing is cut
    eval_width_multiple: int = 1  # evaluation batches are cut to a multiple of this (trainer.compile: max_len / 8)

    def __init__(
        self,
        data_dir: str,
        max_len: int,
        batch_size: int = 32,
        eval_batch_size: int | None = None,
        num_workers: int = 0,
        seed: int = 0,
    ) -> None:
        super().__init__()
        if max_len <= 0:
            raise ConfigError(f"task.max_len={max_len} must be positive (the task's sequence length in tokens)")
        if batch_size <= 0:
            raise ConfigError(f"task.batch_size={batch_size} must be positive (e.g. task.batch_size=32)")
        self.data_dir = Path(data_dir).expanduser()
        self.max_len = max_len
        self.batch_size = batch_size
        self.eval_batch_size = eval_batch_size or batch_size
        self.num_workers = num_workers
        self.seed = seed
        self.datasets: dict[str, ArrayDataset] = {}
        self.truncation: dict[str, Any] | None = None

    # -- what a task provides -------------------------------------------------------------
    def settings(self) -> dict[str, Any]:
        raise NotImplementedError

    def build(self, directory: Path) -> None:
        raise NotImplementedError

    def check_sources(self) -> None:
        """Raise :class:`lra.badinput.DataMissingError` when external data the cache needs is absent.

        ``run.py`` calls it before any work when the cache is not built yet; not at construction (so
        configs instantiate on machines without the data) and not in ``prepare_data`` (so mocked
        sources work). Generated data needs nothing."""

    # -- shared machinery -----------------------------------------------------------------
    @property
    def cache_dir(self) -> Path:
        settings = self.settings()
        return self.data_dir.resolve() / self.task_name / f"cache-{settings_key(settings)}"

    def prepare_data(self) -> None:
        ensure_writable(self.data_dir)
        build_once(self.cache_dir, self.build, self.settings())

    @property
    def fingerprint(self) -> str:
        """What the cache holds (:func:`lra.data.cache.fingerprint`); the cache must be built."""
        return fingerprint(self.cache_dir)

    def setup(self, stage: str | None = None) -> None:
        if self.datasets:
            return
        for split in SPLITS:
            self.datasets[split] = ArrayDataset(*load_split(self.cache_dir, split), max_len=self.max_len)
        self.truncation = self._truncation()

    def _truncation(self) -> dict[str, Any] | None:
        """How many training sequences ``max_len`` cuts (stored lengths are capped at ``max_len``, so a
        sequence that fills it is counted as cut); warned about, and kept for the run record."""
        if self.fixed_length:
            return None
        lengths = np.asarray(self.datasets["train"].lengths)
        cut, total = int((lengths >= self.max_len).sum()), int(lengths.size)
        if cut == 0:
            return None
        info = {"max_len": self.max_len, "train_sequences_cut": cut, "train_sequences": total}
        log.warning("task.max_len=%d cuts %d of %d %s training sequences (%.1f%%): they are longer and lose "
                    "their end; raise task.max_len to keep them whole", self.max_len, cut, total, self.task_name,
                    100.0 * cut / max(total, 1))
        return info

    def _loader(self, split: str, sampler: StepStreamSampler | None = None) -> DataLoader:
        # Every loader owns its generator: creating one never draws from the global RNG, so a
        # resumed run's dropout stream matches an uninterrupted run's.
        return DataLoader(
            self.datasets[split],
            batch_size=self.batch_size if split == "train" else self.eval_batch_size,
            sampler=sampler,
            shuffle=False,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
            generator=torch.Generator().manual_seed(self.seed),
        )

    def train_dataloader(self) -> DataLoader:
        trainer = self.trainer
        max_steps = trainer.max_steps if trainer is not None else -1
        if max_steps is None or max_steps <= 0:
            max_steps = -(-len(self.datasets["train"]) // self.batch_size)  # one pass
        accumulate = trainer.accumulate_grad_batches if trainer is not None else 1
        sampler = StepStreamSampler(
            len(self.datasets["train"]), self.batch_size, max_steps * accumulate, self.seed,
            start_step=lambda: trainer.global_step * accumulate if trainer is not None else 0,
            rank=trainer.global_rank if trainer is not None else 0,
            world_size=trainer.world_size if trainer is not None else 1,
        )
        return self._loader("train", sampler)

    def val_dataloader(self) -> DataLoader:
        return self._eval_loader("val")

    def test_dataloader(self) -> DataLoader:
        return self._eval_loader("test")

    def _eval_loader(self, split: str) -> DataLoader:
        """Validation/test batches of similar lengths, each cut to its longest real token: the
        padding an unsorted batch carries (on ListOps ~half of every batch's positions, ~2/3 of its
        quadratic cost) is never computed. Outputs do not depend on padding or batch composition (the
        attention contract), so predictions are those of the unsorted, full-length batches (tested per
        variant). The examples evaluated are the same as before sorting: a ``limit_*_batches`` cut
        is applied to the split in its own order first."""
        batches = self._eval_batches(split)
        name = f"limit_{split}_batches"
        limit = getattr(self.trainer, name, 1.0)
        if isinstance(limit, float) and limit != 1.0:
            # the fraction is applied above, before sorting; Lightning would apply it again to this
            # loader (0.5 evaluated a quarter): pin it to the batches kept
            setattr(self.trainer, name, len(batches))
        collate = partial(collate_cut, multiple=self.eval_width_multiple)
        return DataLoader(self.datasets[split], batch_sampler=batches, collate_fn=collate,
                          num_workers=self.num_workers, persistent_workers=self.num_workers > 0,
                          generator=torch.Generator().manual_seed(self.seed))  # see _loader: no global draw

    def _eval_batches(self, split: str) -> list[list[int]]:
        dataset = self.datasets[split]
        order = np.arange(len(dataset))[: self._eval_examples(split, len(dataset))]
        order = order[np.argsort(-self._real_lengths(split)[order], kind="stable")]  # longest first: memory peaks early
        size = self.eval_batch_size
        return [order[i:i + size].tolist() for i in range(0, len(order), size)]

    def _real_lengths(self, split: str) -> np.ndarray:
        """Real tokens per example, as the mask counts them; of two documents, the longer one."""
        lengths = np.minimum(np.asarray(self.datasets[split].lengths), self.max_len)
        return lengths.max(axis=tuple(range(1, lengths.ndim))) if lengths.ndim > 1 else lengths

    def eval_share(self, split: str) -> float:
        """Positions one pass over ``split`` computes, counted in training batches (``batch_size``
        examples at full width): the run's forecast scales a training step's forward cost by it
        before the first validation is timed. Cutting makes it far less than the batch count (ListOps
        validation: about a third)."""
        full = self._width(self.datasets["train"])
        lengths, eval_full = self._real_lengths(split), self._width(self.datasets[split])
        positions = sum(len(b) * cut_width(int(lengths[b].max()), self.eval_width_multiple, eval_full)
                        for b in self._eval_batches(split))
        return positions / (self.batch_size * full)

    def _width(self, dataset: ArrayDataset) -> int:
        return min(dataset.ids.shape[-1], self.max_len)

    def _eval_examples(self, split: str, n: int) -> int:
        """How many examples (from the start of the split) Lightning's ``limit_{val,test}_batches``
        lets through, by its own rule: an int is a number of batches, a float a fraction of them."""
        limit = getattr(self.trainer, f"limit_{split}_batches", 1.0) if self.trainer is not None else 1.0
        n_batches = -(-n // self.eval_batch_size)
        kept = min(int(limit), n_batches) if isinstance(limit, int) else int(n_batches * float(limit))
        return min(n, kept * self.eval_batch_size)


def collate_cut(items: list[dict[str, torch.Tensor]], multiple: int = 1) -> dict[str, torch.Tensor]:
    """Stack a batch and cut its sequence axis after the last real token of any example, rounded
    up to a ``multiple`` of positions (compiled runs: a bounded number of shapes)."""
    batch = default_collate(items)
    width = cut_width(int(batch["mask"].sum(-1).max()), multiple, batch["mask"].shape[-1])
    batch["ids"], batch["mask"] = batch["ids"][..., :width], batch["mask"][..., :width]
    return batch


def cut_width(longest: int, multiple: int, full: int) -> int:
    """The width a batch whose longest example has ``longest`` real tokens is cut to."""
    return min(-(-max(longest, 1) // multiple) * multiple, full)
