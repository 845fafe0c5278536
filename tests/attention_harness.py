"""Helpers for attention tests: build any registered variant at test sizes, reference softmax,
and a tiny synthetic task on which every variant must beat chance."""
from __future__ import annotations

import math
import os

import torch
from torch import Tensor

from attention.spec import class_of, complete_configs, draws, spec_of
from lra.checks.contract import B, DH, H, MAX_LEN, N, lengths_mask, make_mixer, qkvx  # noqa: F401 - the contract's sizes

# LRA_TEST_DEVICE=cuda runs the reference and contract tests on a GPU (the first session lent one).
DEVICE = torch.device(os.environ.get("LRA_TEST_DEVICE", "cpu"))


def _one_per_module() -> list[str]:
    """One config per attention module: the one its classes' specs name ``representative`` (the one
    that switches on the most of the module's code paths: AdaMRA's random router, ABC's random
    slots, the random synthesizer), else the config named as the module, else its first; the configs of a module share its
    code. Tests that cannot afford every config (Inductor's op coverage, resume of every run state)
    start from these; tests/attention/test_graph_safe.py checks every module has one."""
    by_module: dict[str, list[str]] = {}
    for name in complete_configs():
        by_module.setdefault(class_of(name).__module__, []).append(name)
    named = {spec_of(n).representative for n in complete_configs()}
    return sorted(next((n for n in names if n in named), next((n for n in names if n == module.rpartition(".")[2]),
                                                             names[0])) for module, names in by_module.items())


ONE_PER_MODULE = _one_per_module()
# Configs whose forward draws (Mixer.rand / randn / randint): their specs' ``draws``; each has a
# distribution test, and tests/attention/test_graph_safe_distributions.py checks no other config draws.
DRAWING = {name for name in complete_configs() if draws(name)}


def float64_inputs(lengths: list[int], n: int = N, seed: int = 1) -> tuple[dict[str, Tensor], Tensor]:
    """Float64 ``q, k, v, x`` on DEVICE that require grad (for reference comparisons), and the mask."""
    q, k, v, x = (t.double().to(DEVICE).requires_grad_(True) for t in qkvx(b=len(lengths), n=n, seed=seed))
    return {"q": q, "k": k, "v": v, "x": x}, lengths_mask(lengths, n=n).to(DEVICE)


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
