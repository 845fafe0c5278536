"""Sparse Transformer attention (Child et al. 2019), fixed and strided factorised patterns.

Attention over a connectivity pattern S (eq. 2-3): ``a(x_i, S_i) = softmax(q_i K_{S_i}^T / sqrt(d)) V_{S_i}``,
with the two-part factorisations of Sec. 4.3 (stride l, the paper's l ~ sqrt(N)):

* strided: A(1) = {j : |i - j| <= l},   A(2) = {j : (i - j) mod l = 0}
* fixed:   A(1) = {j : floor(j/l) = floor(i/l)},   A(2) = {j : j mod l in {l-c, ..., l-1}}

Choices the paper leaves open (it defines the patterns autoregressively), written down:

* Bidirectional versions (LRA is classification): strided A(1) is the symmetric band
  ``|i - j| <= l`` (the causal form is ``i-l <= j <= i``) and A(2) takes every ``j = i (mod l)`` in
  both directions; fixed A(2) takes the summary cells of *every* block, past and future.
* The two parts are combined in one head as the "merged" integration of Sec. 4.4: every head
  attends to ``A(1) ∪ A(2)`` under one softmax; a key in both parts is counted once.
* Stride: Sec. 4.3 chooses l close to sqrt(n), which gives the O(n sqrt n) cost. ``stride: null``
  (the default) is ``round(sqrt(max_len))``, fixed at construction from the configured ``max_len``,
  not from the length of a batch, so padding or a shorter batch never changes the pattern. A fixed
  stride would make the fixed pattern quadratic: its ``c N / l`` summary columns grow linearly with
  N (issue 14 measured 67x wall time from N = 1K to 8K at l = 64; on one encoder block, batch 2,
  CPU time grows 22x at l = 64 and 12x at sqrt stride). Below N = 4096 the sqrt stride is shorter
  than 64, so there it has more summary columns (c sqrt N against c N / 64) and costs more (1.3x
  time, 1.6x memory at 1K); above, less (0.7x at 8K). For LRA's 32 x 32 images
  sqrt(1024) = 32 is the row width: the period the strided pattern is meant for (Sec. 4.3). An
  explicit ``stride`` is kept for ablations. Written down for comparison: the paper's Enwik8 model
  (N = 12,288) uses l = 128, c = 32; the LRA JAX baseline (google-research/long-range-arena
  ``lra_benchmarks/utils/train_utils.py``) uses a causal fixed pattern with block 50, c = 10 at
  every length, built as a dense N x N mask, and its second fixed head also keeps ``j mod l == 0``
  (not in the paper; left out here).
* ``summary = 8`` (c) for the fixed pattern: the paper finds c in {8, 16, 32} good for l in
  {128, 256} (Sec. 4.3); c = 8 at l = 32 (N = 1K) is the Enwik8 ratio c/l = 1/4, and LRA's 10/50 is
  1/5. ``c`` is clamped to ``l``. When ``N <= stride`` both patterns cover the whole sequence (exact
  softmax): that is the clamp for short inputs.
* Block-wise implementation on blocks of ``l`` tokens (padded inside, cut back): strided = a
  3-block band gather plus attention along each residue class (a transpose of the block view);
  fixed = the own block plus the ``c * N / l`` summary columns shared by all queries. Costs
  ``O(N (3l + N/l))`` and ``O(N (l + cN/l))``, i.e. ``O(N sqrt N)`` at ``l ~ sqrt N`` (the default).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

from attention.base import Mixer
from attention.blocks import (from_blocks, gather_blocks, gather_key_mask, joint_softmax, mask_blocks, slot_allow,
                              to_blocks, window_table)
from attention.masking import zero_padded
from attention.padding import Padding
from attention.spec import Grid, Knob, Spec, cap, int_range

PATTERNS = ("fixed", "strided")


def default_stride(max_len: int) -> int:
    """The paper's ``l ~ sqrt(n)`` (Sec. 4.3), from the configured maximum length."""
    return max(1, round(math.sqrt(max_len)))


class SparseTransformerAttention(Mixer):
    spec = Spec(
        grid=Grid({"pattern": ("fixed", "strided"), "stride": (None, 1, 2, 5), "summary": (8, 1, 2)},
                  size="stride", unit=lambda r: cap(r["stride"])),
        ranges={"stride": int_range(1, 8, nullable=True), "summary": int_range(1, 8)},
        knobs=(Knob("stride", (8, 16, 32, 64)),), draws=False, small={"stride": 8, "summary": 2},
        documented=lambda m, o, heads, max_len: [
            ("pattern", m.pattern_name, o["pattern"]),
            ("stride", m.stride, max(1, round(max_len ** 0.5)) if o["stride"] is None else o["stride"]),
            ("summary", m.summary, min(o.get("summary", 8), m.stride))],
        representative="sparse_strided")

    def __init__(self, n_heads: int, head_dim: int, max_len: int, layer_idx: int = 0, pattern: str = "fixed",
                 stride: int | None = None, summary: int = 8) -> None:
        super().__init__(n_heads, head_dim, max_len, layer_idx)
        if pattern not in PATTERNS:
            raise ValueError(f"sparse pattern must be one of {PATTERNS}, got {pattern!r}")
        stride = default_stride(max_len) if stride is None else stride
        if stride <= 0 or summary <= 0:
            raise ValueError(f"sparse attention needs stride > 0 and summary > 0, got {stride}, {summary}")
        self.pattern_name = pattern
        self.stride = stride
        self.summary = min(summary, stride)

    def pattern(self, n: int) -> Tensor:
        """Dense ``[n, n]`` bool of the allowed (query, key) pairs; for tests only."""
        i, j = torch.arange(n)[:, None], torch.arange(n)[None, :]
        l, c = self.stride, self.summary
        if self.pattern_name == "strided":
            return ((i - j).abs() <= l) | ((i - j) % l == 0)
        return (i // l == j // l) | (j % l >= l - c)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, pad: Padding, x: Tensor) -> Tensor:
        mask = pad.mask
        n, l = q.shape[2], self.stride
        qb = to_blocks(q * (1.0 / math.sqrt(q.shape[-1])), l)
        kb, vb, mb = to_blocks(k, l), to_blocks(v, l), mask_blocks(mask, l)
        run = self._strided if self.pattern_name == "strided" else self._fixed
        return zero_padded(from_blocks(run(qb, kb, vb, mb), n), pad)

    def _strided(self, qb: Tensor, kb: Tensor, vb: Tensor, mb: Tensor) -> Tensor:
        nb, l = qb.shape[2], qb.shape[3]
        dev = qb.device
        # A(1): band |i-j| <= l, from blocks a-1, a, a+1.
        idx, valid = window_table(nb, 1, dev)
        pos = torch.arange(nb * l, device=dev).view(nb, l)
        band = ((pos[:, :, None] - pos[idx].reshape(nb, 1, 3 * l)).abs() <= l) & slot_allow(valid, l)
        kg, vg = gather_blocks(kb, idx), gather_blocks(vb, idx)
        s_band = qb @ kg.transpose(-1, -2)                                      # [B, H, nb, l, 3l]
        a_band = gather_key_mask(mb, idx) & band
        # A(2): same residue r = i mod l, key block b at |b - a| > 1 (closer ones are in the band).
        q_res, k_res, v_res = (t.transpose(2, 3) for t in (qb, kb, vb))        # [B, H, l, nb, D]
        s_col = (q_res @ k_res.transpose(-1, -2)).transpose(2, 3)               # [B, H, nb(a), l, nb(b)]
        blk = torch.arange(nb, device=dev)
        far = (blk[:, None] - blk[None, :]).abs() > 1                           # [nb(a), nb(b)]
        a_col = far[None, None, :, None, :] & mb.transpose(1, 2)[:, None, None, :, :]   # [B, 1, nb, l, nb]
        w_band, w_col = joint_softmax([s_band, s_col], [a_band, a_col])
        out_col = (w_col.transpose(2, 3) @ v_res).transpose(2, 3)               # [B, H, nb, l, D]
        return w_band @ vg + out_col

    def _fixed(self, qb: Tensor, kb: Tensor, vb: Tensor, mb: Tensor) -> Tensor:
        b, h, nb, l, d = qb.shape
        c = self.summary
        # A(1): the own block.
        s_own = qb @ kb.transpose(-1, -2)                                       # [B, H, nb, l, l]
        a_own = mb[:, None, :, None, :]
        # A(2): the last c cells of every other block (own block's are already in A(1)).
        k_sum = kb[:, :, :, l - c:].reshape(b, h, nb * c, d)
        v_sum = vb[:, :, :, l - c:].reshape(b, h, nb * c, d)
        s_sum = qb @ k_sum[:, :, None].transpose(-1, -2)                        # [B, H, nb, l, nb*c]
        blk = torch.arange(nb, device=qb.device)
        other = (blk[:, None] != blk.repeat_interleave(c)[None, :])             # [nb(a), nb*c]
        a_sum = other[None, None, :, None, :] & mb[:, :, l - c:].reshape(b, 1, 1, 1, nb * c)
        w_own, w_sum = joint_softmax([s_own, s_sum], [a_own, a_sum])
        return w_own @ vb + w_sum @ v_sum[:, :, None]
