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


def elu_feature_map(x: Tensor, keep: Tensor | None = None) -> Tensor:
    """phi(x) = elu(x) + 1 (eq. 7): positive, so the normaliser never vanishes on real keys.

    With ``keep`` (0/1, broadcastable), ``phi(x) * keep`` in one fused pass (``keep + elu(x) * keep``)."""
    elu = F.elu(x)
    return elu + 1.0 if keep is None else torch.addcmul(keep, elu, keep)


class _NormalisedProduct(torch.autograd.Function):
    """``out = (phi_q @ kv) * keep / (phi_q @ z + eps)`` from ``kvz = [kv | z]``, with a hand-written
    backward: the gradients of the numerator and of the normaliser are written into one
    ``[..., N, e + 1]`` buffer, so both GEMMs of the backward cover both (autograd's version of the
    column split costs two zero-filled copies of the product and an add)."""

    @staticmethod
    def forward(ctx, phi_q: Tensor, kvz: Tensor, keep_row: Tensor, eps: float) -> Tensor:
        e = kvz.shape[-1] - 1
        num_den = phi_q @ kvz                                     # [B, H, N, e + 1]
        den = num_den[..., e] + eps
        row = keep_row / den                                      # 1 / normaliser; 0 at padded queries
        out = num_den[..., :e] * row.unsqueeze(-1)
        ctx.save_for_backward(phi_q, kvz, out, den, row)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        phi_q, kvz, out, den, row = ctx.saved_tensors
        e = grad.shape[-1]
        g = grad.new_empty(*grad.shape[:-1], e + 1)
        torch.mul(grad, row.unsqueeze(-1), out=g[..., :e])       # d/d numerator
        torch.div((grad * out).sum(-1), den, out=g[..., e]).neg_()   # d/d normaliser = -<grad, out> / den
        return g @ kvz.transpose(-1, -2), phi_q.transpose(-1, -2) @ g, None, None


class LinearAttention(Mixer):
    def __init__(self, n_heads: int, head_dim: int, max_len: int, layer_idx: int = 0, eps: float = 1e-6) -> None:
        super().__init__(n_heads, head_dim, max_len, layer_idx)
        require_positive(eps=eps)
        self.eps = eps

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, x: Tensor) -> Tensor:
        e = v.shape[-1]
        keep = mask[:, None, :, None].to(q.dtype)
        phi_q = elu_feature_map(q)
        phi_k = elu_feature_map(k, keep)                          # padded keys: no mass anywhere
        kv = phi_k.transpose(-1, -2) @ v                          # sum_j phi(K_j) V_j^T      [B, H, d, e]
        z = phi_k.sum(dim=2, keepdim=True).transpose(-1, -2)      # sum_j phi(K_j)            [B, H, d, 1]
        # Numerator and normaliser from one GEMM; padded queries get a zero row scale (a [B, H, N]
        # factor, so the padding costs no full-size pass).
        return _NormalisedProduct.apply(phi_q, torch.cat([kv, z], dim=-1), keep.squeeze(-1), self.eps)
