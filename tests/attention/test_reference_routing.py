"""Routing attention against the float64 reference of section 4.1 (tests/reference/routing.py):
values and gradients (with the commitment loss) of q, k, v, train and eval, padded (with a fully
padded row) and unpadded; the centroids after the EMA update (train) or unchanged (eval); the
update under ``trainer=ddp`` (two gloo processes) equals the single-process one on the global batch."""
from __future__ import annotations

import socket

import pytest
import torch
import torch.multiprocessing as mp

from attention.routing import RoutingAttention
from tests.attention_harness import DEVICE, float64_inputs, lengths_mask, make_mixer
from tests.reference.agreement import RTOL, ATOL, assert_same, grads_of
from tests.reference.routing import routing_reference
from tests.reference.routing_ddp import routing_rank


N = 37     # divides neither the window (8) nor the cluster size (w = ceil(64 / 7) = 10)
MASKS = {"padded": [37, 23, 0], "unpadded": [37, 37, 37]}
SETTINGS = {"window": 8, "decay": 0.7, "commitment": 0.3, "n_clusters": 7}
# decay far from 1 makes the update visible; 7 clusters do not divide max_len (64), so ceil != floor


def _mixer(train: bool, **overrides):
    return make_mixer("routing", **{**SETTINGS, **overrides}).double().to(DEVICE).train(train)



@pytest.mark.parametrize("mode", ["train", "eval"])
@pytest.mark.parametrize("padding", list(MASKS))
def test_matches_reference_with_centroid_update(padding, mode):
    train = mode == "train"
    mixer = _mixer(train)
    inputs, mask = float64_inputs(MASKS[padding], N)
    before = mixer.centroids.clone()
    got = grads_of(lambda: (mixer(inputs["q"], inputs["k"], inputs["v"], mask, inputs["x"]),
                            mixer.aux_loss if train else None), inputs, mixer)
    after = mixer.centroids.clone()
    ref = {}

    def reference():
        out, aux, ref["centroids"], ref["untaken"] = routing_reference(mixer, inputs["q"], inputs["k"], inputs["v"],
                                                                      mask, before)
        return out, aux if train else None

    assert_same(got, grads_of(reference, inputs, mixer))
    assert ref["untaken"] > 0  # some tokens are taken by no cluster: the fallback is exercised
    if train:
        torch.testing.assert_close(after, ref["centroids"], rtol=RTOL, atol=ATOL)
        assert (after - before).abs().amax() > 1e-2
    else:
        assert torch.equal(after, before)


def test_commitment_loss_value():
    mixer = _mixer(True)
    inputs, mask = float64_inputs(MASKS["padded"], N)
    before = mixer.centroids.clone()
    mixer(inputs["q"], inputs["k"], inputs["v"], mask, inputs["x"])
    aux = routing_reference(mixer, inputs["q"], inputs["k"], inputs["v"], mask, before)[1]
    assert mixer.aux_loss is not None
    torch.testing.assert_close(mixer.aux_loss, aux, rtol=RTOL, atol=ATOL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.xdist_group("ddp")  # gloo on a port found free just before (tests/conftest.py)
def test_ddp_centroid_update_uses_every_rank(tmp_path):
    """Two gloo ranks, each with its own batch: both end with the centroids a single process gets
    from the two batches together (sums and counts all-reduced before the EMA)."""
    settings = {"n_heads": 2, "head_dim": 8, "max_len": 64, **SETTINGS}
    lengths = [[37, 20], [30, 37]]
    parts = [[t.detach().cpu() for t in list(float64_inputs(lengths[r], N, seed=10 + r)[0].values())[:3]] for r in range(2)]
    inputs = [(*parts[r], lengths_mask(lengths[r], n=N)) for r in range(2)]
    # fork: the ranks inherit the imported torch (a spawned child spends seconds re-importing it)
    mp.start_processes(routing_rank, args=(_free_port(), settings, inputs, str(tmp_path)), nprocs=2, join=True,
                       start_method="fork")
    torch.manual_seed(0)
    mixer = RoutingAttention(**settings).double().train()
    before = mixer.centroids.clone()
    q, k, v = (torch.cat(ts) for ts in zip(*parts))
    mixer(q, k, v, lengths_mask(lengths[0] + lengths[1], n=N), None)
    for rank in range(2):
        torch.testing.assert_close(torch.load(tmp_path / f"rank{rank}.pt"), mixer.centroids, rtol=RTOL, atol=ATOL)
    assert (mixer.centroids - before).abs().amax() > 1e-2
