"""Clustered and improved clustered attention against the float64 reference of eqs. 3-6 / 9-11 with
SimHash + Hamming K-means (tests/reference/clustered.py): values and gradients of q, k, v and the
labels, train and eval, padded (with a fully padded row) and unpadded, with a clustering that
matters (C < N, clusters of several queries, k < N) and with the defaults (C >= N: exact)."""
from __future__ import annotations

import pytest
import torch

from tests.attention_harness import DEVICE, float64_inputs, lengths_mask, make_mixer, qkvx, softmax_reference
from tests.reference.agreement import assert_same, grads_of, record_calls
from tests.reference.clustered import clustered_reference


N = 37
MASKS = {"padded": [37, 23, 5, 0], "unpadded": [37, 37, 37]}  # 5 < k: padded keys fill a top-k set
SETTINGS = {"clusters": {"clusters": 5, "topk": 7, "iterations": 4}, "defaults": {}}



@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("padding", list(MASKS))
@pytest.mark.parametrize("setting", list(SETTINGS))
@pytest.mark.parametrize("name", ["clustered", "i_clustered"])
def test_matches_reference(name, setting, padding, mode):
    mixer = make_mixer(name, **SETTINGS[setting]).double().to(DEVICE).train(mode == "train")
    inputs, mask = float64_inputs(MASKS[padding], N)
    planes = record_calls(mixer, "hash_planes")
    got = grads_of(lambda: (mixer(inputs["q"], inputs["k"], inputs["v"], mask, inputs["x"]), None), inputs, mixer)
    shared = []

    def reference():
        out, n_shared = clustered_reference(mixer, inputs["q"], inputs["k"], inputs["v"], mask,
                                            planes[-1] if planes else None)
        shared.append(n_shared)
        return out, None

    assert_same(got, grads_of(reference, inputs, mixer))
    if setting == "clusters":  # the clustering really groups queries (not one cluster per query)
        assert planes and shared[0] >= 5
    else:                      # C >= N: every query is its own cluster, i.e. exact softmax
        torch.testing.assert_close(got[0], softmax_reference(*(inputs[t].detach() for t in "qkv"), mask))


def test_planes_fresh_in_training_fixed_in_eval():
    mixer = make_mixer("i_clustered", clusters=5).double()
    planes = record_calls(mixer, "hash_planes")
    q, k, v, x = (t.double() for t in qkvx(n=N))
    mask = lengths_mask([37, 23, 9], n=N)
    outs = [mixer.train()(q, k, v, mask, x) for _ in range(2)] + [mixer.eval()(q, k, v, mask, x) for _ in range(2)]
    assert not torch.equal(planes[0], planes[1]) and torch.equal(planes[2], planes[3])
    assert not torch.equal(outs[0], outs[1]) and torch.equal(outs[2], outs[3])
