"""AdaMRA (Zhang et al.) written straight from eqs. 6-9, in plain loops over rows and heads.

Reads the mixer's parameters (router ``W``, eq. 9's per-head maps) and, for the random router, the
heads it drew; it never calls the mixer's forward logic. The router's straight-through gate
``P / stopgrad(P)`` (the repository's documented choice: value 1, gradient ``(G.out) grad log P``)
is written out so the router gradient is compared in value.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor


def elu_plus_one(t: Tensor) -> Tensor:
    return torch.where(t > 0, t, torch.exp(t) - 1.0) + 1.0


def adamra_reference(mixer, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, heads: Tensor | None = None) -> Tensor:
    """q, k, v ``[B, S, N, Dh]`` (S subheads), mask ``[B, N]``; ``heads [B, N]``: the random router's
    draw (ignored for the learned router). Returns ``[B, S, N, Dh]``."""
    b, s, n, dh = q.shape
    d = s * dh
    full = lambda t: t.transpose(1, 2).reshape(b, n, d)  # noqa: E731
    qf, kf, vf = full(q), full(k), full(v)
    n_heads = len(mixer.rates)
    if mixer.route is not None:
        p = torch.softmax(qf @ mixer.route.weight.t(), dim=-1)               # eq. 6, [B, N, H]
        heads = p.argmax(-1)
        p_sel = p.gather(-1, heads[..., None])[..., 0]
        gate = p_sel / p_sel.detach()
    else:
        gate = torch.ones(b, n, dtype=q.dtype, device=q.device)
    eye = torch.eye(d, dtype=q.dtype, device=q.device)
    out = torch.zeros(b, n, s, dh, dtype=q.dtype, device=q.device)
    for bi in range(b):
        for h in range(n_heads):
            size = max(1, round(1.0 / mixer.rates[h]))
            wq, wk, wv = (eye, eye, eye) if mixer.head_weight is None else mixer.head_weight[h]
            keys, values = [], []
            for start in range(0, n, size):                                   # segment means
                members = [j for j in range(start, min(start + size, n)) if mask[bi, j]]
                if members:
                    keys.append(kf[bi, members].mean(0))
                    values.append(vf[bi, members].mean(0))
            routed = [i for i in range(n) if mask[bi, i] and heads[bi, i] == h]
            if not keys or not routed:
                continue
            kt = (torch.stack(keys) @ wk).view(-1, s, dh)                      # eq. 9, [m, S, Dh]
            vt = (torch.stack(values) @ wv).view(-1, s, dh)
            qh = (qf[bi, routed] @ wq).view(-1, s, dh)                         # [r, S, Dh]
            if mixer.feature_map == "softmax":
                w = torch.softmax(torch.einsum("rsd,msd->rsm", qh, kt) / math.sqrt(dh), dim=-1)
                o = torch.einsum("rsm,msd->rsd", w, vt)
            else:                                                             # eq. 7
                phi = torch.relu if mixer.feature_map == "relu" else elu_plus_one
                w = torch.einsum("rsd,msd->rsm", phi(qh), phi(kt))
                o = torch.einsum("rsm,msd->rsd", w, vt) / w.sum(-1, keepdim=True).clamp_min(mixer.eps)
            out[bi, routed] = o * gate[bi, routed][:, None, None]
    return out.transpose(1, 2)
