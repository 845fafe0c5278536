"""ABC oracles: identity control is softmax (footnote 2), W_phi = 0 averages V, Linformer control
with an identity projection is softmax, one-hot controls write each token to one slot, and the
tied W_phi is shared within a model and never across models."""
from __future__ import annotations

import pytest
import torch

from attention.abc import ABCAttention, ControlTie
from attention.registry import build_mixer
from models.network import LRAClassifier
from tests.attention_harness import MAX_LEN, N, lengths_mask, make_mixer, qkvx, softmax_reference

LENGTHS = [N, 23, 5]


def masked_mean(v, mask):
    w = mask[:, None, :, None].to(v.dtype)
    return ((v * w).sum(2, keepdim=True) / w.sum(2, keepdim=True).clamp_min(1)).expand_as(v) * w


@pytest.mark.parametrize("memory_size", [N, MAX_LEN])
def test_identity_control_is_softmax(memory_size):
    """Segment control with n >= N writes token t to its own slot: phi_t = e_t (empty slots unused)."""
    mixer = make_mixer("abc_rd", control="segment", memory_size=memory_size).eval()
    q, k, v, x = qkvx()
    mask = lengths_mask(LENGTHS)
    torch.testing.assert_close(mixer(q, k, v, mask, x), softmax_reference(q, k, v, mask), atol=1e-5, rtol=1e-4)


def test_zero_w_phi_gives_mean_of_values():
    mixer = make_mixer("abc_mlp").eval()
    with torch.no_grad():
        mixer.w_phi.weight.zero_()
    q, k, v, x = qkvx()
    mask = lengths_mask(LENGTHS)
    torch.testing.assert_close(mixer(q, k, v, mask, x), masked_mean(v, mask), atol=1e-5, rtol=1e-4)


def test_linformer_identity_control_is_softmax():
    mixer = make_mixer("abc_rd", control="linformer", memory_size=MAX_LEN).eval()
    with torch.no_grad():
        mixer.w_lf.copy_(torch.eye(MAX_LEN))
    q, k, v, x = qkvx()
    mask = lengths_mask(LENGTHS)
    torch.testing.assert_close(mixer(q, k, v, mask, x), softmax_reference(q, k, v, mask), atol=1e-5, rtol=1e-4)


def test_mlp_control_normalised_over_real_tokens():
    mixer = make_mixer("abc_mlp").eval()
    _, _, _, x = qkvx()
    mask = lengths_mask(LENGTHS)
    phi = mixer.control_vectors(mask, x)
    torch.testing.assert_close(phi.sum(2), torch.ones_like(phi.sum(2)))
    assert (phi[~mask[:, None, :, None].expand_as(phi)] == 0).all()
    assert (phi[mask[:, None, :, None].expand_as(phi)] > 0).all()  # exp never stores "nothing"


def test_segment_control_slots_are_contiguous_means():
    n_slots = 4
    mixer = make_mixer("abc_rd", control="segment", memory_size=n_slots).eval()
    q, k, v, x = qkvx()
    mask = lengths_mask(LENGTHS)
    out = mixer(q, k, v, mask, x)
    for b, length in enumerate(LENGTHS):
        slot = torch.tensor([n_slots * t // length for t in range(length)])
        km = torch.stack([k[b, :, :length][:, slot == j].mean(1) for j in range(n_slots) if (slot == j).any()], 1)
        vm = torch.stack([v[b, :, :length][:, slot == j].mean(1) for j in range(n_slots) if (slot == j).any()], 1)
        ref = softmax_reference(q[b:b + 1, :, :length], km[None], vm[None])
        torch.testing.assert_close(out[b:b + 1, :, :length], ref, atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("normalize", [True, False])
def test_random_control_single_slot(normalize):
    """n = 1: every token goes to the one slot; its value is the mean (normalised) or the sum."""
    mixer = make_mixer("abc_rd", memory_size=1, normalize=normalize).eval()
    q, k, v, x = qkvx()
    mask = lengths_mask(LENGTHS)
    expected = masked_mean(v, mask)
    if not normalize:
        expected = expected * mask.sum(1).to(v.dtype)[:, None, None, None]
    torch.testing.assert_close(mixer(q, k, v, mask, x), expected, atol=1e-4, rtol=1e-4)


def test_random_control_one_slot_per_token_fresh_in_training():
    mixer = make_mixer("abc_rd", normalize=False)
    _, _, _, x = qkvx()
    mask = lengths_mask(LENGTHS)
    phis = [mixer.train().control_vectors(mask, x) for _ in range(2)] + [mixer.eval().control_vectors(mask, x) for _ in range(2)]
    for phi in phis:
        assert torch.equal(phi.sum(-1), mask[:, None, :].expand(-1, phi.shape[1], -1).to(phi.dtype))
    assert not torch.equal(phis[0], phis[1])
    assert torch.equal(phis[2], phis[3])


def test_tied_w_phi_shared_within_a_model_not_across_models():
    partial = build_mixer("abc_mlp")
    layers = [partial(n_heads=2, head_dim=8, max_len=MAX_LEN, layer_idx=i) for i in range(3)]
    assert layers[0].w_phi is layers[1].w_phi is layers[2].w_phi
    again = partial(n_heads=2, head_dim=8, max_len=MAX_LEN, layer_idx=0)
    assert again.w_phi is not layers[0].w_phi

    net_a = LRAClassifier(build_mixer("abc_mlp"), vocab_size=10, num_classes=2, max_len=16, d_model=16, n_layers=2)
    net_b = LRAClassifier(build_mixer("abc_mlp", tie=None), vocab_size=10, num_classes=2, max_len=16, d_model=16, n_layers=2)
    attn = lambda net, i: net.encoder.blocks[i].attn.mixer  # noqa: E731
    assert attn(net_a, 0).w_phi is attn(net_a, 1).w_phi
    assert attn(net_b, 0).w_phi is not attn(net_b, 1).w_phi
    n_a = sum(p.numel() for p in net_a.parameters())
    n_b = sum(p.numel() for p in net_b.parameters())
    assert n_b - n_a == attn(net_b, 1).w_phi.weight.numel()


def test_tie_holder_rebuilds_on_shape_change():
    tie = ControlTie()
    a = ABCAttention(2, 8, MAX_LEN, layer_idx=0, tie=tie)
    b = ABCAttention(2, 4, MAX_LEN, layer_idx=1, tie=tie)
    assert a.w_phi is not b.w_phi


def test_rejects_bad_settings():
    with pytest.raises(ValueError, match="control"):
        make_mixer("abc_mlp", control="lsh")
    with pytest.raises(ValueError, match="positions"):
        mixer = make_mixer("abc_rd", control="linformer", max_len=16)
        q, k, v, x = qkvx()
        mixer(q, k, v, lengths_mask(LENGTHS), x)
