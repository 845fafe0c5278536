"""The LRA classifier: embeddings -> encoder -> pooling -> head (single or dual document)."""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn

from attention.base import Mixer
from attention.padding import Padding
from models.embedding import Embedding
from models.encoder import Encoder
from models.heads import ClassifierHead, DualHead
from models.memory_encoder import MemformerEncoder
from models.pooling import pooler, prepend_cls


class LRAClassifier(nn.Module):
    """``forward(ids, mask) -> logits``. ``ids``/``mask`` are ``[B, N]``, or ``[B, 2, N]`` when
    ``dual`` (retrieval): both documents go through the same encoder.

    ``padded`` (whether ``mask`` has a False entry) is decided once per batch for every layer and
    segment (:class:`attention.padding.Padding`): given by the caller when it knows it on the host
    (``LRAModule`` does, before the batch reaches the device), else read from the mask once per
    forward."""

    def __init__(
        self,
        mixer: Callable[..., Mixer],
        vocab_size: int,
        num_classes: int,
        max_len: int,
        d_model: int = 64,
        n_layers: int = 2,
        n_heads: int = 2,
        d_ffn: int = 128,
        d_head: int = 128,
        dropout: float = 0.1,
        pool: str = "mean",
        dual: bool = False,
    ) -> None:
        super().__init__()
        for name, value in {"d_model": d_model, "n_layers": n_layers, "d_ffn": d_ffn, "max_len": max_len,
                            "vocab_size": vocab_size, "num_classes": num_classes}.items():
            if value <= 0:
                raise ValueError(f"{name}={value} must be positive")
        self.pool_name = pool
        self.pool = pooler(pool)
        seq_len = max_len + (pool == "cls")
        self.embed = Embedding(vocab_size, d_model, max_len, dropout)
        self.cls = nn.Parameter(torch.randn(d_model) * 0.02) if pool == "cls" else None
        encoder = Encoder(d_model, n_layers, n_heads, d_ffn, dropout, mixer, seq_len)
        # a segment-recurrent mixer (Memformer) needs the segment loop outside the layers
        segment_recurrent = getattr(encoder.blocks[0].attn.mixer, "segment_recurrent", False)
        self.encoder = MemformerEncoder(encoder, summary_first=pool == "cls") if segment_recurrent else encoder
        self.dual = dual
        self.head = DualHead(d_model, d_head, num_classes) if dual else ClassifierHead(d_model, d_head, num_classes)

    def encode(self, ids: Tensor, mask: Tensor, padded: bool | None = None) -> Tensor:
        return self.pool(*self._states(ids, mask, padded))

    def _states(self, ids: Tensor, mask: Tensor, padded: bool | None) -> tuple[Tensor, Tensor]:
        """Encoder outputs ``[B, N(+1), d]`` and their mask (the CLS position first when ``pool=cls``)."""
        x = self.embed(ids)
        if self.cls is not None:
            x, mask = prepend_cls(x, mask, self.cls)
        return self.encoder(x, Padding.of(mask, padded)), mask

    def token_states(self, ids: Tensor, mask: Tensor, padded: bool | None = None) -> Tensor:
        """Per-token encoder outputs ``[B, N, d]`` before pooling, one per input position (a CLS
        token's output is dropped): what a per-token head (self-pretraining's) reads. One document
        per row: a dual model's pairs are flattened by the caller."""
        h, _ = self._states(ids, mask, padded)
        return h[:, 1:] if self.cls is not None else h

    def forward(self, ids: Tensor, mask: Tensor, padded: bool | None = None) -> Tensor:
        if self.dual:
            if ids.dim() != 3 or ids.shape[1] != 2:
                raise ValueError(f"dual (retrieval) model expects ids [B, 2, N], got {tuple(ids.shape)}")
            b = ids.shape[0]
            pooled = self.encode(ids.flatten(0, 1), mask.flatten(0, 1), padded)
            return self.head(pooled[:b * 2:2], pooled[1:b * 2:2])
        return self.head(self.encode(ids, mask, padded))

    def pop_aux_loss(self) -> Tensor | None:
        """Sum of the loss terms the mixers stored in their last forward (e.g. routing's commitment
        loss), cleared so no graph outlives its step."""
        terms = []
        for m in self.modules():
            if isinstance(m, Mixer) and m.aux_loss is not None:
                terms.append(m.aux_loss.reshape(()))
                m.aux_loss = None
        return torch.stack(terms).sum() if terms else None
