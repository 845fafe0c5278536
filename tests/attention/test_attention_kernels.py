"""Oracles for the kernel (feature-map) attentions: Linear Transformer and Performer (FAVOR+)."""
from __future__ import annotations

import math

import pytest
import torch

from attention.linear import elu_feature_map
from tests.attention_harness import lengths_mask, make_mixer, qkvx, softmax_reference


def explicit_kernel_attention(phi_q, phi_k, v, mask):
    """O(N^2) form: A_ij = phi_q_i . phi_k_j over real keys, row-normalised; padded rows zero."""
    a = torch.einsum("bhim,bhjm->bhij", phi_q, phi_k) * mask[:, None, None, :]
    a = a / a.sum(-1, keepdim=True).clamp_min(1e-30)
    return torch.einsum("bhij,bhjd->bhid", a, v) * mask[:, None, :, None]


# ----------------------------------------------------------------------------- linear
def test_linear_equals_explicit_row_normalised_form():
    q, k, v, x = (t.double() for t in qkvx())
    mask = lengths_mask([37, 20, 3])
    mixer = make_mixer("linear", eps=1e-300).double().eval()
    out = mixer(q, k, v, mask, x)
    ref = explicit_kernel_attention(elu_feature_map(q), elu_feature_map(k), v, mask)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-10)


def test_linear_padded_keys_enter_no_normaliser():
    """Zeroing V alone is not enough: compare against a run on the truncated sequence."""
    q, k, v, x = qkvx(b=1)
    mask = lengths_mask([20])
    mixer = make_mixer("linear").eval()
    out = mixer(q, k, v, mask, x)[:, :, :20]
    short = mixer(q[:, :, :20], k[:, :, :20], v[:, :, :20], torch.ones(1, 20, dtype=torch.bool), x[:, :20])
    torch.testing.assert_close(out, short, atol=1e-6, rtol=1e-5)


def test_linear_gradcheck():
    q, k, v, x = (t.double() for t in qkvx(b=2, n=6, dh=3))
    for t in (q, k, v):
        t.requires_grad_(True)
    mask = lengths_mask([6, 4], n=6)
    mixer = make_mixer("linear", head_dim=3).double()
    assert torch.autograd.gradcheck(lambda a, b_, c: mixer(a, b_, c, mask, x), (q, k, v), fast_mode=True)


def test_linear_rejects_an_unknown_normaliser_naming_the_valid_ones():
    with pytest.raises(ValueError, match="normaliser='none'; valid: row, sqrt_len"):
        make_mixer("linear", normaliser="none")


# ----------------------------------------------------------------------------- performer
@pytest.mark.parametrize(("setting", "valid"), [("kernel", "softmax, relu"), ("scaling", "once, twice"),
                                                ("padded_keys", "excluded, zero_keys")])
def test_performer_rejects_an_unknown_setting_value_naming_the_valid_ones(setting, valid):
    with pytest.raises(ValueError, match=f"{setting}='none'; valid: {valid}"):
        make_mixer("performer", **{setting: "none"})


@pytest.mark.parametrize("kernel", ["softmax", "relu"])
def test_performer_factorised_equals_explicit_with_same_features(kernel):
    mixer = make_mixer("performer", kernel=kernel, nb_features=64).double().eval()
    q, k, v, x = (t.double() for t in qkvx())
    mask = lengths_mask([37, 21, 0])
    out = mixer(q, k, v, mask, x)
    ref = explicit_kernel_attention(mixer.feature_map(q, True), mixer.feature_map(k, False, mask), v, mask)
    torch.testing.assert_close(out, ref, atol=1e-10, rtol=1e-8)


def test_performer_feature_maps_match_the_paper():
    """softmax kernel: exp(w.x - |x|^2/2)/sqrt(m) up to a per-row constant (x = q d^-1/4);
    relu kernel: relu(w.x)/sqrt(m) + eps. The relu map must really be used when selected."""
    q, k, v, x = (t.double() for t in qkvx(b=1, n=5))
    soft = make_mixer("performer", nb_features=16).double().eval()
    relu = make_mixer("performer", kernel="relu", nb_features=16).double().eval()
    relu.features.copy_(soft.features)
    xs = q * q.shape[-1] ** -0.25
    proj = xs @ soft.features.T
    ideal = torch.exp(proj - 0.5 * xs.pow(2).sum(-1, keepdim=True)) / 4.0
    got = soft.feature_map(q, True)
    ratio = (got - 1e-6 / 4.0) / ideal  # eps (added per feature, times 1/sqrt(m)) removed
    torch.testing.assert_close(ratio, ratio[..., :1].expand_as(ratio), rtol=1e-9, atol=0)
    torch.testing.assert_close(relu.feature_map(q, True), torch.relu(proj) / 4.0 + 1e-3)
    full = lengths_mask([5], n=5)
    assert not torch.allclose(relu(q, k, v, full, x), soft(q, k, v, full, x), atol=1e-3)


def test_performer_scales_queries_and_keys_exactly_once():
    """With many features, FAVOR+ estimates softmax(QK^T/sqrt(d)): a double scaling would estimate
    softmax(QK^T/d) instead, which is far from the reference for these inputs."""
    q, k, v, x = qkvx(b=2, n=16, dh=8, seed=3)
    q, k = q * 0.5, k * 0.5
    mask = torch.ones(2, 16, dtype=torch.bool)
    mixer = make_mixer("performer", nb_features=8192).eval()
    out = mixer(q, k, v, mask, x)
    good = softmax_reference(q, k, v, mask)
    double = softmax_reference(q, k, v, mask, scale=1.0 / 8)
    err, err_double = (out - good).norm() / good.norm(), (out - double).norm() / double.norm()
    assert err < 0.06, err
    assert err_double > 3 * err, (err, err_double)


def test_performer_error_falls_as_features_grow():
    """Relative error against exact softmax, averaged over 6 feature draws per size."""
    q, k, v, x = qkvx(b=2, n=32, dh=8, seed=5)
    q, k = q * 0.5, k * 0.5
    mask = lengths_mask([32, 25], n=32)
    ref = softmax_reference(q, k, v, mask)
    errors = {}
    for m in (16, 64, 256, 1024):
        mixer = make_mixer("performer", nb_features=m, redraw_interval=1, seed=m)
        errs = []
        with torch.no_grad():
            for _ in range(6):
                out = mixer.train()(q, k, v, mask, x)   # each training call redraws (interval 1)
                errs.append(((out - ref).norm() / ref.norm()).item())
        errors[m] = sum(errs) / len(errs)
    assert errors[16] > errors[64] > errors[256] > errors[1024], errors
    assert errors[1024] < errors[16] / 4, errors       # ~1/sqrt(m): 8x expected from 16 to 1024
    assert errors[1024] < 0.08, errors


def test_performer_eval_is_deterministic_and_uses_the_last_training_features():
    mixer = make_mixer("performer", redraw_interval=1)
    q, k, v, x = qkvx()
    mask = lengths_mask([37, 30, 12])
    mixer.train()
    mixer(q, k, v, mask, x)
    trained = mixer.features.clone()
    mixer.eval()
    a, b_ = mixer(q, k, v, mask, x), mixer(q, k, v, mask, x)
    torch.testing.assert_close(a, b_, rtol=0, atol=0)
    assert torch.equal(mixer.features, trained), "eval must not redraw features"
    assert mixer.training_calls == 1, "eval must not advance the redraw counter"


@pytest.mark.parametrize("interval", [1, 3])
def test_performer_redraws_only_in_training_at_the_interval(interval):
    mixer = make_mixer("performer", redraw_interval=interval).train()
    q, k, v, x = qkvx()
    mask = lengths_mask([37, 30, 12])
    drawn = []
    for _ in range(2 * interval + 1):
        mixer(q, k, v, mask, x)
        drawn.append(mixer.features.clone())
    changes = [not torch.equal(a, b_) for a, b_ in zip(drawn, drawn[1:])]
    expected = [(i + 1) % interval == 0 for i in range(len(changes))]
    assert changes == expected


def test_performer_never_redraws_with_interval_zero_and_restores_counter():
    mixer = make_mixer("performer", redraw_interval=0).train()
    q, k, v, x = qkvx()
    mask = lengths_mask([37, 30, 12])
    mixer(q, k, v, mask, x)
    first = mixer.features.clone()
    for _ in range(3):
        mixer(q, k, v, mask, x)
    assert torch.equal(mixer.features, first)
    clone = make_mixer("performer", redraw_interval=0, seed=9)
    clone.load_state_dict(mixer.state_dict())
    assert clone.training_calls == 4 and torch.equal(clone.features, first)


def test_performer_padded_keys_excluded_from_normaliser():
    """Sample padded to 37 equals the same sample run at its real length (keys' max shift included)."""
    mixer = make_mixer("performer").eval()
    q, k, v, x = qkvx(b=1)
    k = k.clone()
    k[:, :, 20:] = 50.0  # huge padded keys would dominate the stabiliser if not excluded
    mask = lengths_mask([20])
    out = mixer(q, k, v, mask, x)[:, :, :20]
    short = mixer(q[:, :, :20], k[:, :, :20], v[:, :, :20], torch.ones(1, 20, dtype=torch.bool), x[:, :20])
    torch.testing.assert_close(out, short, atol=1e-6, rtol=1e-5)


def test_performer_orthogonal_blocks():
    mixer = make_mixer("performer", nb_features=20)
    w = mixer.features.double()
    assert w.shape == (20, 8)
    for block in (w[:8], w[8:16]):
        unit = block / block.norm(dim=-1, keepdim=True)
        torch.testing.assert_close(unit @ unit.T, torch.eye(8, dtype=torch.double), atol=1e-5, rtol=0)
    assert not math.isclose(w[0].norm().item(), w[1].norm().item())  # chi-distributed norms, not unit


def test_performer_gradcheck():
    q, k, v, x = (t.double() for t in qkvx(b=2, n=5, dh=4))
    for t in (q, k, v):
        t.requires_grad_(True)
    mask = lengths_mask([5, 3], n=5)
    mixer = make_mixer("performer", head_dim=4, nb_features=8, eps=1e-300).double().eval()  # shifts exact
    assert torch.autograd.gradcheck(lambda a, b_, c: mixer(a, b_, c, mask, x), (q, k, v), fast_mode=True)
