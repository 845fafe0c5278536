"""Clustered and improved clustered attention (Vyas et al. 2020), written from eqs. 3-6 and 9-11
with the grouping of section 3.2.2 (SimHash codes, Lloyd's K-means in Hamming space), per row and
head in plain loops. Reads the mixer's hash planes only; the K-means conventions (seeds, majority
vote, ties keeping their bit, empty clusters restarting after the first assignment only) are the ones the module's docstring writes down."""
from __future__ import annotations

import math

import torch
from torch import Tensor


def hamming_kmeans_reference(codes: Tensor, real: list[int], n_clusters: int, iters: int) -> dict[int, int]:
    """Cluster of each real position; ``codes [N, bits]`` are +-1."""
    r = len(real)
    x = codes[real]                                                            # [r, bits]
    cent = torch.stack([codes[real[(c * r) // n_clusters]] for c in range(n_clusters)])
    for it in range(iters):
        sim = x @ cent.t()                                                    # bits - 2 * hamming
        labels = sim.argmax(-1)                                               # ties: lowest cluster
        distortion = codes.shape[1] - sim.max(-1).values
        far = sorted(range(r), key=lambda i: (-distortion[i].item(), i))      # farthest first, stable
        new, empty_rank = [], 0
        for c in range(n_clusters):
            votes = x[labels == c].sum(0)                                     # 0 for an empty cluster
            keep = torch.where(votes > 0, 1.0, torch.where(votes < 0, -1.0, cent[c])).to(x.dtype)  # tie: keep
            if it == 0 and not (labels == c).any():                           # the first update restarts
                cand = far[empty_rank] if empty_rank < r else None
                empty_rank += 1
                keep = x[cand] if cand is not None and distortion[cand] > 0 else cent[c]
            new.append(keep)
        cent = torch.stack(new)
    labels = (x @ cent.t()).argmax(-1)
    return {pos: int(lab) for pos, lab in zip(real, labels)}


def clustered_reference(mixer, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, planes: Tensor | None) -> tuple[Tensor, int]:
    """Output ``[B, H, N, D]`` and the number of non-singleton clusters seen (so a test can check
    that the clustering mattered). ``planes [H, D, bits]``: the mixer's draw (None: C >= N)."""
    b, h, n, d = q.shape
    c = min(mixer.clusters, n)
    out = torch.zeros_like(q)
    shared = 0
    for bi in range(b):
        real = [i for i in range(n) if mask[bi, i]]
        if not real:
            continue
        for hh in range(h):
            if mixer.clusters >= n:
                labels = {i: i for i in real}
            else:
                codes = torch.where(q[bi, hh].detach() @ planes[hh].to(q.dtype) >= 0, 1.0, -1.0).to(q.dtype)
                labels = hamming_kmeans_reference(codes, real, mixer.clusters, mixer.iterations)
            kr, vr = k[bi, hh, real], v[bi, hh, real]
            for j in sorted(set(labels.values())):
                members = [i for i in real if labels[i] == j]
                shared += len(members) > 1
                centroid = q[bi, hh, members].mean(0)                          # eq. 3
                ac = torch.softmax(kr @ centroid / math.sqrt(d), dim=0)        # eq. 4, over real keys
                if not mixer.improved or c == n:
                    out[bi, hh, members] = (ac @ vr).expand(len(members), d)   # eqs. 5-6
                    continue
                top = ac.topk(min(mixer.topk, n, len(real))).indices           # eq. 9: top-k keys
                rest = torch.ones(len(real), dtype=torch.bool, device=q.device)
                rest[top] = False
                mass = ac[top].sum()                                           # m_j
                exact = torch.softmax(q[bi, hh, members] @ kr[top].t() / math.sqrt(d), dim=-1)
                out[bi, hh, members] = (ac * rest) @ vr + mass * exact @ vr[top]   # eqs. 10-11
    return out, shared
