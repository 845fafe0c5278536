"""The contract of attention/base.py, checked for EVERY variant in conf/attention/ (new YAML files
are covered automatically): shapes, padding invariance (eval and train), invariance to how far a
sequence is padded, independence from the rest of the batch, fully padded rows, gradients,
determinism. Known failures are listed once, in tests/known_failures.py.

The padding, padded-length and batch checks run at SMALL_STRUCTURE (tests/contract_sizes.py), so
that 37 tokens span several blocks, clusters and segments; the fuzz test covers the defaults.
Stochastic variants draw in training; a train-mode comparison gives both calls the same draws by
building each mixer from the same seed (fresh generator streams, fresh buffers) under the same
ambient RNG state."""
from __future__ import annotations

import pytest
import torch
from torch import Tensor

from attention.registry import variant_names
from tests.attention_harness import B, DEVICE, DH, H, N, lengths_mask, make_mixer, qkvx
from tests.contract_sizes import SMALL_STRUCTURE
from tests.known_failures import variant_cases

VARIANTS = variant_names()
LONG = 2 * N          # the padded length of test_padded_length_invariance
SEED = 123


def on_device(*tensors: Tensor) -> list[Tensor]:
    """The tensors on the test device, as leaves that keep their ``requires_grad``."""
    return [t.detach().to(DEVICE).requires_grad_(t.requires_grad) for t in tensors]


def fresh_call(name: str, mode: str, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, x: Tensor, **build):
    """One forward of a mixer built from ``SEED`` (so every call draws the same) in ``mode``;
    returns the output, the mixer's aux loss and its buffers after the call (state updates)."""
    mixer = make_mixer(name, seed=SEED, **{**SMALL_STRUCTURE.get(name, {}), **build}).to(DEVICE).train(mode == "train")
    torch.manual_seed(7)  # the same ambient state, as under seed_everything
    with torch.no_grad():
        out = mixer(*on_device(q, k, v), mask.to(DEVICE), x.to(DEVICE))
    aux = mixer.aux_loss.detach() if mixer.aux_loss is not None else None
    return out, aux, {n: b.detach().clone() for n, b in mixer.named_buffers()}


def assert_same_at_real(out: Tensor, out2: Tensor, mask: Tensor, what: str) -> None:
    real = mask.to(out.device)[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out[real], out2[real], atol=1e-5, rtol=1e-4, msg=lambda m: f"{what}: {m}")


@pytest.mark.parametrize("name", VARIANTS)
def test_shape_and_finite(name):
    mixer = make_mixer(name).to(DEVICE).eval()
    q, k, v, x = on_device(*qkvx())
    mask = lengths_mask([N, 20, 1]).to(DEVICE)
    out = mixer(q, k, v, mask, x)
    assert out.shape == (B, H, N, DH)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("name", VARIANTS)
def test_padding_invariance(name, mode):
    """Changing what sits at padded positions changes nothing at real positions, and in training
    neither the aux loss nor any state update (buffers such as routing centroids) sees it."""
    mask = lengths_mask([N, 23, 9])
    q, k, v, x = qkvx(seed=1)
    q2, k2, v2, x2 = qkvx(seed=2)
    pad = ~mask
    mixed = [torch.where(pad[:, None, :, None], b_, a_) for a_, b_ in ((q, q2), (k, k2), (v, v2))]
    x_mixed = torch.where(pad[:, :, None], x2, x)
    out, aux, state = fresh_call(name, mode, q, k, v, mask, x)
    out2, aux2, state2 = fresh_call(name, mode, *mixed, mask, x_mixed)
    assert_same_at_real(out, out2, mask, f"{name} ({mode})")
    assert (aux is None) == (aux2 is None)
    if aux is not None:
        torch.testing.assert_close(aux, aux2, atol=1e-6, rtol=1e-5, msg=lambda m: f"{name}: aux loss sees padding: {m}")
    for key in state:
        torch.testing.assert_close(state[key], state2[key], atol=1e-6, rtol=1e-5,
                                   msg=lambda m: f"{name}: buffer {key} updated from padded tokens: {m}")


# Training noise drawn with the shape of the padded input (Sinkhorn's Gumbel noise over block pairs)
# is aligned differently at another padded length: another sample of the same distribution, by
# design. Those variants are compared with that noise off; the rest of their training path is checked.
TRAIN_NOISE_OFF: dict[str, dict] = {"sinkhorn": {"gumbel_noise": False}}


def _padded_length_case(name: str, mode: str, **overrides) -> None:
    mask = lengths_mask([N, 23, 9])
    q, k, v, x = qkvx(seed=1)
    tail = qkvx(n=LONG - N, seed=3)  # what fills the extra padding (arbitrary, non-zero)
    long = [torch.cat([a, t], dim=2) for a, t in zip((q, k, v), tail)] + [torch.cat([x, tail[3]], dim=1)]
    long_mask = torch.cat([mask, torch.zeros(B, LONG - N, dtype=torch.bool)], dim=1)
    out, *_ = fresh_call(name, mode, q, k, v, mask, x, max_len=LONG, **overrides)
    out_long, *_ = fresh_call(name, mode, *long[:3], long_mask, long[3], max_len=LONG, **overrides)
    assert_same_at_real(out, out_long[:, :, :N], mask, f"{name} ({mode}) padded to {N} vs {LONG}")


@pytest.mark.parametrize("name", variant_cases("padded_length_eval"))
def test_padded_length_invariance_eval(name):
    """The same sequences padded to N and to 2N give the same outputs at their real positions."""
    _padded_length_case(name, "eval")


@pytest.mark.parametrize("name", variant_cases("padded_length_train"))
def test_padded_length_invariance_train(name):
    """As above in training, with the same draws (see TRAIN_NOISE_OFF)."""
    _padded_length_case(name, "train", **TRAIN_NOISE_OFF.get(name, {}))


@pytest.mark.parametrize("name", variant_cases("batch_independence"))
def test_batch_independence(name):
    """A row's eval output is the same alone (batch of one) and inside a batch of other rows."""
    mask = lengths_mask([N, 23, 9])
    q, k, v, x = qkvx(seed=1)
    out, *_ = fresh_call(name, "eval", q, k, v, mask, x)
    for i in range(B):
        row = slice(i, i + 1)
        alone, *_ = fresh_call(name, "eval", q[row], k[row], v[row], mask[row], x[row])
        assert_same_at_real(out[row], alone, mask[row], f"{name}: row {i} alone vs in the batch")


@pytest.mark.parametrize("name", VARIANTS)
def test_fully_padded_row_is_finite(name):
    mixer = make_mixer(name).to(DEVICE)
    q, k, v, x = on_device(*qkvx(requires_grad=True))
    mask = lengths_mask([N, 0, 5]).to(DEVICE)
    for mode in (mixer.train, mixer.eval):
        mode()
        out = mixer(q, k, v, mask, x)
        assert torch.isfinite(out).all(), f"{name}: non-finite output with a fully padded row"
        out.sum().backward()
        for t in (q, k, v, x):
            assert t.grad is None or torch.isfinite(t.grad).all()


@pytest.mark.parametrize("name", VARIANTS)
def test_gradients_reach_inputs_and_parameters(name):
    mixer = make_mixer(name).to(DEVICE).train()
    q, k, v, x = on_device(*qkvx(requires_grad=True))
    mask = lengths_mask([N, 30, 12]).to(DEVICE)
    out = mixer(q, k, v, mask, x)
    loss = out.pow(2).sum() + (mixer.aux_loss if mixer.aux_loss is not None else 0.0)
    loss.backward()
    assert v.grad is not None and v.grad.abs().sum() > 0, f"{name}: no gradient reaches v"
    for pname, p in mixer.named_parameters():
        if p.requires_grad:
            assert p.grad is not None and torch.isfinite(p.grad).all(), f"{name}: parameter {pname} gets no gradient"


@pytest.mark.parametrize("name", VARIANTS)
def test_deterministic_for_a_seed(name):
    q, k, v, x = on_device(*qkvx())
    mask = lengths_mask([N, 30, 12]).to(DEVICE)
    outs = []
    for _ in range(2):
        mixer = make_mixer(name, seed=123).to(DEVICE).train()
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
