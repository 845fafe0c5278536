"""Block-local sliding-window attention (the LRA "Local Attention" baseline).

Each query block of ``block_size`` tokens attends, with exact softmax (Vaswani et al. 2017, eq. 1,
restricted to a key set S_i as in Child et al. 2019, eq. 2):

    out_i = softmax(q_i K_{S_i}^T / sqrt(d)) V_{S_i},   S_i = {j : |blk(j) - blk(i)| <= window}

Choices the method leaves open, written down:

* ``window`` counts neighbouring blocks on *each* side (default 1: a block sees 3 blocks, i.e.
  between ``block_size + 1`` and ``3*block_size - 1`` tokens of context per side pair);
  ``window: 0`` is the non-overlapping block-diagonal form.
* Block size 64 by default (LRA's local baseline is a fixed-block local attention; the Xiong
  protocol does not fix a size). Blocks are aligned to position 0; the tail is padded inside the
  variant (masked) and cut back. A sequence of at most ``block_size`` tokens is one block, i.e.
  exact softmax: this is the clamp for short inputs.
* Blocks running off either end are simply absent (no wrap-around).
* Cost ``O(N * (2*window+1) * block_size)`` time and memory, done block-wise: the key and value
  blocks are read through an overlapping view (:mod:`attention.windows`), never gathered.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from attention.base import Mixer
from attention.blocks import mask_blocks
from attention.masking import neg_fill, zero_padded
from attention.padding import Padding
from attention.windows import WindowAttention, block_buffer
from attention.spec import Grid, Knob, Peer, Spec, cap, int_range


class LocalAttention(Mixer):
    spec = Spec(grid=Grid({"block_size": (64, 1, 3, 5), "window": (1, 0, 2, 5)}, size="block_size",
                          unit=lambda r: cap(r["block_size"])),
                ranges={"block_size": int_range(1, 8), "window": int_range(0, 4)},
                knobs=(Knob("window", (0, 1, 2, 4)),), draws=False, small={"block_size": 8},
                documented=("block_size", "window"),
                peers=(Peer("local", "local-attention LocalAttention", "local-attention", "local_attention",
                            "window 64, look_backward=1, look_forward=1", "peer_local", "align_projected"),))

    def __init__(self, n_heads: int, head_dim: int, max_len: int, layer_idx: int = 0,
                 block_size: int = 64, window: int = 1) -> None:
        super().__init__(n_heads, head_dim, max_len, layer_idx)
        if block_size <= 0 or window < 0:
            raise ValueError(f"local attention needs block_size > 0 and window >= 0, got {block_size}, {window}")
        self.block_size = block_size
        self.window = window

    def setting_warnings(self, max_len: int) -> list[str]:
        found = []
        if self.block_size >= max_len:
            found.append(f"attention.block_size={self.block_size} >= task.max_len={max_len}: one block holds every "
                         f"token: full attention (attention=local measures nothing of its own here; use a block_size "
                         f"below max_len)")
        if self.window == 0:
            found.append("attention.window=0: local attention without overlap (block-diagonal: a token never sees "
                         "past its own block of attention.block_size tokens); the default is attention.window=1")
        return found

    def pattern(self, n: int) -> Tensor:
        """Dense ``[n, n]`` bool of the allowed (query, key) pairs; for tests only."""
        blk = torch.arange(n) // self.block_size
        return (blk[:, None] - blk[None, :]).abs() <= self.window

    def forward(self, q: Tensor, k: Tensor, v: Tensor, pad: Padding, x: Tensor) -> Tensor:
        mask = pad.mask
        b, h, n, d = q.shape
        bs = min(self.block_size, n)
        nb = -(-n // bs)
        w = min(self.window, nb - 1)
        # The blocks of every (batch, head) sequence one after another, w empty blocks at both ends:
        # query block t reads buffer blocks t .. t + 2w as an overlapping view (no gathered copies).
        # Window slots past either end of the sequence read as padding: masked like padded keys.
        keys_real = F.pad(mask_blocks(mask, bs), (0, 0, w, w), value=False).unfold(1, nb, 1)  # [B, 2w+1, bs, nb]
        allowed = keys_real.permute(0, 3, 1, 2)                                        # [B, nb, 2w+1, bs]
        bias = torch.zeros(allowed.shape, dtype=q.dtype, device=q.device).masked_fill_(~allowed, neg_fill(q.dtype))
        bias = bias.view(b, 1, nb, -1).expand(b, h, nb, (2 * w + 1) * bs).reshape(b * h * nb, 1, -1)
        out, _ = WindowAttention.apply(block_buffer(q, bs), block_buffer(k, bs, w), block_buffer(v, bs, w), bias,
                                       2 * w + 1, 1.0 / math.sqrt(d))
        out = out.view(b, h, nb * bs, d)[:, :, :n]
        return zero_padded(out, pad)
