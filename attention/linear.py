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

``normaliser="sqrt_len"`` is not the Linear Transformer: it is the linear attention of the
Nyströmformer authors' LRA code (``LRA/code/attention_linear.py`` of mlpen/Nystromformer), the
codebase whose protocol AdaMRA Table 1 follows, kept as the ablation ``+ablation=linear_unnormalised``
to test whether that model explains Table 1's Linear row. That code scales phi(Q) and phi(K) by
N^-1/4 each, N being its fixed padded width, and never divides::

    V'_i = phi(Q_i)^T (sum_j phi(K_j) V_j^T) / sqrt(max_len)

Padding as above (padded keys zeroed in phi(K), padded query rows zeroed). The scale uses
``max_len``, not the batch's width, so evaluation batches cut to their longest sequence compute the
same model. The port's width is ``max_len`` rounded up to a power of two (2048 for ListOps, whose
``max_len`` is 2000): a constant factor 1.012 apart, which the output projection absorbs.
Execution: eq. 6 is one hand-written autograd node (:class:`_LinearAttention`, which wins its
measured ratio against plain ops, written there); the ``sqrt_len`` ablation is plain ops. One
path, static shapes, no host read, compiles with ``fullgraph=True`` and no break.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from attention.base import Mixer, autocast_as, autocast_state, require_positive
from attention.padding import Padding
from attention.spec import FT, Grid, Peer, Range, Spec


def elu_feature_map(x: Tensor, keep: Tensor | None = None, out: Tensor | None = None) -> Tensor:
    """phi(x) = elu(x) + 1 (eq. 7): positive, so the normaliser never vanishes on real keys.

    With ``keep`` (0/1, broadcastable), ``phi(x) * keep`` in one fused pass (``keep + elu(x) * keep``).
    Its derivative is ``min(phi(x), 1)`` (1 above 0, ``exp(x) = phi(x)`` below): the backward needs
    no other tensor."""
    elu = F.elu(x)
    if keep is None:
        return torch.add(elu, 1.0, out=out)
    return torch.addcmul(keep, elu, keep, out=out)


class _LinearAttention(torch.autograd.Function):
    """Eq. 6 with eq. 7 in one node: ``out = (phi_q kv) * keep_row / (phi_q z + eps)``, ``kv = phi_k^T
    V``, ``z = sum_j phi_k_j``, padded keys zeroed in ``phi_k``.

    The feature maps are written into contiguous ``[B, H, N, d]`` buffers (q and k arrive as head
    views of ``[B, N, H*d]``): every GEMM reads them without a copy, and the backward multiplies by
    their derivative ``min(phi, 1)`` in one layout (autograd's elu backward pairs a contiguous gradient
    with the strided input, about twice as slow). The numerator's and the normaliser's gradients are
    written into one ``[..., N, e + 1]`` buffer, so each backward GEMM covers both. No ``out=``
    view is written in the backward, so the node compiles (``fullgraph``, no break).

    Kept against the same formula in plain autograd ops because it wins, forward + backward on one
    CPU thread (B 4, H 2, d 64, 5 interleaved rounds, /tmp script of this commit's note): time 0.73x
    at N 1024 and 0.66x at 4096, peak memory 0.92x at both.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, keep: Tensor, eps: float) -> Tensor:
        ctx.amp = autocast_state(q)                                 # backward as forward
        phi_q = elu_feature_map(q, out=q.new_empty(q.shape))
        phi_k = elu_feature_map(k, keep, out=k.new_empty(k.shape))          # padded keys: no mass anywhere
        e = v.shape[-1]
        kvz = torch.cat([phi_k.transpose(-1, -2) @ v, phi_k.sum(2).unsqueeze(-1)], dim=-1)   # [B, H, d, e + 1]
        num_den = phi_q @ kvz                                              # [B, H, N, e + 1]
        den = num_den[..., e] + eps
        row = keep[..., 0] / den                                           # 1 / normaliser; 0 at padded queries
        out = num_den[..., :e] * row.unsqueeze(-1)
        ctx.save_for_backward(phi_q, phi_k, v, kvz, out, den, row)
        return out

    @staticmethod
    def backward(ctx, grad: Tensor):
        phi_q, phi_k, v, kvz, out, den, row = ctx.saved_tensors
        e = grad.shape[-1]
        with autocast_as(ctx.amp):
            d_den = (grad * out).sum(-1, keepdim=True).div_(den.unsqueeze(-1)).neg_()   # -<grad, out> / den
            g = torch.cat([grad * row.unsqueeze(-1), d_den], dim=-1)             # d/d [numerator, normaliser]
            d_kvz = phi_q.transpose(-1, -2) @ g                            # [B, H, d, e + 1]
            dq = (g @ kvz.transpose(-1, -2)).mul_(phi_q.clamp(max=1.0))
            d_kv = d_kvz[..., :e]
            dk = (v @ d_kv.transpose(-1, -2)).add_(d_kvz[..., e].unsqueeze(-2)).mul_(phi_k.clamp(max=1.0))
            dv = phi_k @ d_kv
        return dq.to(phi_q.dtype), dk.to(phi_k.dtype), dv.to(v.dtype), None, None


def sqrt_len_linear_attention(q: Tensor, k: Tensor, v: Tensor, keep: Tensor, max_len: int) -> Tensor:
    """The unnormalised port (module docstring): ``phi(Q) (phi(K)^T V) / sqrt(max_len)``."""
    phi_k = elu_feature_map(k, keep)                                      # padded keys: no mass
    return (elu_feature_map(q) @ (phi_k.transpose(-1, -2) @ v)) * (keep * max_len ** -0.5)


NORMALISERS = ("row", "sqrt_len")


class LinearAttention(Mixer):
    spec = Spec(grid=Grid({"eps": (1e-6, 1e-2, 1.0)}),
                ranges={"eps": Range("float", 0.0, low_open=True, draw=(1e-9, 1.0))},
                knobs=(),  # no budget: elu+1 features of the head dimension (eq. 7)
                draws=False, small={}, documented=("eps",),
                peers=(Peer("linear", "fast-transformers LinearAttention", *FT, "elu+1, eps=1e-6", "peer_linear_ft",
                            "align_ft"),))

    def __init__(self, n_heads: int, head_dim: int, max_len: int, layer_idx: int = 0, eps: float = 1e-6,
                 normaliser: str = "row") -> None:
        super().__init__(n_heads, head_dim, max_len, layer_idx)
        require_positive(eps=eps)
        if normaliser not in NORMALISERS:
            raise ValueError(f"linear normaliser={normaliser!r}; valid: {', '.join(NORMALISERS)} "
                             "(row: the paper's eq. 6; sqrt_len: the unnormalised LRA port, an ablation)")
        self.eps = eps
        self.normaliser = normaliser

    def forward(self, q: Tensor, k: Tensor, v: Tensor, pad: Padding, x: Tensor) -> Tensor:
        mask = pad.mask
        keep = mask[:, None, :, None].to(q.dtype)
        if self.normaliser == "sqrt_len":
            return sqrt_len_linear_attention(q, k, v, keep, self.max_len)
        return _LinearAttention.apply(q, k, v, keep, self.eps)
