"""Routing Transformer attention (Roy et al. 2021, section 4.1) with local heads, in plain loops:
layer-normed q/k, balanced top-w cluster membership, eq. 8 per cluster combined by softmax mass,
block-local fallback, the commitment loss and the EMA centroid update. Reads the centroids only."""
from __future__ import annotations

import math

import torch
from torch import Tensor


def layer_norm(t: Tensor, eps: float = 1e-5) -> Tensor:
    mean = t.mean(-1, keepdim=True)
    var = ((t - mean) ** 2).mean(-1, keepdim=True)
    return (t - mean) / torch.sqrt(var + eps)


def _softmax_read(qi: Tensor, keys: Tensor, values: Tensor) -> tuple[Tensor, Tensor]:
    logits = keys @ qi / math.sqrt(qi.shape[-1])
    return torch.softmax(logits, 0) @ values, torch.logsumexp(logits, 0)


def routing_reference(mixer, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, centroids: Tensor):
    """Returns (output ``[B, H, N, D]``, commitment loss, updated centroids, tokens taken by no cluster).

    ``centroids [H_route, C, D]``: the mixer's centroids before the call."""
    b, h, n, d = q.shape
    nl, window = mixer.local_heads, min(mixer.window, n)
    n_clusters = centroids.shape[1]
    w = min(n, -(-mixer.max_len // n_clusters))   # from max_len: padding-independent
    out = torch.zeros_like(q)
    commit = q.new_zeros(())
    sums = torch.zeros_like(centroids)
    counts = centroids.new_zeros(centroids.shape[:2])
    untaken = 0
    for bi in range(b):
        real = [i for i in range(n) if mask[bi, i]]
        for hh in range(h):
            local = hh < nl
            qh, kh = (q[bi, hh], k[bi, hh]) if local else (layer_norm(q[bi, hh]), layer_norm(k[bi, hh]))
            taken: dict[int, list[int]] = {i: [] for i in real}
            key_sets = []
            if not local:
                mu = centroids[hh - nl]
                qu, ku = qh / qh.norm(dim=-1, keepdim=True), kh / kh.norm(dim=-1, keepdim=True)
                for c in range(n_clusters):
                    by_q = sorted(real, key=lambda i: -(qu[i] @ mu[c]).item())[:w]
                    by_k = sorted(real, key=lambda i: -(ku[i] @ mu[c]).item())[:w]
                    for i in by_q:
                        taken[i].append(c)
                    key_sets.append(by_k)
                for u in (qu, ku):                                             # commitment and EMA stats
                    for i in real:
                        cos = mu @ u[i]
                        commit = commit + (2 - 2 * cos.max())
                        best = int(cos.argmax())
                        sums[hh - nl, best] += u[i].detach()
                        counts[hh - nl, best] += 1
            for i in real:
                if taken[i]:                                                   # eq. 8, per cluster
                    reads = [_softmax_read(qh[i], kh[key_sets[c]], v[bi, hh, key_sets[c]]) for c in taken[i]]
                    lse = torch.stack([r[1] for r in reads])
                    wts = torch.softmax(lse, 0)                                # exp(lse_c) / sum exp(lse)
                    out[bi, hh, i] = sum(wt * r[0] for wt, r in zip(wts, reads))
                else:                                                          # block-local fallback
                    untaken += not local
                    block = [j for j in real if j // window == i // window]
                    out[bi, hh, i] = _softmax_read(qh[i], kh[block], v[bi, hh, block])[0]
    n_real = max(1, int(mask.sum()) * (h - nl))
    aux = mixer.commitment * commit / n_real
    mean = sums / counts.clamp(min=1)[..., None]
    moved = mixer.decay * centroids + (1 - mixer.decay) * mean
    moved = moved / moved.norm(dim=-1, keepdim=True)
    new = torch.where(counts[..., None] > 0, moved, centroids)
    return out, aux, new, untaken
