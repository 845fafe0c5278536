"""Which tokens of a batch are real: the mask, its lengths, and whether anything is padded.

fast-transformers passes mask objects that carry their lengths; :class:`Padding` is that object
here. The network builds one per batch (:meth:`Padding.of`) and passes it to every layer, so a
variant never reads the mask on the host: whether the batch has padding (``any``) is decided
once, on the host, where the batch is made (``LRAModule`` reads it before the batch reaches the
device, where it costs nothing). A variant's fast path for an unpadded batch (skip the key bias,
skip zeroing padded rows) is a branch on that Python bool: ``torch.compile`` specialises on it,
so a run compiles at most two graphs, each with static shapes.

``any=True`` for a batch without padding is always correct (the masked path gives the same
values); only ``any=False`` must be exact. A mask derived from this one (a segment, the CLS
column) is made with :meth:`Padding.segment` or :meth:`Padding.of` and keeps what is known.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor


@dataclass(frozen=True, eq=False)
class Padding:
    """``mask``: ``[B, N]`` bool, True = real token; ``any``: whether some position is padded;
    :attr:`lengths` derived on demand (no variant needs it every step: no operator per batch)."""

    mask: Tensor
    any: bool

    @classmethod
    def of(cls, mask: Tensor, any: bool | None = None) -> "Padding":
        """The padding of a bool ``mask``; ``any`` as the caller knows it on the host, else read from
        ``mask`` (one host read: callers that run a mixer on its own, tests and tools)."""
        if mask.dtype != torch.bool or mask.dim() != 2:
            raise TypeError(f"a padding mask is bool [B, N] (True = real token), got {mask.dtype} {tuple(mask.shape)}")
        if any is None:
            any = not bool(mask.all())
        return cls(mask, bool(any))

    @classmethod
    def full(cls, batch: int, n: int, device: torch.device | str) -> "Padding":
        """No padding: every one of the ``batch x n`` tokens is real."""
        return cls(torch.ones(batch, n, dtype=torch.bool, device=device), False)

    def segments(self, size: int) -> list["Padding"]:
        """The consecutive segments of ``size`` positions (a recurrent encoder's), the last one
        right-padded to ``size``: it has padding if the batch has or if it reaches past ``N``."""
        n = self.mask.shape[1]
        masks = F.pad(self.mask, (0, -n % size), value=False).split(size, dim=1)
        return [Padding(m, self.any or (t + 1) * size > n) for t, m in enumerate(masks)]

    @property
    def lengths(self) -> Tensor:
        """``[B]`` real tokens per row, on the mask's device."""
        return self.mask.sum(-1)

    @property
    def shape(self) -> torch.Size:
        return self.mask.shape

    @property
    def device(self) -> torch.device:
        return self.mask.device


def as_padding(mask: "Padding | Tensor") -> Padding:
    """``mask`` itself, or the padding of a bool mask tensor (one host read)."""
    return mask if isinstance(mask, Padding) else Padding.of(mask)
