"""Mask helpers shared by variants: the padding convention is bool ``[B, N]``, True = real token."""
from __future__ import annotations

import torch
from torch import Tensor

from attention.padding import Padding


def neg_fill(dtype: torch.dtype) -> float:
    """The fill for disallowed logits: finite (a fully masked row stays NaN-free), far below any real logit."""
    return torch.finfo(dtype).min / 2


def key_bias(mask: Tensor, dtype: torch.dtype) -> Tensor:
    """Additive bias ``[B, 1, 1, N]``: 0 for real keys, a large negative for padded ones.

    A finite value (not -inf) keeps a fully padded row finite; callers zero such rows afterwards.
    """
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(~mask, neg_fill(dtype))[:, None, None, :]


def zero_padded(out: Tensor, pad: Padding) -> Tensor:
    """Zero the outputs ``[B, H, N, D]`` of padded query positions.

    A batch without padding (image, pathfinder, and most batches bucketed by length) returns
    ``out`` itself, saving a full pass and its backward (``pad.any``, decided once per batch)."""
    if not pad.any:
        return out
    return out * pad.mask[:, None, :, None].to(out.dtype)


def pad_to_multiple(t: Tensor, multiple: int, dim: int, value: float = 0.0) -> Tensor:
    """Right-pad ``t`` along ``dim`` so its size is a multiple of ``multiple``."""
    n = t.shape[dim]
    extra = (-n) % multiple
    if extra == 0:
        return t
    shape = list(t.shape)
    shape[dim] = extra
    return torch.cat([t, t.new_full(shape, value)], dim=dim)
