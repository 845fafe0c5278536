"""Synthesizer attention (Tay et al. 2020, "Synthesizer: Rethinking Self-Attention in Transformer
Models"): attention weights synthesised without query-key dot products.

* Dense Synthesizer (section 3.1): per head h, logits for token i over positions j come from the
  token alone, B_i = W_2 relu(W_1 X_i + b_1) + b_2 with W_2 mapping to ``max_len`` positions, and
  Y = softmax(B) G(X) with G(X) the values (the shell's V).
* Random Synthesizer (section 3.2): per head a matrix R in R^{max_len x max_len} independent of the
  input, Y = softmax(R) G(X); ``trainable: true`` learns R, ``false`` keeps it fixed at its random
  init (both are in the paper). ``rank: r`` gives the paper's factorised form R = R_1 R_2^T with
  R_1, R_2 in R^{max_len x r}.

Choices the paper leaves open, written down:

* A sequence of length N <= max_len uses the logits of positions 0..N-1 (rows and columns):
  absolute positions, as the method is position-indexed.
* Padding: padded key positions get a large negative logit (never weight); padded query rows are
  zeroed; a sample with no real token gives zeros. Zero logits therefore give the masked mean of
  the real values.
* Dense hidden width per head = ``hidden`` (default: the head dim, so the first layer maps
  d_model -> d_model as in the paper's d x d W_1). W_1 reads the whole block input x (LayerNormed),
  one hidden slice per head. Init: W_1 as nn.Linear; W_2 uniform(+-1/sqrt(hidden)); b_2 zero.
* Random init: R ~ N(0, 1) (factorised: R_1, R_2 ~ N(0, r^-1/2) so R_1 R_2^T has unit variance),
  drawn from the mixer's seeded generator, so a fixed R is reproducible per run and per layer.
* No q/k: ``uses_qk = False``, so the shell builds no query/key projections (the paper drops them).
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attention.base import Mixer, require_positive
from attention.masking import key_bias, zero_padded


def _check_len(n: int, max_len: int) -> None:
    if n > max_len:
        raise ValueError(f"sequence length {n} exceeds synthesizer max_len {max_len}: set task.max_len")


def synthesized_attention(logits: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """softmax over real keys of ``logits`` ``[B|1, H, N, N]``, applied to ``v``; padded rows zero."""
    weights = torch.softmax(logits + key_bias(mask, logits.dtype), dim=-1)
    return zero_padded(weights @ v, mask)


class DenseSynthesizer(Mixer):
    uses_qk = False

    def __init__(
        self, n_heads: int, head_dim: int, max_len: int, layer_idx: int = 0, hidden: int | None = None,
    ) -> None:
        super().__init__(n_heads, head_dim, max_len, layer_idx)
        self.hidden = hidden or head_dim
        self.w1 = nn.Linear(n_heads * head_dim, n_heads * self.hidden)
        bound = 1.0 / math.sqrt(self.hidden)
        self.w2 = nn.Parameter(torch.empty(n_heads, self.hidden, max_len).uniform_(-bound, bound))
        self.b2 = nn.Parameter(torch.zeros(n_heads, max_len))

    def logits(self, x: Tensor) -> Tensor:
        """``[B, H, N, N]`` synthesised logits of every token over positions 0..N-1."""
        b, n, _ = x.shape
        _check_len(n, self.max_len)
        hid = torch.relu(self.w1(x)).view(b, n, self.n_heads, self.hidden).transpose(1, 2)
        return torch.einsum("bhnc,hcm->bhnm", hid, self.w2[:, :, :n]) + self.b2[None, :, None, :n]

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, x: Tensor) -> Tensor:
        return synthesized_attention(self.logits(x).to(v.dtype), v, mask)


class RandomSynthesizer(Mixer):
    uses_qk = False

    def __init__(
        self, n_heads: int, head_dim: int, max_len: int, layer_idx: int = 0,
        trainable: bool = True, rank: int | None = None,
    ) -> None:
        super().__init__(n_heads, head_dim, max_len, layer_idx)
        if rank is not None:
            require_positive(rank=rank, hint="or null for a full matrix")
        self.rank = rank
        g = self.generator("cpu")
        if rank is None:
            tensors = {"r": torch.randn(n_heads, max_len, max_len, generator=g)}
        else:
            std = rank ** -0.25
            tensors = {"r1": torch.randn(n_heads, max_len, rank, generator=g) * std,
                       "r2": torch.randn(n_heads, max_len, rank, generator=g) * std}
        for name, t in tensors.items():
            if trainable:
                self.register_parameter(name, nn.Parameter(t))
            else:
                self.register_buffer(name, t, persistent=True)

    def logits(self, n: int) -> Tensor:
        """``[1, H, N, N]`` the random logits restricted to positions 0..N-1."""
        _check_len(n, self.max_len)
        if self.rank is None:
            return self.r[None, :, :n, :n]
        return (self.r1[:, :n] @ self.r2[:, :n].transpose(-1, -2))[None]

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, x: Tensor) -> Tensor:
        return synthesized_attention(self.logits(v.shape[2]).to(v.dtype), v, mask)
