"""AdaMRA oracles: eq. 7 with one uncompressed head is ReLU linear attention, a single landmark gives
mean(V), routing picks exactly one head per query, and the router learns."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attention.registry import build_mixer
from attention.shell import MultiHeadAttention
from tests.attention_harness import B, DH, H, N, lengths_mask, make_mixer, qkvx

LENGTHS = [N, 23, 5]


def relu_linear_attention(q, k, v, mask):
    """Materialised Katharopoulos attention with phi = ReLU over the real keys."""
    w = torch.einsum("bhid,bhjd->bhij", F.relu(q), F.relu(k)) * mask[:, None, None, :]
    out = torch.einsum("bhij,bhjd->bhid", w, v) / w.sum(-1, keepdim=True).clamp_min(1e-6)
    return out * mask[:, None, :, None]


def masked_mean(v, mask):
    w = mask[:, None, :, None].to(v.dtype)
    return (v * w).sum(2, keepdim=True) / w.sum(2, keepdim=True).clamp_min(1)


@pytest.mark.parametrize("head_proj", [True, False])
def test_one_uncompressed_head_is_relu_linear_attention(head_proj):
    mixer = make_mixer("adamra", rates=[1.0], head_proj=head_proj).eval()
    q, k, v, x = qkvx()
    mask = lengths_mask(LENGTHS)
    torch.testing.assert_close(mixer(q, k, v, mask, x), relu_linear_attention(q, k, v, mask), atol=1e-5, rtol=1e-4)


@pytest.mark.parametrize("feature_map", ["relu", "elu", "softmax"])
def test_compression_to_one_landmark_gives_mean_of_values(feature_map):
    mixer = make_mixer("adamra", rates=[1.0 / N], feature_map=feature_map).eval()
    q, k, v, x = qkvx()
    q, k = q.abs() + 0.1, k.abs() + 0.1  # ReLU kernel: keep phi(q).phi(k~) > 0
    mask = lengths_mask(LENGTHS)
    expected = masked_mean(v, mask).expand_as(v) * mask[:, None, :, None]
    torch.testing.assert_close(mixer(q, k, v, mask, x), expected, atol=1e-5, rtol=1e-4)


def test_segment_means_ragged_and_padding_excluded():
    mixer = make_mixer("adamra", rates=[1 / 2, 1 / 8])
    t = torch.randn(2, 37, 4)
    mask = lengths_mask([37, 19], n=37)
    _, coarse = mixer._compressed(t, mask, padded=True)  # 1/8 is summed from the 1/2 windows
    sums, count = coarse[..., :-1], coarse[..., -1]       # the last column: real tokens per window
    means = sums / count[..., None].clamp_min(1.0)
    assert means.shape == (2, 5, 4)
    assert count.tolist() == [[8.0] * 4 + [5.0], [8.0, 8.0, 3.0, 0.0, 0.0]]
    torch.testing.assert_close(means[0, 4], t[0, 32:].mean(0))      # ragged last window: 5 tokens
    torch.testing.assert_close(means[1, 2], t[1, 16:19].mean(0))    # padding not counted
    assert torch.equal(means[1, 3:], torch.zeros(2, 4))


def test_head_projections_commute_with_compression():
    """Compressing then projecting (the implementation) equals eq. 9's project-then-compress."""
    mixer = make_mixer("adamra", rates=[0.25]).eval()
    with torch.no_grad():
        mixer.head_weight.copy_(torch.randn_like(mixer.head_weight) * 0.3)
    q, k, v, x = qkvx()
    mask = lengths_mask(LENGTHS)
    wq, wk, wv = mixer.head_weight[0]
    proj = lambda t, w: (t.transpose(1, 2).reshape(B, N, H * DH) @ w).view(B, N, H, DH).transpose(1, 2)  # noqa: E731
    ref = make_mixer("adamra", rates=[0.25], head_proj=False).eval()
    with torch.no_grad():
        torch.testing.assert_close(mixer(q, k, v, mask, x), ref(proj(q, wq), proj(k, wk), proj(v, wv), mask, x),
                                   atol=1e-5, rtol=1e-4)


def _candidates(q, k, v, mask):
    """Outputs of a (1, 1/N) AdaMRA with shared projections, per head, for every query."""
    return relu_linear_attention(q, k, v, mask), masked_mean(v, mask).expand_as(v) * mask[:, None, :, None]


def test_each_query_routed_to_exactly_its_argmax_head():
    mixer = make_mixer("adamra", rates=[1.0, 1.0 / N], head_proj=False).eval()
    q, k, v, x = qkvx()
    q, k = q.abs() + 0.1, k.abs() + 0.1
    mask = lengths_mask(LENGTHS)
    with torch.no_grad():
        mixer.route.weight.copy_(torch.randn_like(mixer.route.weight))
        out = mixer(q, k, v, mask, x)
        probs = torch.softmax(mixer.route(q.transpose(1, 2).reshape(B, N, H * DH)), -1)
    fine, coarse = _candidates(q, k, v, mask)
    pick = (probs.argmax(-1) == 0)[:, None, :, None]
    torch.testing.assert_close(out, torch.where(pick, fine, coarse), atol=1e-5, rtol=1e-4)
    assert 0 < pick.sum() < pick.numel()  # both heads are used in this draw


def test_router_receives_gradient():
    mixer = make_mixer("adamra").train()
    q, k, v, x = qkvx(requires_grad=True)
    mixer(q, k, v, lengths_mask(LENGTHS), x).pow(2).sum().backward()
    assert mixer.route.weight.grad is not None and mixer.route.weight.grad.abs().sum() > 0


def test_random_router_fresh_in_training_fixed_in_eval():
    mixer = make_mixer("adamra", rates=[1.0, 1.0 / N], head_proj=False, router="random")
    assert not any(True for _ in mixer.parameters())
    q, k, v, x = qkvx()
    q, k = q.abs() + 0.1, k.abs() + 0.1
    mask = lengths_mask(LENGTHS)
    fine, coarse = _candidates(q, k, v, mask)
    outs = [mixer.train()(q, k, v, mask, x) for _ in range(2)] + [mixer.eval()(q, k, v, mask, x) for _ in range(2)]
    for out in outs:  # every query gets exactly one head's output
        is_fine = torch.isclose(out, fine, atol=1e-5).all(-1)
        is_coarse = torch.isclose(out, coarse, atol=1e-5).all(-1)
        assert (is_fine | is_coarse).all()
    assert not torch.allclose(outs[0], outs[1])
    torch.testing.assert_close(outs[2], outs[3])


def test_rejects_bad_settings():
    with pytest.raises(ValueError, match="rates"):
        make_mixer("adamra", rates=[0.0])
    with pytest.raises(ValueError, match="feature_map"):
        make_mixer("adamra", feature_map="tanh")


def _shell(**overrides) -> MultiHeadAttention:
    torch.manual_seed(0)
    shell = MultiHeadAttention(H * DH, H, build_mixer("adamra", rates=[1.0, 1 / 4, 1 / 16], **overrides), max_len=N)
    shell = shell.double()
    if shell.mixer.head_weight is not None:  # away from the identity init, so every map matters
        with torch.no_grad():
            shell.mixer.head_weight.add_(0.3 * torch.randn_like(shell.mixer.head_weight))
    return shell


@pytest.mark.parametrize("feature_map", ["relu", "elu", "softmax"])
@pytest.mark.parametrize("head_proj", [True, False])
@pytest.mark.parametrize("router", ["learned", "random"])
def test_fused_shell_path_equals_projecting_every_token(feature_map, head_proj, router):
    """Through the shell AdaMRA composes the projections and never projects every token; values and
    gradients (inputs and every parameter) must equal the reference: project q, k, v, then forward."""
    shell = _shell(feature_map=feature_map, head_proj=head_proj, router=router)
    shell.train(router == "learned")  # the random router draws afresh per training call
    mask = lengths_mask([N, 23, 0])   # a fully padded row too
    x = torch.randn(B, N, H * DH, dtype=torch.float64, requires_grad=True)
    params = [x] + list(shell.parameters())

    def reference(x, mask):
        heads = lambda t: t.view(B, N, H, DH).transpose(1, 2)  # noqa: E731
        q, k, v = (heads(p(x)) for p in (shell.q_proj, shell.k_proj, shell.v_proj))
        return shell.out_proj(shell.mixer(q, k, v, mask, x).transpose(1, 2).reshape(B, N, H * DH))

    fused, ref = shell(x, mask), reference(x, mask)
    torch.testing.assert_close(fused, ref, atol=1e-10, rtol=1e-10)
    g_fused = torch.autograd.grad(fused.pow(2).sum(), params)
    g_ref = torch.autograd.grad(ref.pow(2).sum(), params)
    for a, b in zip(g_fused, g_ref):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-10)
    assert torch.isfinite(fused).all() and fused[2].abs().max() == shell.out_proj.bias.abs().max()


def test_fused_shell_path_never_projects_every_token():
    shell = _shell()
    calls = []
    for proj in (shell.q_proj, shell.k_proj, shell.v_proj):
        proj.register_forward_hook(lambda *args: calls.append(args[0]))
    out = shell(torch.randn(B, N, H * DH, dtype=torch.float64), lengths_mask(LENGTHS))
    assert out.shape == (B, N, H * DH) and calls == []
