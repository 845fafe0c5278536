"""Helpers for attention tests: build any registered variant at test sizes, reference softmax,
and a tiny synthetic task on which every variant must beat chance."""
from __future__ import annotations

import math
import os

import torch
from torch import Tensor

from attention.registry import build_mixer

# LRA_TEST_DEVICE=cuda runs the reference and contract tests on a GPU (the first session lent one).
DEVICE = torch.device(os.environ.get("LRA_TEST_DEVICE", "cpu"))

B, H, N, DH = 3, 2, 37, 8   # N deliberately divides no block/segment size
MAX_LEN = 64

# One config per attention module: the one that switches on the most of the module's code paths
# (AdaMRA's random router, ABC's random slots, the random synthesizer); the configs of a module share
# its code. Tests that cannot afford every config (Inductor's op coverage, resume of every run state)
# start from these; tests/attention/test_graph_safe.py checks every module has one.
ONE_PER_MODULE = ["abc_rd", "adamra_random_router", "bigbird", "i_clustered", "linear", "linformer", "local",
                  "longformer", "memformer", "nystromformer", "performer", "reformer", "routing", "sinkhorn",
                  "softmax", "sparse_strided", "synthesizer_random"]
# Configs whose graph-safe forward draws (Mixer.rand / randn); each has a distribution test, and
# tests/attention/test_graph_safe_distributions.py checks no other config draws.
DRAWING = {"abc_rd", "adamra_random_router", "reformer", "clustered", "i_clustered", "performer",
           "performer_32", "sinkhorn"}


def make_mixer(name: str, n_heads: int = H, head_dim: int = DH, max_len: int = MAX_LEN, layer_idx: int = 0, seed: int = 0, **overrides):
    torch.manual_seed(seed)
    return build_mixer(name, **overrides)(n_heads=n_heads, head_dim=head_dim, max_len=max_len, layer_idx=layer_idx)


def qkvx(b: int = B, h: int = H, n: int = N, dh: int = DH, seed: int = 1, requires_grad: bool = False):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, dh, generator=g) for _ in range(3))
    x = torch.randn(b, n, h * dh, generator=g)
    if requires_grad:
        for t in (q, k, v, x):
            t.requires_grad_(True)
    return q, k, v, x


def float64_inputs(lengths: list[int], n: int = N, seed: int = 1) -> tuple[dict[str, Tensor], Tensor]:
    """Float64 ``q, k, v, x`` on DEVICE that require grad (for reference comparisons), and the mask."""
    q, k, v, x = (t.double().to(DEVICE).requires_grad_(True) for t in qkvx(b=len(lengths), n=n, seed=seed))
    return {"q": q, "k": k, "v": v, "x": x}, lengths_mask(lengths, n=n).to(DEVICE)


def lengths_mask(lengths: list[int], n: int = N) -> Tensor:
    return torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]


def softmax_reference(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None = None, scale: float | None = None) -> Tensor:
    """Materialised masked softmax attention; fully padded rows give zeros."""
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = torch.einsum("bhid,bhjd->bhij", q, k) * scale
    if mask is not None:
        scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    w = torch.softmax(scores, dim=-1).nan_to_num(0.0)
    out = torch.einsum("bhij,bhjd->bhid", w, v)
    if mask is not None:
        out = out * mask[:, None, :, None]
    return out
