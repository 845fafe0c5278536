"""Classifier heads: pool -> Linear(d, mlp) -> ReLU -> Linear(mlp, classes), and the retrieval
dual head that classifies ``[u, v, u*v, u-v]`` of the two encoded documents (LRA)."""
from __future__ import annotations

import torch
from torch import Tensor, nn


class ClassifierHead(nn.Module):
    def __init__(self, d_in: int, d_hidden: int, num_classes: int) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(d_in, d_hidden), nn.ReLU(), nn.Linear(d_hidden, num_classes))

    def forward(self, pooled: Tensor) -> Tensor:
        return self.net(pooled)


class DualHead(nn.Module):
    def __init__(self, d_model: int, d_hidden: int, num_classes: int) -> None:
        super().__init__()
        self.head = ClassifierHead(4 * d_model, d_hidden, num_classes)

    def forward(self, u: Tensor, v: Tensor) -> Tensor:
        return self.head(torch.cat([u, v, u * v, u - v], dim=-1))


class TokenHead(nn.Module):
    """Per-token vocabulary logits from the encoder's per-token states (self-pretraining's head:
    one linear map, as the decoder of Amos et al. 2024's code; not carried into fine-tuning)."""

    def __init__(self, d_model: int, vocab_size: int) -> None:
        super().__init__()
        self.proj = nn.Linear(d_model, vocab_size)

    def forward(self, states: Tensor) -> Tensor:
        return self.proj(states)
