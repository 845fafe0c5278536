"""LightningModule: cross-entropy training of :class:`LRAClassifier` with AdamW and warm-up."""
from __future__ import annotations

import functools
import random
from typing import Any, Iterator

import numpy as np

import pytorch_lightning as pl
import torch
import torch.nn.functional as F
from torch import Tensor
from torchmetrics.classification import MulticlassAccuracy

from models.network import LRAClassifier
from models.schedule import SCHEDULES


class LRAModule(pl.LightningModule):
    def __init__(
        self,
        network: LRAClassifier,
        num_classes: int,
        lr: float = 1e-4,
        weight_decay: float = 0.0,
        betas: tuple[float, float] = (0.9, 0.999),
        warmup_steps: int = 0,
        total_steps: int = 1000,
        schedule: str = "linear",
    ) -> None:
        super().__init__()
        if schedule not in SCHEDULES:
            raise ValueError(f"unknown optim.schedule={schedule!r}; valid: {', '.join(SCHEDULES)}")
        if lr <= 0:
            raise ValueError(f"optim.lr={lr} must be positive")
        self.network = network
        self.val_curve: list[tuple[int, float]] = []  # (global step, validation accuracy) per evaluation
        self.save_hyperparameters(ignore=["network"])
        self.metrics = torch.nn.ModuleDict(
            {stage: MulticlassAccuracy(num_classes, average="micro") for stage in ("train_acc", "val_acc", "test_acc")}
        )

    def forward(self, ids: Tensor, mask: Tensor, padded: bool | None = None) -> Tensor:
        return self.network(ids, mask, padded)

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        # Whether the batch has padding, read while the mask is still on the host (free there):
        # every layer's fast path then needs no device read (attention.padding.Padding).
        if isinstance(batch, dict) and isinstance(batch.get("mask"), Tensor) and batch["mask"].device.type == "cpu":
            batch["padded"] = not bool(batch["mask"].all())
        return batch

    def _step(self, batch: dict[str, Tensor], stage: str) -> tuple[Tensor, Tensor]:
        logits = self(batch["ids"], batch["mask"], batch.get("padded"))
        loss = F.cross_entropy(logits, batch["label"])
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"non-finite {stage} loss ({loss.item()}) at global step {self.global_step}: "
                "lower optim.lr or check the attention variant for overflow"
            )
        aux = self.network.pop_aux_loss()
        if aux is not None and stage == "train":
            self.log("train/aux_loss", aux, on_step=True, on_epoch=False)
            loss = loss + aux
        acc = self.metrics[f"{stage}_acc"]
        acc(logits.detach(), batch["label"])
        bs = batch["label"].shape[0]
        self.log(f"{stage}/loss", loss, on_step=stage == "train", on_epoch=True, prog_bar=True, batch_size=bs, sync_dist=stage != "train")
        self.log(f"{stage}/acc", acc, on_step=False, on_epoch=True, prog_bar=True, batch_size=bs)
        return loss, logits

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        return self._step(batch, "train")[0]

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._step(batch, "val")

    def on_validation_epoch_end(self) -> None:
        # Lightning has reduced the epoch's metrics (callback_metrics holds this evaluation's
        # accuracy), and the checkpoint callbacks have not saved yet: the best and last checkpoints
        # written after this validation carry its point of the curve (a resume keeps it).
        value = self.trainer.callback_metrics.get("val/acc")
        if value is not None and not self.trainer.sanity_checking:
            self.val_curve.append((int(self.global_step), float(value)))

    def on_test_epoch_start(self) -> None:
        self._test_parts = []

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        logits = self._step(batch, "test")[1]
        pred = logits.argmax(-1)
        self._test_parts.append((pred.cpu(), (pred == batch["label"]).cpu(), batch["label"].cpu(),
                                 batch["mask"].sum(-1).cpu(), self._example_index(batch)))

    def _example_index(self, batch: dict[str, Tensor]) -> Tensor:
        """The examples' positions in the split (the suite's loaders say; a loader that does not is
        taken to read the split in order)."""
        if "index" in batch:
            return batch["index"].cpu()
        seen = sum(len(part[0]) for part in self._test_parts)
        return torch.arange(seen, seen + batch["label"].shape[0])

    def test_predictions(self) -> dict[str, np.ndarray]:
        """Per test example, in the split's order, of this process: predicted class, correct (bool),
        label and real length (number of real tokens; ``[M, 2]`` for two-document tasks). The
        report's paired tests and accuracy-by-length read these (saved next to the run record)."""
        parts = getattr(self, "_test_parts", [])
        if not parts:
            return {}
        pred, correct, label, length, index = (torch.cat(x).numpy() for x in zip(*parts))
        order = np.argsort(index, kind="stable")  # evaluation batches are length-sorted: back to split order
        pred, correct, label, length = pred[order], correct[order], label[order], length[order]
        return {"pred": pred.astype(np.int16), "correct": correct.astype(bool), "label": label.astype(np.int16),
                "length": length.astype(np.int32)}

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        # Lightning does not checkpoint the global RNGs; dropout needs them for an exact resume.
        # (numpy's state is stored as tensors/ints so torch.load(weights_only=True) accepts it)
        name, keys, pos, has_gauss, cached = np.random.get_state()
        checkpoint["rng_states"] = {"torch": torch.get_rng_state(), "python": random.getstate(),
                                    "numpy": [name, torch.from_numpy(keys.astype(np.int64)), pos, has_gauss, cached]}
        checkpoint["val_curve"] = [list(p) for p in self.val_curve]  # a resumed run keeps its learning curve

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        states = checkpoint.get("rng_states")
        if states:
            torch.set_rng_state(states["torch"])
            name, keys, pos, has_gauss, cached = states["numpy"]
            np.random.set_state((name, keys.numpy().astype(np.uint32), pos, has_gauss, cached))
            random.setstate(states["python"])
        if "val_curve" in checkpoint:
            self.val_curve = [(int(s), float(v)) for s, v in checkpoint["val_curve"]]

    def optimised_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        """The named parameters AdamW trains (the network's; a subclass adds its own heads)."""
        return self.network.named_parameters()

    def configure_optimizers(self) -> dict[str, Any]:
        hp = self.hparams
        decay, no_decay = [], []
        for name, p in self.optimised_parameters():
            if p.requires_grad:
                (no_decay if p.ndim < 2 or "norm" in name or "embed" in name else decay).append(p)
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": hp.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=hp.lr, betas=tuple(hp.betas),
        )
        fn = functools.partial(SCHEDULES[hp.schedule], warmup=hp.warmup_steps, total=hp.total_steps)
        sched = torch.optim.lr_scheduler.LambdaLR(opt, fn)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}
