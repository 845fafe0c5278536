"""Linear Transformer attention (Katharopoulos et al. 2020, "Transformers are RNNs").

Eq. 6 of the paper with the feature map of eq. 7, phi(x) = elu(x) + 1::

    V'_i = phi(Q_i)^T (sum_j phi(K_j) V_j^T) / (phi(Q_i)^T sum_j phi(K_j))

computed right-to-left in O(N d^2). The denominator (the row normaliser) is part of the method;
one LRA port leaves it out, which is a different, unnormalised model.

Choices the paper leaves open, written down:

* No 1/sqrt(d) scaling of q or k: the paper applies none and phi is not scale-covariant anyway.
* Padding: phi(K_j) is set to zero at padded keys before both sums, so padded keys enter neither
  the numerator nor the normaliser (zeroing V alone would still count them in the normaliser).
* ``eps`` (1e-6, as in the authors' code) is added to the normaliser. phi > 0, so a row with at
  least one real key has a strictly positive normaliser and eps only guards round-off; a sample
  with no real key has numerator 0 and normaliser eps, i.e. output 0. Padded query rows are zeroed.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attention.base import Mixer, require_positive
from attention.masking import zero_padded


def elu_feature_map(x: Tensor) -> Tensor:
    """phi(x) = elu(x) + 1 (eq. 7): positive, so the normaliser never vanishes on real keys."""
    return F.elu(x) + 1.0


class LinearAttention(Mixer):
    def __init__(self, n_heads: int, head_dim: int, max_len: int, layer_idx: int = 0, eps: float = 1e-6) -> None:
        super().__init__(n_heads, head_dim, max_len, layer_idx)
        require_positive(eps=eps)
        self.eps = eps

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, x: Tensor) -> Tensor:
        keep = mask[:, None, :, None].to(q.dtype)
        phi_q = elu_feature_map(q)
        phi_k = elu_feature_map(k) * keep               # padded keys: no mass anywhere
        kv = torch.einsum("bhnd,bhne->bhde", phi_k, v)  # sum_j phi(K_j) V_j^T
        z = phi_k.sum(dim=2)                            # sum_j phi(K_j)
        num = torch.einsum("bhnd,bhde->bhne", phi_q, kv)
        den = torch.einsum("bhnd,bhd->bhn", phi_q, z).unsqueeze(-1) + self.eps
        return zero_padded(num / den, mask)
