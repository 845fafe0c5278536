"""A 2-layer LRA classifier of any config and its batches, small enough to train a step of every
config in a test (host-sync counts, CUDA-autocast emulation, DDP)."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention.registry import build_mixer
from models.network import LRAClassifier
from tests.contract_sizes import SMALL_STRUCTURE

SEQ, BATCH = 64, 4
PADDED_LENGTHS = [SEQ, 50, 37, 20]


def tiny_network(name: str, n_layers: int = 2, graph_safe: bool = False, **overrides) -> LRAClassifier:
    """Variant ``name`` at the contract tests' small structure sizes (several blocks, segments and
    clusters at 64 tokens), seeded; ``graph_safe`` as ``model.graph_safe``."""
    torch.manual_seed(0)
    mixer = build_mixer(name, **{**SMALL_STRUCTURE.get(name, {}), **overrides})
    return LRAClassifier(mixer, vocab_size=16, num_classes=3, max_len=SEQ, d_model=16, n_layers=n_layers,
                         n_heads=2, d_ffn=32, dropout=0.0, graph_safe=graph_safe)


def step_batch(padded: bool, seed: int = 1) -> tuple[Tensor, Tensor, Tensor]:
    """``ids, mask, label`` of a batch of 4 x 64 tokens (lengths ``PADDED_LENGTHS`` when padded)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, 16, (BATCH, SEQ), generator=g)
    lengths = PADDED_LENGTHS if padded else [SEQ] * BATCH
    mask = torch.arange(SEQ)[None, :] < torch.tensor(lengths)[:, None]
    return ids, mask, torch.randint(0, 3, (BATCH,), generator=g)


def training_loss(net: LRAClassifier, ids: Tensor, mask: Tensor, label: Tensor, padded: bool | None = None,
                  model: nn.Module | None = None) -> Tensor:
    """``LRAModule.training_step``'s loss: cross-entropy plus the mixers' loss terms. ``model``: what
    to call instead of ``net`` (a DDP wrapper of it); ``padded`` as the module passes it (None: the
    network reads it)."""
    logits = (net if model is None else model)(ids, mask, padded=padded)
    loss = F.cross_entropy(logits, label)
    aux = net.pop_aux_loss()
    return loss if aux is None else loss + aux
