"""Oracles for the fixed-pattern sparse variants (local, longformer, bigbird, sparse): each equals a
dense masked softmax over the same pattern, built here independently from the papers' definitions,
on full and padded batches; a pattern covering the sequence equals softmax; BigBird's random plan
is fixed per layer and spans the whole sequence."""
from __future__ import annotations

import math

import pytest
import torch

from tests.attention_harness import N, lengths_mask, make_mixer, qkvx, softmax_reference

LENGTHS = [N, 23, 1, 0]   # full, padded, a lone token, fully padded
ATOL, RTOL = 2e-5, 1e-4


def dense_pattern_softmax(q, k, v, mask, allowed):
    """Materialised softmax over ``allowed [n, n]``, ``[H, n, n]`` or ``[B, H, n, n]`` and real keys; padded rows 0."""
    scores = torch.einsum("bhid,bhjd->bhij", q, k) / math.sqrt(q.shape[-1])
    ok = (allowed if allowed.dim() == 4 else allowed.expand(q.shape[1], -1, -1)[None]) & mask[:, None, None, :]
    w = torch.softmax(scores.masked_fill(~ok, float("-inf")), dim=-1).nan_to_num(0.0)
    return torch.einsum("bhij,bhjd->bhid", w, v) * mask[:, None, :, None]


def pairs(n):
    i = torch.arange(n)
    return i[:, None], i[None, :]


def local_pattern(n, block, window):
    i, j = pairs(n)
    return (i // block - j // block).abs() <= window


def longformer_pattern(n, window):
    i, j = pairs(n)
    return ((i - j).abs() <= window // 2) | (i == 0) | (j == 0)


def sparse_pattern(n, kind, stride, summary=None):
    i, j = pairs(n)
    if kind == "strided":      # Child et al. Sec. 4.3, bidirectional: band + same residue
        return ((i - j).abs() <= stride) | ((i - j) % stride == 0)
    return (i // stride == j // stride) | (j % stride >= stride - summary)


def bigbird_pattern(mixer, n, lengths=LENGTHS):
    """Per sample and head ``[B, H, n, n]``: window blocks, first/last block global both ways, random
    blocks; the plan of a sample follows its own real length (its last real block is global)."""
    return torch.stack([bigbird_sample_pattern(mixer, n, max(1, math.ceil(length / mixer.block_size)))
                        for length in lengths])


def bigbird_sample_pattern(mixer, n, nb):
    bs, w = mixer.block_size, mixer.window_blocks // 2
    i, j = pairs(n)
    bi, bj = i // bs, j // bs
    base = ((bi - bj).abs() <= w) | (bi == 0) | (bi == nb - 1) | (bj == 0) | (bj == nb - 1)
    allowed = base.expand(mixer.n_heads, n, n).clone()
    if nb > 2:
        idx, valid = mixer.random_blocks(nb)
        for h in range(mixer.n_heads):
            for a in range(1, nb - 1):
                for blk, ok in zip(idx[h, a].tolist(), valid[h, a].tolist()):
                    if ok:
                        allowed[h, a * bs:(a + 1) * bs, blk * bs:(blk + 1) * bs] = True
    return allowed


CASES = [
    ("local", dict(block_size=5, window=1), lambda m, n: local_pattern(n, 5, 1)),
    ("local", dict(block_size=4, window=0), lambda m, n: local_pattern(n, 4, 0)),
    ("local", dict(block_size=6, window=2), lambda m, n: local_pattern(n, 6, 2)),
    ("longformer", dict(window=8), lambda m, n: longformer_pattern(n, 8)),
    ("longformer", dict(window=5), lambda m, n: longformer_pattern(n, 5)),
    ("longformer", dict(window=0), lambda m, n: longformer_pattern(n, 0)),
    ("sparse", dict(stride=6, summary=2), lambda m, n: sparse_pattern(n, "fixed", 6, 2)),
    ("sparse", dict(stride=5, summary=1), lambda m, n: sparse_pattern(n, "fixed", 5, 1)),
    ("sparse_strided", dict(stride=6), lambda m, n: sparse_pattern(n, "strided", 6)),
    ("sparse_strided", dict(stride=4), lambda m, n: sparse_pattern(n, "strided", 4)),
    ("bigbird", dict(block_size=4, num_random_blocks=2), bigbird_pattern),
    ("bigbird", dict(block_size=3, num_random_blocks=3), bigbird_pattern),
    ("bigbird", dict(block_size=5, num_random_blocks=1, window_blocks=1), bigbird_pattern),
]
IDS = [f"{name}-{'-'.join(f'{k}{v}' for k, v in kw.items())}" for name, kw, _ in CASES]


@pytest.mark.parametrize("name,kw,build", CASES, ids=IDS)
def test_equals_dense_pattern_softmax(name, kw, build):
    mixer = make_mixer(name, **kw).eval()
    allowed = build(mixer, N)
    q, k, v, x = qkvx(b=len(LENGTHS), requires_grad=True)
    mask = lengths_mask(LENGTHS)
    out = mixer(q, k, v, mask, x)
    ref = dense_pattern_softmax(q, k, v, mask, allowed)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=RTOL)
    # The pattern is sparse where it should be (the test could not pass with plain softmax).
    assert not allowed.all()
    if name != "bigbird":
        assert torch.equal(mixer.pattern(N), allowed)
    # Same gradients as the dense oracle.
    g = torch.randn_like(out)
    grads = torch.autograd.grad((out * g).sum(), (q, k, v))
    grads_ref = torch.autograd.grad((ref * g).sum(), (q, k, v))
    for a, b in zip(grads, grads_ref):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("name,kw,build", [c for c in CASES if c[0] in ("local", "longformer", "bigbird")][::2])
def test_pieces_equal_one_pass(name, kw, build, monkeypatch):
    """Long inputs are processed in pieces of query blocks (blocks.SCORE_PIECE); force one block
    per piece at test size: same as the dense oracle."""
    import attention.blocks as blocks
    monkeypatch.setattr(blocks, "SCORE_PIECE", 1)
    mixer = make_mixer(name, **kw).eval()
    q, k, v, x = qkvx(b=len(LENGTHS))
    mask = lengths_mask(LENGTHS)
    ref = dense_pattern_softmax(q, k, v, mask, build(mixer, N))
    torch.testing.assert_close(mixer(q, k, v, mask, x), ref, atol=ATOL, rtol=RTOL)


COVERING = [
    ("local", dict(block_size=64)),
    ("local", dict(block_size=5, window=7)),
    ("longformer", dict(window=2 * N)),
    ("sparse", dict(stride=N, summary=1)),
    ("sparse_strided", dict(stride=N)),
    ("bigbird", dict(block_size=19)),                        # two blocks: both global
    ("bigbird", dict(block_size=4, window_blocks=19)),
]


@pytest.mark.parametrize("name,kw", COVERING, ids=[f"{n}-{kw}" for n, kw in COVERING])
def test_covering_pattern_equals_softmax(name, kw):
    mixer = make_mixer(name, **kw).eval()
    q, k, v, x = qkvx(b=len(LENGTHS))
    mask = lengths_mask(LENGTHS)
    torch.testing.assert_close(mixer(q, k, v, mask, x), softmax_reference(q, k, v, mask), atol=ATOL, rtol=RTOL)


def test_bigbird_plan_fixed_across_calls_and_per_layer():
    mixer = make_mixer("bigbird", block_size=4, num_random_blocks=2, seed=5).train()
    q, k, v, x = qkvx()
    mask = lengths_mask([N, 30, 12])
    plan = mixer.random_blocks(10)
    outs = [mixer(q, k, v, mask, x) for _ in range(3)]
    torch.testing.assert_close(outs[0], outs[1], atol=0, rtol=0)
    torch.testing.assert_close(outs[0], outs[2], atol=0, rtol=0)
    assert all(torch.equal(a, b) for a, b in zip(plan, mixer.random_blocks(10)))
    # A checkpoint carries the plan; a layer built from another seed draws another plan.
    assert "rand_priority" in mixer.state_dict()
    other = make_mixer("bigbird", block_size=4, num_random_blocks=2, seed=6)
    assert not torch.equal(plan[0], other.random_blocks(10)[0])
    other.load_state_dict(mixer.state_dict())
    assert torch.equal(plan[0], other.random_blocks(10)[0])


def test_bigbird_random_blocks_span_the_whole_sequence():
    """At 4096 tokens the random blocks reach past position 1024 (a known port defect drew them
    from the first 1024 tokens only) and never repeat a window or global block."""
    mixer = make_mixer("bigbird", max_len=4096, n_heads=4)
    nb = 4096 // 64
    idx, valid = mixer.random_blocks(nb)
    idx, valid = idx[:, 1:nb - 1], valid[:, 1:nb - 1]
    assert valid.all() and idx.shape[-1] == 3
    a = torch.arange(1, nb - 1)[None, :, None]
    assert ((idx - a).abs() > 1).all() and (idx > 0).all() and (idx < nb - 1).all()
    assert (idx >= 1024 // 64).float().mean() > 0.5          # most of them beyond the first 1K tokens
    assert len(torch.unique(idx)) > nb - 10                     # nearly every block is someone's random block
    for row in idx.reshape(-1, 3):
        assert len(set(row.tolist())) == 3                      # without replacement
    # At a shorter length the plan stays inside the sequence.
    idx_s, valid_s = mixer.random_blocks(20)
    assert (idx_s[valid_s] < 20).all()


# ----------------------------------------------------------------------------- sparse: default stride
@pytest.mark.parametrize("name", ["sparse", "sparse_strided"])
@pytest.mark.parametrize("max_len,stride", [(1024, 32), (2000, 45), (4000, 63), (4096, 64), (8192, 91), (1, 1)])
def test_default_stride_is_sqrt_of_max_len(name, max_len, stride):
    """Child et al. Sec. 4.3: l close to sqrt(n), from the configured max_len (the conf default is
    null); an explicit stride is kept. A fixed stride makes the fixed pattern's cost quadratic."""
    assert make_mixer(name, max_len=max_len).stride == stride
    assert make_mixer(name, max_len=max_len, stride=7).stride == 7


@pytest.mark.parametrize("name,kind", [("sparse", "fixed"), ("sparse_strided", "strided")])
def test_padding_does_not_change_the_default_pattern(name, kind):
    """The stride comes from max_len, not from the batch length: a sequence padded to a longer
    batch gives the same outputs on its real tokens as alone, both over the pattern of stride
    round(sqrt(max_len))."""
    real, padded_len = 37, 45
    mixer = make_mixer(name, max_len=400).eval()                 # stride 20, summary 8: not covering
    q, k, v, x = qkvx(b=1, n=padded_len)
    alone = mixer(q[:, :, :real], k[:, :, :real], v[:, :, :real], torch.ones(1, real, dtype=torch.bool), x[:, :real])
    padded = mixer(q, k, v, lengths_mask([real], n=padded_len), x)
    torch.testing.assert_close(padded[:, :, :real], alone, atol=ATOL, rtol=RTOL)
    allowed = sparse_pattern(real, kind, 20, 8)
    assert not allowed.all()
    ref = dense_pattern_softmax(q[:, :, :real], k[:, :, :real], v[:, :, :real], torch.ones(1, real, dtype=torch.bool),
                                allowed)
    torch.testing.assert_close(alone, ref, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("name", ["sparse", "sparse_strided"])
def test_default_stride_equals_float64_reference(name):
    """The conf defaults at a max_len whose sqrt stride leaves the pattern sparse at n = 37 (the
    reference cases at max_len 64 give stride 8 with summary 8, a covering fixed pattern)."""
    from tests.attention.test_reference_baselines import check_against_reference
    check_against_reference(name, {}, 37, 400, [37, 23, 0], train=True, padded=True)
