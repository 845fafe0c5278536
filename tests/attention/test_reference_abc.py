"""ABC_MLP and ABC_RD against the float64 reference of eqs. 3-4 / 12 (tests/reference/abc.py):
values and gradients of q, k, v, x and W_phi, train and eval, padded (with a fully padded row) and
unpadded; ABC_RD's slot draws (fresh per training step, per position in eval, batch-independent)."""
from __future__ import annotations

import pytest
import torch

from tests.attention_harness import DEVICE, float64_inputs, lengths_mask, make_mixer, qkvx
from tests.reference.abc import abc_reference
from tests.reference.agreement import assert_same, grads_of, record_calls


N = 37
MASKS = {"padded": [37, 23, 0], "unpadded": [37, 37, 37]}


def _mixer(name: str, train: bool, **overrides):
    mixer = make_mixer(name, **overrides).double().to(DEVICE).train(train)
    if mixer.control == "mlp":  # a learned, clearly non-uniform W_phi
        with torch.no_grad():
            mixer.w_phi.weight.copy_(0.5 * torch.randn(mixer.w_phi.weight.shape, dtype=torch.float64))
    return mixer



@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("padding", list(MASKS))
@pytest.mark.parametrize("name,overrides", [("abc_mlp", {}), ("abc_rd", {}), ("abc_rd", {"memory_size": 8}),
                                            ("abc_rd", {"memory_size": 8, "normalize": False})])
def test_matches_reference(name, overrides, padding, mode):
    """memory_size 64 > N leaves slots empty; 8 < N makes slots hold several tokens (means)."""
    mixer = _mixer(name, mode == "train", **overrides)
    inputs, mask = float64_inputs(MASKS[padding], N)
    draws = record_calls(mixer, "random_slots")
    got = grads_of(lambda: (mixer(inputs["q"], inputs["k"], inputs["v"], mask, inputs["x"]), None), inputs, mixer)
    slots = draws[-1] if draws else None
    want = grads_of(lambda: (abc_reference(mixer, inputs["q"], inputs["k"], inputs["v"], mask, inputs["x"], slots), None),
                    inputs, mixer)
    assert_same(got, want)
    if name == "abc_mlp":
        assert want[1]["param:w_phi.weight"].abs().sum() > 1e-3 and want[1]["x"].abs().sum() > 1e-3


def test_slot_draws_fresh_in_training_fixed_per_position_in_eval():
    mixer = make_mixer("abc_rd", memory_size=8)
    train = [mixer.train().random_slots(3, N, DEVICE) for _ in range(2)]
    assert not torch.equal(train[0], train[1])
    assert train[0].min() >= 0 and train[0].max() < 8 and len(train[0].unique()) == 8
    ev = [mixer.eval().random_slots(b, n, DEVICE) for b, n in ((3, N), (1, 20), (3, N))]
    assert torch.equal(ev[0], ev[2])
    assert torch.equal(ev[0][0], ev[0][2]) and not torch.equal(ev[0][:, 0], ev[0][:, 1])  # per head, not per row
    assert torch.equal(ev[1][0], ev[0][0, :, :20])   # a position's slot does not depend on N or B


def test_eval_output_of_a_sequence_does_not_depend_on_the_batch():
    mixer = _mixer("abc_rd", train=False, memory_size=8)
    q, k, v, x = (t.double().to(DEVICE) for t in qkvx(b=3, n=N))
    alone = mixer(q[1:2, :, :29], k[1:2, :, :29], v[1:2, :, :29], lengths_mask([29], n=29).to(DEVICE), x[1:2, :29])
    batch = mixer(q, k, v, lengths_mask([37, 29, 11], n=N).to(DEVICE), x)   # the sequence in row 1, padded to 37
    torch.testing.assert_close(batch[1:2, :, :29], alone, rtol=1e-10, atol=1e-12)
