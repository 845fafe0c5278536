"""Ratios behind the hand-written autograd nodes and the CPU split of attention/clustered.py (issue 62):
each node against the same arithmetic in plain operators, fwd + bwd, B 8, H 2, C 100, N 1024, D 32,
k 32, float32, one thread, rounds interleaved in one process.

    OMP_NUM_THREADS=1 python -m tests.bench.node_ratios below [rounds]   # _ClusteredBelowTopK
    OMP_NUM_THREADS=1 python -m tests.bench.node_ratios exact [rounds]   # _ExactTopK, one pass and CPU slices
"""
from __future__ import annotations

import math
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from attention import clustered
from attention.masking import key_bias

B, H, N, D, C, K = 8, 2, 1024, 32, 100, 32


def _below():
    cent = torch.randn(B, H, C, D, requires_grad=True)
    k, v = (torch.randn(B, N, H, D).transpose(1, 2).contiguous().requires_grad_() for _ in range(2))
    bias, scale = torch.zeros(B, 1, 1, N), 1 / math.sqrt(D)

    def node():
        return clustered._ClusteredBelowTopK.apply(cent, k, v, bias, K, scale)[:2]

    def plain():
        ac = torch.softmax(torch.matmul(cent, k.mT) * scale + bias, dim=-1)
        top_mass, top_idx = ac.topk(K, dim=-1)
        return ac.scatter(-1, top_idx, 0.0) @ v, top_mass.sum(-1)

    return {"node": node, "plain": plain}, lambda r: r[0].pow(2).sum() + r[1].sum()


def _exact():
    g = torch.Generator().manual_seed(0)
    labels = torch.randint(0, C, (B, H, N), generator=g)
    top_idx = torch.rand(B, H, C, N, generator=g).topk(K, -1).indices
    mask = torch.ones(B, N, dtype=torch.bool)
    q, k, v = (torch.randn(B, N, H, D).transpose(1, 2).requires_grad_() for _ in range(3))
    rest, mass = torch.randn(B, H, C, D, requires_grad=True), torch.rand(B, H, C, requires_grad=True)
    split = clustered.ClusteredAttention.cpu_slice_bytes // (K * D * 4)

    def plain():
        chunk = max(1, min(16, N // C))
        slots, source, chunk_cluster, n_slots = clustered.cluster_major_slots(labels, C, chunk)
        gg = B * H * (n_slots // chunk)
        keys = top_idx.gather(2, chunk_cluster.clamp(max=C - 1)[..., None].expand(-1, -1, -1, K)).view(B, H, -1)
        bias = key_bias(mask, q.dtype)[:, 0].expand(B, H, N).gather(2, keys).view(gg, 1, K)
        qs = clustered._rows(q, source).view(gg, chunk, D)
        ks, vs = (clustered._rows(t, keys).view(gg, K, D) for t in (k, v))
        p = torch.softmax(torch.baddbmm(bias, qs, ks.mT, alpha=0.17), dim=-1)
        m = F.pad(mass, (0, 1)).gather(2, chunk_cluster).view(gg, 1, 1)
        part = torch.baddbmm(clustered._rows(F.pad(rest, (0, 0, 0, 1)), chunk_cluster).view(gg, 1, D), p * m, vs)
        return clustered._rows(part.view(B, H, n_slots, D), slots)

    args = (q, k, v, mask, labels, top_idx, rest, mass, 0.17)
    return ({"node one pass": lambda: clustered.improved_output(*args),
             "node CPU slices": lambda: clustered.improved_output(*args, split), "plain": plain},
            lambda r: r.pow(2).sum())


def main(argv: list[str]) -> None:
    torch.set_num_threads(1)
    fns, loss = {"below": _below, "exact": _exact}[argv[0]]()
    rounds = int(argv[1]) if len(argv) > 1 else 8
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(rounds + 1):
        for name, f in fns.items():
            t = time.perf_counter()
            loss(f()).backward()
            times[name].append(time.perf_counter() - t)
    first = next(iter(fns))
    for name, ts in times.items():
        ratio = statistics.median(a / b for a, b in zip(ts[1:], times[first][1:]))
        print(f"{name:16s} {statistics.median(ts[1:]) * 1e3:7.1f} ms   / {first}: {ratio:.2f}")


if __name__ == "__main__":
    main(sys.argv[1:])
