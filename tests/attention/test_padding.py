"""The padding object every layer receives (:class:`attention.padding.Padding`).

It is decided once per batch on the host; ``any=True`` for a batch without padding must be
always correct (every variant's masked path gives the values of its unpadded fast path), and the
segments of a recurrent encoder must know which of them reach past the sequence."""
from __future__ import annotations

import pytest
import torch

from attention.padding import Padding, as_padding
from attention.registry import build_mixer, variant_names
from tests.attention_harness import N, float64_inputs
from tests.contract_sizes import SMALL_STRUCTURE
from tests.host_syncs import count_host_syncs


def test_lengths_and_the_host_statement() -> None:
    mask = torch.tensor([[True, True, False], [True, True, True]])
    with count_host_syncs() as spy:
        pad = Padding.of(mask)
        stated = Padding.of(mask, True)
    assert spy.syncs == 1 and pad.any and stated.any
    assert pad.lengths.tolist() == [2, 3] and pad.shape == (2, 3)
    assert as_padding(pad) is pad and as_padding(mask).any
    full = Padding.full(2, 3, "cpu")
    assert not full.any and full.mask.all() and full.lengths.tolist() == [3, 3]


def test_a_mask_of_another_kind_is_refused() -> None:
    with pytest.raises(TypeError, match=r"bool \[B, N\]"):
        Padding.of(torch.ones(2, 3))


def test_segments_mark_the_tail_that_reaches_past_the_sequence() -> None:
    segs = Padding.full(2, 10, "cpu").segments(4)
    assert [s.any for s in segs] == [False, False, True]
    assert [s.shape[1] for s in segs] == [4, 4, 4] and segs[2].lengths.tolist() == [2, 2]
    assert [s.any for s in Padding.full(1, 8, "cpu").segments(4)] == [False, False]
    padded = Padding.of(torch.arange(8)[None] < 6, True).segments(4)
    assert [s.any for s in padded] == [True, True] and padded[1].lengths.tolist() == [2]


@pytest.mark.parametrize("name", variant_names())
def test_stating_padding_for_an_unpadded_batch_changes_nothing(name: str) -> None:
    """``any=True`` is always correct: the masked path equals the unpadded fast path (eval, float64)."""
    torch.manual_seed(0)
    mixer = build_mixer(name, **SMALL_STRUCTURE.get(name, {}))(n_heads=2, head_dim=8, max_len=N).double().eval()
    inputs, mask = float64_inputs([N, N, N])
    args = inputs["q"], inputs["k"], inputs["v"]
    with torch.no_grad():
        fast = mixer(*args, Padding.of(mask, False), inputs["x"])
        masked = mixer(*args, Padding.of(mask, True), inputs["x"])
    torch.testing.assert_close(masked, fast, rtol=1e-10, atol=1e-10)
