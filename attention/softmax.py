"""Exact softmax attention (Vaswani et al. 2017, eq. 1): softmax(Q K^T / sqrt(d)) V.

The reference every variant is compared against. Built on
``torch.nn.functional.scaled_dot_product_attention`` so the fastest exact kernel of the device is
used. Padded keys get a large negative bias; fully padded query rows are zeroed afterwards, so no
NaN appears (the bias is finite). Attention dropout defaults to 0: on CPU a non-zero dropout makes
PyTorch fall back to materialising the N x N matrix (slower, 10x memory at 4K).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attention.base import Mixer
from attention.masking import key_bias, neg_fill, zero_padded
from attention.padding import Padding
from attention.spec import Grid, Peer, Range, Spec, no


class SoftmaxAttention(Mixer):
    spec = Spec(grid=Grid({"dropout": (0.0, 0.1)}, allowed=no(dropout=0.1, mode="train")),  # dropout draws: eval
                ranges={"dropout": Range("float", 0.0, 1.0, high_open=True, draw=(0.0, 0.5))},
                knobs=(), excluded="the reference itself", draws=False, small={}, documented=("dropout",),
                peers=(Peer("softmax", "torch scaled_dot_product_attention", "torch", "torch",
                            "same four projections, no mask", "peer_softmax", "align_projected"),))
    supports_causal = True  # self-pretraining's next-token objective (models/pretraining.py)

    def __init__(self, n_heads: int, head_dim: int, max_len: int, layer_idx: int = 0, dropout: float = 0.0) -> None:
        super().__init__(n_heads, head_dim, max_len, layer_idx)
        self.dropout = dropout

    def forward(self, q: Tensor, k: Tensor, v: Tensor, pad: Padding, x: Tensor) -> Tensor:
        mask = pad.mask
        # Without padding (image, pathfinder) no bias is passed, which lets SDPA pick its fastest
        # kernel (flash attention on CUDA); the network decides it once per batch (Padding.any).
        padded = pad.any
        bias = key_bias(mask, q.dtype) if padded else None
        if self.causal:  # future keys get the padding's finite bias (one fill, so a padded row stays finite)
            n = q.shape[-2]
            hidden = torch.ones(n, n, dtype=torch.bool, device=q.device).triu(1) | ~mask[:, None, None, :]
            bias = torch.zeros(hidden.shape, dtype=q.dtype, device=q.device).masked_fill(hidden, neg_fill(q.dtype))
        out = F.scaled_dot_product_attention(
            q, k, v, attn_mask=bias, dropout_p=self.dropout if self.training else 0.0
        )
        return zero_padded(out, pad)
