"""Oracles for the low-rank projection attentions: Linformer and Nyströmformer."""
from __future__ import annotations

import pytest
import torch

from attention.nystromformer import iterative_pinv, segment_counts, segment_index
from tests.attention_harness import lengths_mask, make_mixer, qkvx, softmax_reference


# ----------------------------------------------------------------------------- linformer
def _identity_linformer(n: int):
    mixer = make_mixer("linformer", max_len=n, k=n).double().eval()
    with torch.no_grad():
        mixer.proj_k.copy_(torch.eye(n))
        mixer.proj_v.copy_(torch.eye(n))
    return mixer


def test_linformer_identity_projection_equals_softmax():
    q, k, v, x = (t.double() for t in qkvx(n=24))
    mask = torch.ones(3, 24, dtype=torch.bool)
    out = _identity_linformer(24)(q, k, v, mask, x)
    torch.testing.assert_close(out, softmax_reference(q, k, v, mask), atol=1e-12, rtol=1e-10)


def test_linformer_padding_is_zeroed_before_projection_without_post_mask():
    """Closed form with padding: padded keys/values are zero vectors, but every projected slot is
    still attended (no mask after the projection, as in LRA's Linformer)."""
    q, k, v, x = (t.double() for t in qkvx(n=24))
    mask = lengths_mask([24, 15, 0], n=24)
    out = _identity_linformer(24)(q, k, v, mask, x)
    keep = mask[:, None, :, None].double()
    ref = softmax_reference(q, k * keep, v * keep) * keep       # softmax over ALL slots
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-10)


def test_linformer_right_padding_equals_unpadded_run():
    mixer = make_mixer("linformer").eval()
    q, k, v, x = qkvx(b=1)
    out = mixer(q, k, v, lengths_mask([20]), x)[:, :, :20]
    short = mixer(q[:, :, :20], k[:, :, :20], v[:, :, :20], torch.ones(1, 20, dtype=torch.bool), x[:, :20])
    torch.testing.assert_close(out, short, atol=1e-6, rtol=1e-5)


def test_linformer_projections_owned_per_layer_and_clamped():
    a, b = make_mixer("linformer", layer_idx=0), make_mixer("linformer", layer_idx=1)
    assert a.proj_k is not b.proj_k and a.proj_k.data_ptr() != b.proj_k.data_ptr()
    assert a.proj_k.shape == (64, 64)                     # k = 256 clamped to max_len = 64
    assert make_mixer("linformer", max_len=1000).proj_k.shape == (1000, 256)
    assert {n for n, _ in a.named_parameters()} == {"proj_k", "proj_v"}
    assert {n for n, _ in make_mixer("linformer", share_kv=True).named_parameters()} == {"proj_k"}


def test_linformer_gradcheck():
    q, k, v, x = (t.double() for t in qkvx(b=2, n=6, dh=3))
    for t in (q, k, v):
        t.requires_grad_(True)
    mask = lengths_mask([6, 4], n=6)
    mixer = make_mixer("linformer", head_dim=3, max_len=8, k=4).double()
    assert torch.autograd.gradcheck(lambda a, b_, c: mixer(a, b_, c, mask, x), (q, k, v), fast_mode=True)


# ----------------------------------------------------------------------------- nystromformer
def test_nystrom_landmarks_equal_tokens_approaches_softmax():
    """m = N landmarks (each real token its own segment): Nyström is exact once the pseudo-inverse
    has converged; tolerance 1e-6 after 40 iterations (6 iterations are not enough here)."""
    q, k, v, x = (t.double() for t in qkvx(n=16, seed=4))
    mask = lengths_mask([16, 11, 3], n=16)
    ref = softmax_reference(q, k, v, mask)
    exact = make_mixer("nystromformer", max_len=16, num_landmarks=16, pinv_iterations=40, conv_kernel=None)
    out = exact.double().eval()(q, k, v, mask, x)
    torch.testing.assert_close(out, ref, atol=1e-6, rtol=1e-6)
    few = make_mixer("nystromformer", max_len=16, num_landmarks=16, pinv_iterations=2, conv_kernel=None)
    assert (few.double().eval()(q, k, v, mask, x) - ref).abs().max() > 1e-3   # the oracle can fail


def test_nystrom_fewer_landmarks_is_an_approximation():
    q, k, v, x = qkvx(n=37)
    mask = lengths_mask([37, 30, 20])
    ref = softmax_reference(q, k, v, mask)
    errs = []
    for m in (4, 37):
        mixer = make_mixer("nystromformer", max_len=37, num_landmarks=m, pinv_iterations=40, conv_kernel=None)
        errs.append(((mixer.eval()(q, k, v, mask, x) - ref).norm() / ref.norm()).item())
    assert errs[1] < 1e-4 < errs[0], errs


@pytest.mark.parametrize("iterations", [1, 2, 6])
def test_iterative_pinv_gradient_is_the_iterations_derivative(iterations):
    """The hand-written backward of the steps against finite differences of the iteration itself
    (on matrices whose row and column sums differ: a softmax's rows all sum to 1, so ``||A||_inf``,
    a max over them, has no derivative there)."""
    g = torch.Generator().manual_seed(1)
    a = (torch.eye(5, dtype=torch.double) + 0.3 * torch.randn(3, 5, 5, generator=g, dtype=torch.double)).requires_grad_()
    assert torch.autograd.gradcheck(lambda x: iterative_pinv(x, iterations), (a,))


def test_iterative_pinv_matches_linalg_pinv_per_matrix():
    g = torch.Generator().manual_seed(0)
    a = torch.softmax(torch.randn(2, 3, 8, 8, generator=g, dtype=torch.double) * 2, dim=-1)
    torch.testing.assert_close(iterative_pinv(a, 40), torch.linalg.pinv(a), atol=1e-8, rtol=1e-6)
    # Initialised per matrix: a batch mixing small- and large-norm matrices gives what each gives alone.
    mixed = torch.stack([a[0, 0], 50 * a[0, 1]])
    alone = torch.stack([iterative_pinv(a[0, 0], 6), iterative_pinv(50 * a[0, 1], 6)])
    torch.testing.assert_close(iterative_pinv(mixed, 6), alone, atol=1e-12, rtol=1e-10)


def test_nystrom_sample_output_independent_of_rest_of_batch():
    """A batch-wide norm in the pseudo-inverse initialisation would fail this at 6 iterations."""
    mixer = make_mixer("nystromformer", num_landmarks=8).eval()
    q, k, v, x = qkvx()
    mask = lengths_mask([37, 30, 12])
    out = mixer(q, k, v, mask, x)
    q2, k2 = q.clone(), k.clone()
    q2[1:], k2[1:] = q[1:] * 6, k[1:] * 6                  # sharper softmaxes elsewhere in the batch
    out2 = mixer(q2, k2, v, mask, x)
    torch.testing.assert_close(out[0], out2[0], atol=1e-6, rtol=1e-5)


def test_nystrom_right_padding_equals_unpadded_run():
    """Landmark means ignore padded tokens, so padding changes nothing (conv included)."""
    mixer = make_mixer("nystromformer", num_landmarks=4).eval()
    q, k, v, x = qkvx(b=1)
    k = k.clone()
    k[:, :, 22:] = 100.0
    out = mixer(q, k, v, lengths_mask([22]), x)[:, :, :22]
    short = mixer(q[:, :, :22], k[:, :, :22], v[:, :, :22], torch.ones(1, 22, dtype=torch.bool), x[:, :22])
    torch.testing.assert_close(out, short, atol=1e-6, rtol=1e-5)


def test_nystrom_segments_over_real_tokens():
    mask = lengths_mask([10, 8, 0], n=12)
    seg = segment_index(mask, 4)
    counts = segment_counts(seg, 4)
    assert counts[0].tolist() == [3, 2, 3, 2]              # floor(r * 4 / 10), contiguous
    assert counts[1].tolist() == [2, 2, 2, 2]
    assert counts[2].sum() == 0                            # padded tokens fall in no segment
    assert (seg[0, 10:] == 4).all() and (seg[1, 8:] == 4).all() and (seg[2] == 4).all()
    idx = seg[0, :10]
    assert torch.all(idx[1:] >= idx[:-1])


def test_nystrom_conv_skip_is_masked_depthwise_conv_of_v():
    q, k, v, x = qkvx(n=20)
    mask = lengths_mask([20, 14, 5], n=20)
    with_conv = make_mixer("nystromformer", conv_kernel=3, seed=2).eval()
    without = make_mixer("nystromformer", conv_kernel=None, seed=2).eval()
    w = with_conv.conv_weight.detach()                     # [H, 3]: one kernel per head
    assert w.shape == (2, 3)
    vm = v * mask[:, None, :, None]
    padded = torch.nn.functional.pad(vm, (0, 0, 1, 1))
    conv = sum(w[None, :, j, None, None] * padded[:, :, j:j + 20] for j in range(3))
    diff = with_conv(q, k, v, mask, x) - without(q, k, v, mask, x)
    torch.testing.assert_close(diff, conv * mask[:, None, :, None], atol=1e-5, rtol=1e-4)


def test_nystrom_gradcheck():
    q, k, v, x = (t.double() for t in qkvx(b=2, n=7, dh=3))
    for t in (q, k, v):
        t.requires_grad_(True)
    mask = lengths_mask([7, 4], n=7)
    mixer = make_mixer("nystromformer", head_dim=3, max_len=8, num_landmarks=3, conv_kernel=3).double()
    assert torch.autograd.gradcheck(lambda a, b_, c: mixer(a, b_, c, mask, x), (q, k, v), fast_mode=True)
