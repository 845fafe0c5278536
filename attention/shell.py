"""The multi-head shell shared by every variant (fast-transformers' AttentionLayer idea).

It owns the q/k/v/output projections and head splitting; the wrapped :class:`~attention.base.Mixer`
only mixes tokens per head. A Hydra attention config is a *partial* mixer constructor
(``_partial_: true``), completed here with the shape arguments of the layer.
"""
from __future__ import annotations

from typing import Callable

from torch import Tensor, nn

from attention.base import Mixer
from attention.padding import Padding, as_padding


class MultiHeadAttention(nn.Module):
    def __init__(
        self,
        d_model: int,
        n_heads: int,
        mixer: Callable[..., Mixer],
        max_len: int,
        layer_idx: int = 0,
        bias: bool = True,
    ) -> None:
        super().__init__()
        if n_heads <= 0 or d_model % n_heads:
            raise ValueError(
                f"model.n_heads={n_heads} must be positive and divide model.d_model={d_model}; "
                f"choose n_heads among the divisors of {d_model}"
            )
        self.n_heads = n_heads
        self.head_dim = d_model // n_heads
        self.mixer = mixer(n_heads=n_heads, head_dim=self.head_dim, max_len=max_len, layer_idx=layer_idx)
        uses_qk = self.mixer.uses_qk
        self.q_proj = nn.Linear(d_model, d_model, bias=bias) if uses_qk else None
        self.k_proj = nn.Linear(d_model, d_model, bias=bias) if uses_qk and not self.mixer.shared_qk else None
        self.v_proj = nn.Linear(d_model, d_model, bias=bias)
        self.out_proj = nn.Linear(d_model, d_model, bias=bias)

    def _heads(self, t: Tensor) -> Tensor:
        b, n, _ = t.shape
        return t.view(b, n, self.n_heads, self.head_dim).transpose(1, 2)

    def forward(self, x: Tensor, pad: Padding | Tensor) -> Tensor:
        """x: ``[B, N, D]``; pad: the batch's padding (mask ``[B, N]``, True = real token). Returns ``[B, N, D]``.
        A bool mask tensor is wrapped (one host read: a layer called on its own)."""
        pad = as_padding(pad)
        if self.mixer.fuses_projections:
            out = self.mixer.forward_input(x, pad, self.q_proj, self.k_proj, self.v_proj)
            return self.out_proj(out.transpose(1, 2).flatten(2))
        v = self._heads(self.v_proj(x))
        if self.q_proj is None:  # the mixer builds its mixing from x alone
            q = k = v.new_empty(v.shape[:-1] + (0,))
        else:
            q = self._heads(self.q_proj(x))
            k = q if self.k_proj is None else self._heads(self.k_proj(x))
        out = self.mixer(q, k, v, pad, x)
        return self.out_proj(out.transpose(1, 2).flatten(2))
