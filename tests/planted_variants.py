"""Variants with a planted contract bug, for the tests of the variant check (``mode=check``): each
is what a variant's author plausibly writes, and the check must name the property it breaks."""
from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

from attention.masking import zero_padded
from attention.padding import Padding
from attention.softmax import SoftmaxAttention


class IgnoresKeyMask(SoftmaxAttention):
    """Softmax attention that forgets the key mask: padded keys get weight (the issue's planted bug)."""

    def forward(self, q: Tensor, k: Tensor, v: Tensor, pad: Padding, x: Tensor) -> Tensor:
        return zero_padded(F.scaled_dot_product_attention(q, k, v), pad)
