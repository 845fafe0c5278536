"""Longformer attention (Beltagy et al. 2020, Sec. 3.1): sliding window + global first token.

Every token attends with exact softmax (Vaswani et al. 2017, eq. 1) over the key set

    S_i = {j : |i - j| <= w/2} ∪ {0}            for i > 0      (window + the global token)
    S_0 = {all j}                                              (the global token sees everything)

Choices the paper leaves open (or that the LRA setting fixes), written down:

* ``window`` is the paper's total window w; a token sees ``w // 2`` tokens on each side
  (HF/LRA-port convention ``attention_window = w``). Default 128, the Nyströmformer/Skyformer LRA
  setting ``longformer-128``. No dilation (the paper dilates only some heads of upper layers for
  autoregressive LM).
* Global attention is given to the first token only (the CLS/first-token view used by the LRA
  ports). The paper uses separate projections Q_g, K_g, V_g for global attention; the shell owns a
  single q/k/v projection, so global and local attention share it, as in the LRA PyTorch ports
  (they tie the global weights to the local ones).
* Token 0 enters the window rows once: it is removed from the band and read through the global
  column, so no key is counted twice.
* Block-wise implementation: blocks of ``w // 2`` tokens; block a reads blocks a-1, a, a+1, which
  cover every token within ``w // 2`` of any of its queries, and a per-token band mask
  ``|i - j| <= w/2`` cuts the rest. Cost ``O(N * w)`` plus one dense row for the global token.
  Lengths not divisible by the block are padded inside and cut back; a window covering the whole
  sequence is exact softmax.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from attention.base import Mixer, require_non_negative
from attention.blocks import (block_sparse_attention, dense_rows, from_blocks, mask_blocks, slot_allow, to_blocks,
                              window_table)
from attention.masking import zero_padded
from attention.padding import Padding
from attention.spec import Grid, Knob, Spec, cap, int_range


class LongformerAttention(Mixer):
    spec = Spec(grid=Grid({"window": (128, 0, 1, 2, 5, 8)}, size="window",
                          unit=lambda r: cap(max(1, r["window"] // 2))),
                ranges={"window": int_range(0, 16)}, knobs=(Knob("window", (32, 64, 128, 256, 512)),), draws=False,
                small={"window": 8}, documented=("window",))

    def __init__(self, n_heads: int, head_dim: int, max_len: int, layer_idx: int = 0, window: int = 128) -> None:
        super().__init__(n_heads, head_dim, max_len, layer_idx)
        require_non_negative(window=window)
        self.window = window

    def setting_problems(self) -> list[str]:
        if self.window < 2:
            return [f"attention.window={self.window} leaves longformer no sliding window (a token sees window // 2 = 0 "
                    f"neighbours per side, only itself and the global first token); window is the total width, "
                    f"e.g. attention.window=128"]
        return []

    def setting_warnings(self, max_len: int) -> list[str]:
        if self.window // 2 >= max_len - 1:
            return [f"attention.window={self.window} >= 2 x task.max_len={max_len}: every token sees the whole "
                    f"sequence, so longformer is full attention here"]
        return []

    def pattern(self, n: int) -> Tensor:
        """Dense ``[n, n]`` bool of the allowed (query, key) pairs; for tests only."""
        i = torch.arange(n)
        allowed = (i[:, None] - i[None, :]).abs() <= self.window // 2
        allowed[0, :] = True
        allowed[:, 0] = True
        return allowed

    def forward(self, q: Tensor, k: Tensor, v: Tensor, pad: Padding, x: Tensor) -> Tensor:
        mask = pad.mask
        n = q.shape[2]
        half = self.window // 2
        bs = max(1, min(half, n))
        qs = q * (1.0 / math.sqrt(q.shape[-1]))
        qb, kb, vb, mb = to_blocks(qs, bs), to_blocks(k, bs), to_blocks(v, bs), mask_blocks(mask, bs)
        nb = qb.shape[2]
        idx, valid = window_table(nb, 1, q.device)                       # [nb, 3]
        pos = torch.arange(nb * bs, device=q.device).view(nb, bs)
        kpos = pos[idx].reshape(nb, 1, 3 * bs)                           # key positions per slot
        band = ((pos[:, :, None] - kpos).abs() <= half) & (kpos > 0)     # token 0 comes via the global column
        allow = band & slot_allow(valid, bs)
        glob = (k[:, :, :1], v[:, :, :1], mask[:, None, None, None, :1])
        out = from_blocks(block_sparse_attention(qb, kb, vb, mb, idx, allow, extra=glob, split=self.on_cpu), n)
        out0 = dense_rows(qs[:, :, :1], k, v, mask)                      # the global query row
        out = torch.cat([out0, out[:, :, 1:]], dim=2)
        return zero_padded(out, pad)
