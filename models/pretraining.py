"""Self-pretraining (SPT) of the LRA encoder: masked token prediction (``mlm``) or next-token
prediction (``causal``) on the task's own training sequences, the LightningModule of the
pretraining stage (orchestration: :mod:`lra.training.pretrain`; settings and their sources:
``conf/pretrain/mlm.yaml`` and ``docs/pretraining.md``).

Following Amos, Berant & Gupta (ICLR 2024, "Never Train from Scratch"; their code
IdoAmos/not-from-scratch, ``src/dataloaders/base.py`` ``MaskedSequenceDatasetWrapper.mask``):

* ``mlm``: each real token is masked independently with probability ``mask_ratio`` and replaced by
  a dedicated mask token (no BERT 80/10/10 split: their masked input is the token times
  ``1 - mask``, id 0 being ``<mask>`` in their vocabulary); the loss is the cross-entropy of the
  original token at the masked positions only (``ignore_val`` -100 everywhere else, padding
  included). Here the mask token is one extra row of the embedding table (id ``vocab_size``); the
  logits cover the task's vocabulary only.
* ``causal``: position ``t`` predicts token ``t + 1`` (their ``causal_lm``: target shifted by one,
  the last position ignored), under a causal attention mask. Only a mixer with
  ``supports_causal`` can run it (softmax, through ``is_causal``-style masking): the efficient
  variants of this suite are bidirectional by construction (their approximations mix every key
  into every query), so a causal mask is not defined for them.

The loss is the mean cross-entropy over exactly the predicted real positions of the batch (a
token-level mean, as ``cross_entropy(ignore_index=-100)``); a batch with none gives 0, not NaN.
Masks are drawn by a ``torch.Generator`` seeded from (run seed, stage, optimiser step) for training
and (run seed, stage, batch index) for validation, over ``[B, max_len]`` and cut to the batch's
width: a resumed run draws the masks the uninterrupted one drew, whatever the padding width.
Retrieval's document pairs (``ids [B, 2, N]``) are pretrained as ``2B`` single documents.
"""
from __future__ import annotations

from typing import Any, Iterator

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from attention.base import Mixer
from models.heads import TokenHead
from models.module import LRAModule
from models.network import LRAClassifier

OBJECTIVES = ("mlm", "causal")
IGNORE = -100
_STAGES = {"train": 0, "val": 1, "test": 2}


def mask_generator(seed: int, stage: str, count: int) -> torch.Generator:
    """A CPU generator for the masks of one batch, seeded from (run seed, stage, step or batch index)."""
    state = np.random.SeedSequence([int(seed), _STAGES[stage], int(count)]).generate_state(2, dtype=np.uint32)
    return torch.Generator().manual_seed(int(state[0]) << 31 ^ int(state[1]))


def draw_masked(mask: Tensor, ratio: float, width: int, generator: torch.Generator) -> Tensor:
    """Which positions are masked: real ones (``mask`` True) whose uniform draw is below ``ratio``.
    Draws cover ``[B, width]`` (``width`` >= N, the model's position table) and are cut to N, so
    extra padding never changes which real tokens are masked."""
    b, n = mask.shape
    u = torch.rand(b, max(width, n), generator=generator)[:, :n]
    return (u.to(mask.device) < ratio) & mask


def next_token_targets(ids: Tensor, mask: Tensor) -> tuple[Tensor, Tensor]:
    """Causal targets: ``target[t] = ids[t + 1]``, predicted where both ``t`` and ``t + 1`` are real."""
    targets = torch.full_like(ids, IGNORE)
    targets[:, :-1] = ids[:, 1:]
    selected = torch.zeros_like(mask)
    selected[:, :-1] = mask[:, :-1] & mask[:, 1:]
    return targets, selected


def selected_cross_entropy(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy of ``logits [M, V]`` against ``targets [M]``; 0 (with a graph) when M = 0."""
    if logits.shape[0] == 0:
        return logits.sum() * 0.0
    return F.cross_entropy(logits, targets)


class MaskedLMModule(LRAModule):
    """Pretraining of an :class:`LRAClassifier`'s embeddings and encoder through a per-token head.

    ``network`` is built with ``vocab_size + 1`` embedding rows (the mask token is the last); its
    classification head is left untrained (a fine-tune starts a fresh one). Takes the classifier's
    batch dict (``ids``, ``mask``, ...) and masks inside :meth:`training_step`. Logged ``loss`` and
    ``acc`` are the cross-entropy and accuracy over the predicted positions."""

    def __init__(self, network: LRAClassifier, vocab_size: int, objective: str = "mlm", mask_ratio: float = 0.5,
                 seed: int = 0, **optim: Any) -> None:
        if objective not in OBJECTIVES:
            raise ValueError(f"unknown pretrain.objective={objective!r}; valid: {', '.join(OBJECTIVES)}")
        if not 0.0 < mask_ratio < 1.0:
            raise ValueError(f"pretrain.mask_ratio={mask_ratio} must be in (0, 1)")
        rows = network.embed.tokens.num_embeddings
        if rows != vocab_size + 1:
            raise ValueError(f"the pretraining network needs vocab_size + 1 = {vocab_size + 1} embedding rows "
                             f"(the last is the mask token), got {rows}")
        super().__init__(network, num_classes=vocab_size, **optim)
        self.objective, self.mask_ratio, self.mask_seed = objective, float(mask_ratio), int(seed)
        self.mask_id = vocab_size
        self.val_loss_curve: list[tuple[int, float]] = []  # (global step, validation loss) per evaluation
        self.token_head = TokenHead(network.embed.tokens.embedding_dim, vocab_size)
        if objective == "causal":
            set_causal(network)

    def on_validation_epoch_end(self) -> None:
        super().on_validation_epoch_end()  # val_curve: (step, masked-token accuracy)
        value = self.trainer.callback_metrics.get("val/loss")
        if value is not None and not self.trainer.sanity_checking:
            self.val_loss_curve.append((int(self.global_step), float(value)))

    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_save_checkpoint(checkpoint)
        checkpoint["val_loss_curve"] = [list(p) for p in self.val_loss_curve]

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        super().on_load_checkpoint(checkpoint)
        self.val_loss_curve = [(int(s), float(v)) for s, v in checkpoint.get("val_loss_curve", [])]

    def optimised_parameters(self) -> Iterator[tuple[str, torch.nn.Parameter]]:
        yield from self.network.named_parameters()
        yield from self.token_head.named_parameters(prefix="token_head")

    def forward(self, ids: Tensor, mask: Tensor, padded: bool | None = None) -> Tensor:
        """Vocabulary logits at every position of unmasked ``ids`` (a dual batch flattened to single
        documents): what the behavioural fingerprint reads after its two steps."""
        if ids.dim() == 3:
            ids, mask = ids.flatten(0, 1), mask.flatten(0, 1)
        return self.token_logits(ids, mask, padded)

    def token_logits(self, ids: Tensor, mask: Tensor, padded: bool | None = None) -> Tensor:
        """Vocabulary logits ``[B, N, V]`` at every position of (already masked) ``ids``."""
        return self.token_head(self.network.token_states(ids, mask, padded))

    def corrupt(self, ids: Tensor, mask: Tensor, generator: torch.Generator) -> tuple[Tensor, Tensor, Tensor]:
        """``(input ids, targets, selected)`` of one batch of single documents ``[B, N]``."""
        if self.objective == "causal":
            targets, selected = next_token_targets(ids, mask)
            return ids, targets, selected
        selected = draw_masked(mask, self.mask_ratio, self.network.embed.max_len, generator)
        return ids.masked_fill(selected, self.mask_id), ids.masked_fill(~selected, IGNORE), selected

    def pretraining_loss(self, batch: dict[str, Tensor], stage: str, count: int) -> tuple[Tensor, Tensor, Tensor]:
        """``(loss, logits [M, V], targets [M])`` over the predicted real positions of ``batch``."""
        ids, mask = batch["ids"], batch["mask"]
        if ids.dim() == 3:  # retrieval: each document of a pair is a sequence of its own
            ids, mask = ids.flatten(0, 1), mask.flatten(0, 1)
        inputs, targets, selected = self.corrupt(ids, mask, mask_generator(self.mask_seed, stage, count))
        states = self.network.token_states(inputs, mask, batch.get("padded"))
        logits = self.token_head(states[selected])  # only the predicted positions reach the head
        return selected_cross_entropy(logits, targets[selected]), logits, targets[selected]

    def _step(self, batch: dict[str, Tensor], stage: str, count: int = 0) -> tuple[Tensor, Tensor]:
        loss, logits, targets = self.pretraining_loss(batch, stage, count)
        if not torch.isfinite(loss):
            raise FloatingPointError(
                f"non-finite pretraining {stage} loss ({loss.item()}) at global step {self.global_step}: "
                "lower pretrain.lr or check the attention variant for overflow")
        aux = self.network.pop_aux_loss()
        if aux is not None and stage == "train":
            self.log("train/aux_loss", aux, on_step=True, on_epoch=False)
            loss = loss + aux
        n = int(targets.shape[0])
        acc = self.metrics[f"{stage}_acc"]
        if n:
            acc(logits.detach(), targets)
        self.log(f"{stage}/loss", loss, on_step=stage == "train", on_epoch=True, prog_bar=True, batch_size=max(n, 1),
                 sync_dist=stage != "train")
        self.log(f"{stage}/acc", acc, on_step=False, on_epoch=True, prog_bar=True, batch_size=max(n, 1))
        return loss, logits

    def training_step(self, batch: dict[str, Tensor], batch_idx: int) -> Tensor:
        return self._step(batch, "train", self.global_step)[0]  # masks keyed by the optimiser step

    def validation_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._step(batch, "val", batch_idx)  # the same masks at every validation

    def test_step(self, batch: dict[str, Tensor], batch_idx: int) -> None:
        self._step(batch, "test", batch_idx)


def non_causal_mixers(network: LRAClassifier) -> list[Mixer]:
    """The network's mixers that cannot run under a causal mask (empty: the network can)."""
    return [m for m in network.modules() if isinstance(m, Mixer) and not m.supports_causal]


def set_causal(network: LRAClassifier) -> None:
    """Put every mixer of ``network`` under a causal mask, or raise naming the variant that has none."""
    unable = non_causal_mixers(network)
    if unable:
        raise ValueError(f"pretrain.objective=causal needs a causal attention mask, which {type(unable[0]).__name__} "
                         "does not have (of this suite's variants only softmax has one: the efficient ones are "
                         "bidirectional by construction); use +pretrain=mlm for this variant")
    for m in network.modules():
        if isinstance(m, Mixer):
            m.causal = True
