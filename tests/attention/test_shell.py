"""The multi-head shell builds only the projections a mixer uses."""
from __future__ import annotations

import torch

from attention.registry import build_mixer
from attention.shell import MultiHeadAttention


def test_projections_follow_the_mixer():
    full = MultiHeadAttention(16, 2, build_mixer("softmax"), max_len=8)
    assert full.q_proj is not None and full.k_proj is not None
    tied = MultiHeadAttention(16, 2, build_mixer("reformer"), max_len=8)
    assert tied.q_proj is not None and tied.k_proj is None  # shared QK
    synth = MultiHeadAttention(16, 2, build_mixer("synthesizer_dense"), max_len=8)
    assert synth.q_proj is None and synth.k_proj is None  # mixing from x alone
    out = synth(torch.randn(2, 8, 16), torch.ones(2, 8, dtype=torch.bool))
    assert out.shape == (2, 8, 16) and torch.isfinite(out).all()
