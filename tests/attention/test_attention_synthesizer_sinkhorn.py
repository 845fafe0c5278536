"""Oracles for Synthesizer (dense, random) and Sparse Sinkhorn attention."""
from __future__ import annotations

import math
import os

import pytest
import torch

from attention.sinkhorn import sinkhorn
from tests.attention_harness import lengths_mask, make_mixer, qkvx, softmax_reference


def masked_softmax_apply(logits, v, mask, allowed=None):
    """Reference: softmax of ``logits`` [B|1, H, N, N] over real (and allowed) keys, applied to v."""
    keep = mask[:, None, None, :] if allowed is None else mask[:, None, None, :] & allowed
    w = torch.softmax(logits.masked_fill(~keep, float("-inf")), dim=-1).nan_to_num(0.0)
    return (w @ v) * mask[:, None, :, None]


# ----------------------------------------------------------------------------- synthesizer
@pytest.mark.parametrize("name", ["synthesizer_dense", "synthesizer_random"])
def test_synthesizer_zero_logits_give_masked_mean_of_v(name):
    mixer = make_mixer(name).eval()
    with torch.no_grad():
        for p in ([mixer.w2, mixer.b2] if name.endswith("dense") else [mixer.r]):
            p.zero_()
    q, k, v, x = qkvx()
    mask = lengths_mask([37, 20, 0])
    keep = mask[:, None, :, None].float()
    mean = (v * keep).sum(2, keepdim=True) / keep.sum(2, keepdim=True).clamp_min(1)
    torch.testing.assert_close(mixer(q, k, v, mask, x), mean.expand_as(v) * keep, atol=1e-6, rtol=1e-5)


def test_dense_synthesizer_closed_form_and_no_qk_dependence():
    mixer = make_mixer("synthesizer_dense").double().eval()
    q, k, v, x = (t.double() for t in qkvx())
    mask = lengths_mask([37, 25, 6])
    n, hd = 37, mixer.hidden
    hid = torch.relu(x @ mixer.w1.weight.T + mixer.w1.bias)
    logits = torch.stack([hid[..., h * hd:(h + 1) * hd] @ mixer.w2[h, :, :n] + mixer.b2[h, :n] for h in range(2)], 1)
    ref = masked_softmax_apply(logits, v, mask)
    out = mixer(q, k, v, mask, x)
    torch.testing.assert_close(out, ref, atol=1e-12, rtol=1e-10)
    q2, k2, _, _ = (t.double() for t in qkvx(seed=9))
    torch.testing.assert_close(mixer(q2, k2, v, mask, x), out, rtol=0, atol=0)


def test_dense_synthesizer_row_depends_only_on_its_token():
    mixer = make_mixer("synthesizer_dense").eval()
    _, _, _, x = qkvx()
    x2 = x.clone()
    x2[:, 5] += 1.0
    diff = (mixer.logits(x) - mixer.logits(x2)).abs().amax(dim=(0, 1, 3))
    assert diff[5] > 0 and torch.all(diff[torch.arange(37) != 5] == 0)


def test_random_synthesizer_closed_form_trainable_fixed_and_factorised():
    q, k, v, x = qkvx()
    mask = lengths_mask([37, 25, 6])
    learned = make_mixer("synthesizer_random").eval()
    ref = masked_softmax_apply(learned.r[None, :, :37, :37], v, mask)
    torch.testing.assert_close(learned(q, k, v, mask, x), ref, atol=1e-6, rtol=1e-5)
    assert [n for n, _ in learned.named_parameters()] == ["r"] and learned.r.shape == (2, 64, 64)

    fixed = make_mixer("synthesizer_random", trainable=False).eval()
    assert not list(fixed.parameters()) and "r" in fixed.state_dict()
    again = make_mixer("synthesizer_random", trainable=False)
    other = make_mixer("synthesizer_random", trainable=False, seed=5)
    assert torch.equal(fixed.r, again.r) and not torch.equal(fixed.r, other.r)   # seeded

    fact = make_mixer("synthesizer_random", rank=4).eval()
    r = fact.r1[:, :37] @ fact.r2[:, :37].transpose(-1, -2)
    torch.testing.assert_close(fact(q, k, v, mask, x), masked_softmax_apply(r[None], v, mask), atol=1e-6, rtol=1e-5)


def test_synthesizer_gradcheck():
    q, k, v, x = (t.double() for t in qkvx(b=2, n=5, dh=3))
    v.requires_grad_(True)
    x.requires_grad_(True)
    mask = lengths_mask([5, 3], n=5)
    mixer = make_mixer("synthesizer_dense", head_dim=3, max_len=6).double()
    assert torch.autograd.gradcheck(lambda a, b_: mixer(q, k, a, mask, b_), (v, x), fast_mode=True)


# ----------------------------------------------------------------------------- sinkhorn
@pytest.mark.parametrize("mode", ["train", "eval"])
def test_sinkhorn_one_block_equals_softmax(mode):
    mixer = make_mixer("sinkhorn", block_size=64).double()
    getattr(mixer, mode)()
    q, k, v, x = (t.double() for t in qkvx())
    mask = lengths_mask([37, 20, 0])
    out = mixer(q, k, v, mask, x)
    torch.testing.assert_close(out, softmax_reference(q, k, v, mask), atol=1e-12, rtol=1e-10)


def test_sinkhorn_hard_permutation_equals_block_sparse_softmax():
    """With sorting logits that encode a permutation pi (per sample, among its non-empty blocks),
    each query block attends exactly to its own block and block pi(i): a dense masked softmax."""
    bs, n = 8, 37
    perms = [[2, 0, 1, 4, 3], [1, 2, 0, 3, 4], [1, 0, 2, 3, 4]]     # samples with 5, 3, 2 non-empty blocks
    mask = lengths_mask([37, 20, 9])
    mixer = make_mixer("sinkhorn", block_size=bs).double().eval()
    logits = torch.zeros(3, 2, 5, 5, dtype=torch.double)
    for b_, perm in enumerate(perms):
        logits[b_, :, torch.arange(5), torch.tensor(perm)] = 30.0
    mixer.block_logits = lambda summaries, n_blocks: logits
    q, k, v, x = (t.double() for t in qkvx())
    blk = torch.arange(n) // bs
    allowed = torch.stack([(blk[None, :] == blk[:, None]) | (blk[None, :] == torch.tensor(p)[blk][:, None])
                           for p in perms])[:, None]                  # [B, 1, N, N]
    ref = masked_softmax_apply(q @ k.transpose(-1, -2) / math.sqrt(8), v, mask, allowed)
    torch.testing.assert_close(mixer(q, k, v, mask, x), ref, atol=1e-9, rtol=1e-8)


def test_sinkhorn_balancing_is_doubly_stochastic_and_ignores_empty_blocks():
    mixer = make_mixer("sinkhorn", block_size=8, sinkhorn_iterations=60).eval()
    g = torch.Generator().manual_seed(0)
    summaries = torch.randn(2, 2, 5, 8, generator=g)
    valid = torch.tensor([[True] * 5, [True, True, True, False, False]])
    s = mixer.sorting_matrix(summaries, valid)
    ones = torch.ones(5)
    torch.testing.assert_close(s[0].sum(-1), ones.expand(2, 5), atol=1e-4, rtol=0)
    torch.testing.assert_close(s[0].sum(-2), ones.expand(2, 5), atol=1e-4, rtol=0)
    sub = s[1, :, :3, :3]
    torch.testing.assert_close(sub.sum(-1), torch.ones(2, 3), atol=1e-4, rtol=0)
    torch.testing.assert_close(sub.sum(-2), torch.ones(2, 3), atol=1e-4, rtol=0)
    assert torch.all(s[1, :, :3, 3:] == 0) and torch.all(s[1, :, 3:, :3] == 0)
    torch.testing.assert_close(s[1, :, 3:, 3:], torch.eye(2).expand(2, 2, 2))
    # the standalone operator: balanced rows/columns from arbitrary scores
    p = sinkhorn(torch.randn(4, 6, 6, generator=g), 50)
    torch.testing.assert_close(p.sum(-1), torch.ones(4, 6), atol=1e-4, rtol=0)


def test_sinkhorn_gumbel_noise_only_in_training():
    q, k, v, x = qkvx()
    mask = lengths_mask([37, 30, 12])
    noisy = make_mixer("sinkhorn", block_size=8).train()
    assert not torch.allclose(noisy(q, k, v, mask, x), noisy(q, k, v, mask, x))
    noisy.eval()
    torch.testing.assert_close(noisy(q, k, v, mask, x), noisy(q, k, v, mask, x), rtol=0, atol=0)
    quiet = make_mixer("sinkhorn", block_size=8, gumbel_noise=False).train()
    torch.testing.assert_close(quiet(q, k, v, mask, x), quiet(q, k, v, mask, x), rtol=0, atol=0)


def test_sinkhorn_right_padding_equals_unpadded_run():
    mixer = make_mixer("sinkhorn", block_size=8).eval()
    q, k, v, x = qkvx(b=1)
    out = mixer(q, k, v, lengths_mask([20]), x)[:, :, :20]
    short = mixer(q[:, :, :20], k[:, :, :20], v[:, :, :20], torch.ones(1, 20, dtype=torch.bool), x[:, :20])
    torch.testing.assert_close(out, short, atol=1e-6, rtol=1e-5)


def test_sinkhorn_gradcheck():
    q, k, v, x = (t.double() for t in qkvx(b=2, n=7, dh=3))
    for t in (q, k, v):
        t.requires_grad_(True)
    mask = lengths_mask([7, 5], n=7)
    mixer = make_mixer("sinkhorn", head_dim=3, max_len=8, block_size=2).double().eval()
    assert torch.autograd.gradcheck(lambda a, b_, c: mixer(a, b_, c, mask, x), (q, k, v), fast_mode=True)


# ----------------------------------------------------------------------------- synthesizer: memory guard
def fake_available(monkeypatch, nbytes):
    """Every device reports ``nbytes`` free (None: cannot say); nothing is allocated to test this."""
    import attention.synthesizer as synth
    monkeypatch.setattr(synth, "available_memory_bytes", lambda device: None if nbytes is None else int(nbytes))


@pytest.mark.parametrize("name,need,fix", [
    ("synthesizer_random", 2 * 8192 ** 2 * 4, "attention.rank"),                 # H x N x N parameters
    ("synthesizer_dense", 3 * 2 * 8192 ** 2 * 4 + 2 * 2 * 9 * 8192 * 4, "not quadratic"),  # 3 [H, N, N] + w2, b2 x 2
])
def test_synthesizer_refuses_at_construction_what_cannot_fit(name, need, fix, monkeypatch):
    from attention.synthesizer import QuadraticMemoryError
    fake_available(monkeypatch, 2**28)
    with pytest.raises(QuadraticMemoryError) as err:
        make_mixer(name, max_len=8192)
    msg = str(err.value)
    for part in (f"attention={name}", f"need {need / 2**30:.2f} GiB", "only 0.25 GiB available on cpu", "O(N^2)",
                 "task.max_len", fix):
        assert part in msg, (part, msg)


@pytest.mark.parametrize("trainable", [True, False])
def test_random_synthesizer_construction_bound_is_exact(trainable, monkeypatch):
    """One example's training step: parameters (and their gradients when trainable) plus three
    [H, N, N] tensors; it runs with exactly that much and is refused with one byte less."""
    from attention.synthesizer import QuadraticMemoryError
    params = 2 * 64 * 64 * 4
    need = params * (2 if trainable else 1) + 3 * 2 * 64 * 64 * 4
    fake_available(monkeypatch, need)
    make_mixer("synthesizer_random", trainable=trainable)
    fake_available(monkeypatch, need - 1)
    with pytest.raises(QuadraticMemoryError):
        make_mixer("synthesizer_random", trainable=trainable)


@pytest.mark.parametrize("name", ["synthesizer_dense", "synthesizer_random"])
def test_synthesizer_refuses_a_batch_before_forming_its_weights(name, monkeypatch):
    import attention.synthesizer as synth
    mixer = make_mixer(name).train()
    q, k, v, x = qkvx()
    mask = lengths_mask([37, 20, 0])
    b, h, n = v.shape[:3]
    need = 3 * b * h * n * n * 4                                 # three [B, H, N, N] float32 with autograd
    fake_available(monkeypatch, need - 1)

    def formed(*args):
        raise AssertionError("the N x N weights were formed before the memory check")
    with monkeypatch.context() as m:
        m.setattr(synth, "synthesized_attention", formed)
        with pytest.raises(synth.QuadraticMemoryError, match=rf"attention={name}: the \[B=3, H=2, N=37, N\] weights"):
            mixer(q, k, v, mask, x)
    with torch.no_grad():                                        # two copies without autograd
        mixer(q, k, v, mask, x)
    fake_available(monkeypatch, need)
    assert torch.isfinite(mixer(q, k, v, mask, x)).all()


@pytest.mark.parametrize("name", ["synthesizer_dense", "synthesizer_random"])
def test_synthesizer_hard_bound_when_memory_is_unknown(name, monkeypatch):
    """A mistyped max_len is refused even where the device cannot report its memory (else this
    would try to allocate terabytes)."""
    from attention.synthesizer import QuadraticMemoryError
    fake_available(monkeypatch, None)
    with pytest.raises(QuadraticMemoryError, match="hard bound"):
        make_mixer(name, max_len=2**19)


def test_host_available_memory_is_read():
    from attention.synthesizer import available_memory_bytes
    if not os.path.exists("/proc/meminfo"):
        pytest.skip("no /proc/meminfo on this host")
    assert 0 < available_memory_bytes(torch.device("cpu")) < 2**50
