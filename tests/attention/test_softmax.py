"""The exact softmax reference equals a hand-written masked softmax attention."""
from __future__ import annotations

import torch

from attention.softmax import SoftmaxAttention
from tests.attention_harness import N, lengths_mask, qkvx, softmax_reference


def test_equals_handwritten_masked_softmax():
    mixer = SoftmaxAttention(n_heads=2, head_dim=8, max_len=64).eval()
    q, k, v, x = qkvx()
    mask = lengths_mask([N, 17, 0])
    torch.testing.assert_close(mixer(q, k, v, mask, x), softmax_reference(q, k, v, mask), atol=1e-5, rtol=1e-4)


def test_unpadded_batch_uses_no_mask():
    mixer = SoftmaxAttention(n_heads=2, head_dim=8, max_len=64)
    q, k, v, x = qkvx()
    mask = torch.ones(q.shape[0], N, dtype=torch.bool)
    torch.testing.assert_close(mixer(q, k, v, mask, x), softmax_reference(q, k, v), atol=1e-5, rtol=1e-4)


def test_reference_detects_a_wrong_mask():
    """Guard on the oracle itself: masking a real key must change the result."""
    q, k, v, _ = qkvx()
    full = lengths_mask([N, N, N])
    cut = lengths_mask([N, N - 1, N])
    assert not torch.allclose(softmax_reference(q, k, v, full)[1], softmax_reference(q, k, v, cut)[1])
