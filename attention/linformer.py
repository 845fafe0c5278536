"""Linformer attention (Wang et al. 2020, "Linformer: Self-Attention with Linear Complexity").

Eq. 7 of the paper: keys and values are projected along the sequence by learned E, F in R^{n x k}::

    head = softmax(Q (E^T K)^T / sqrt(d)) (F^T V)        # [n x k] attention, O(n k)

Choices the paper leaves open, written down:

* Ownership: every layer's mixer owns its own E and F as parameters of shape ``[max_len, k]``
  (one LRA port kept a single projection as a class attribute, shared by every layer and model in
  the process). E and F are shared by the heads of the layer ("headwise sharing", section 4 of the
  paper); ``share_kv: true`` ties F = E ("key-value sharing").
* Sequences shorter than ``max_len``: the first N rows of E and F are used (row j belongs to
  position j), so a position keeps its projection weights whatever the batch's padded length.
* ``k`` is clamped to ``max_len``: projecting n <= max_len tokens onto more than max_len slots adds
  parameters but no rank. With the test size (max_len 64) the default 256 becomes 64.
* Init: N(0, 1/max_len) (LeCun-normal over the sequence fan-in, like the Dense layer over the
  sequence in LRA's Linformer), so projected keys keep the scale of the keys at full length.
* Padding: padded keys and values are zeroed before the projection, so they contribute nothing to
  E^T K or F^T V. There is no mask after the projection (LRA's Linformer has none either, and the
  k projected slots are mixtures, not tokens): every projected slot stays a valid key. With
  zeroing, a right-padded sequence gives exactly what it gives unpadded at its own length (both sum
  over the same real rows of E, F); what no mask can undo is inherent to the method: a projected
  slot sums over however many tokens are real, so its scale depends on the length. Fully padded
  samples give zeros (all projected values are zero; padded query rows are zeroed). Whether the
  batch has padding at all is decided once per batch (``Padding.any``):
  an unpadded batch skips the three full-size mask passes.
* The 1/sqrt(d) scale is applied to the projected keys (``[d, k]`` per head, the smallest tensor
  on the logits' path).
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from attention.base import Mixer, require_positive
from attention.masking import zero_padded
from attention.padding import Padding
from attention.spec import Grid, Knob, Peer, Spec, cap, int_range


class LinformerAttention(Mixer):
    spec = Spec(grid=Grid({"k": (256, 1, 3, 8), "share_kv": (False, True)}, size="k", unit=lambda r: cap(r["k"])),
                ranges={"k": int_range(1, 20)}, knobs=(Knob("k", (32, 64, 128, 256, 512)),), draws=False,
                small={"k": 16},
                documented=lambda m, o, heads, max_len: [("k", m.k, min(o["k"], max_len)),
                                                         ("share_kv", m.proj_v is None, o["share_kv"])],
                peers=(Peer("linformer", "linformer LinformerSelfAttention", "linformer", "linformer", "k=256",
                            "peer_linformer", "align_linformer", biases=(False, True)),))

    def __init__(
        self, n_heads: int, head_dim: int, max_len: int, layer_idx: int = 0, k: int = 256, share_kv: bool = False,
    ) -> None:
        super().__init__(n_heads, head_dim, max_len, layer_idx)
        require_positive(k=k)
        self.k = min(k, max_len)
        std = max_len ** -0.5
        self.proj_k = nn.Parameter(torch.randn(max_len, self.k) * std)
        self.proj_v = None if share_kv else nn.Parameter(torch.randn(max_len, self.k) * std)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, pad: Padding, x: Tensor) -> Tensor:
        mask = pad.mask
        n = q.shape[2]
        if n > self.max_len:
            raise ValueError(f"sequence length {n} exceeds linformer max_len {self.max_len}: set task.max_len")
        e = self.proj_k[:n].to(q.dtype)
        f = e if self.proj_v is None else self.proj_v[:n].to(q.dtype)
        # Decided once per batch, as softmax: an unpadded batch skips three full-size mask passes.
        if pad.any:
            keep = mask[:, None, :, None].to(q.dtype)
            k, v = k * keep, v * keep
        # Projected along the sequence in the shell's [B, N, H*d] memory (a view of the projection
        # outputs: the GEMMs read and keep no copy), then split into heads.
        b, h, _, d = k.shape
        k_proj_t = (e.t() @ k.transpose(1, 2).reshape(b, n, h * d)).mul_(d ** -0.5)   # E^T K / sqrt(d)
        k_proj_t = k_proj_t.view(b, self.k, h, d).permute(0, 2, 3, 1)            # [B, H, d, k]
        v_proj = (f.t() @ v.transpose(1, 2).reshape(b, n, h * d)).view(b, self.k, h, d).transpose(1, 2)  # F^T V
        out = (q @ k_proj_t).softmax(dim=-1) @ v_proj
        return zero_padded(out, pad)
