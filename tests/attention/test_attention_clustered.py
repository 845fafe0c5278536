"""Oracles for clustered / improved clustered attention (attention/clustered.py).

With the default C=100 the contract tests (N=37) see one cluster per query; these tests force the
hashing + Hamming K-means path with C < N. Tolerances: atol 1e-5 (float32, N <= 37).
"""
from __future__ import annotations

import math

import pytest
import torch

from attention.clustered import hamming_kmeans, improved_output
from tests.attention_harness import DH, N, lengths_mask, make_mixer, qkvx, softmax_reference

TOL = dict(atol=1e-5, rtol=1e-5)
LENGTHS = [N, 23, 9]


def grouped_queries(q: torch.Tensor, group: int = 5) -> torch.Tensor:
    """Queries constant over contiguous runs of ``group`` positions: few distinct queries."""
    return q[:, :, (torch.arange(q.shape[2]) // group) * group]


@pytest.mark.parametrize("name", ["clustered", "i_clustered"])
def test_one_cluster_per_query_equals_softmax(name):
    """C >= the number of distinct queries (8 runs of 5 with C=12 < N: the K-means path) is exact."""
    q, k, v, x = qkvx()
    q = grouped_queries(q)
    mask = lengths_mask(LENGTHS)
    mixer = make_mixer(name, clusters=12, topk=5).eval()
    torch.testing.assert_close(mixer(q, k, v, mask, x), softmax_reference(q, k, v, mask), **TOL)


@pytest.mark.parametrize("name", ["clustered", "i_clustered"])
def test_default_short_sequence_is_exact(name):
    """C=100 >= N: every query is its own cluster (documented shortcut), so exact softmax."""
    q, k, v, x = qkvx()
    mask = lengths_mask(LENGTHS)
    torch.testing.assert_close(make_mixer(name).eval()(q, k, v, mask, x), softmax_reference(q, k, v, mask), **TOL)


def test_one_cluster_attends_with_the_mean_real_query():
    q, k, v, x = qkvx()
    mask = lengths_mask(LENGTHS)
    out = make_mixer("clustered", clusters=1).eval()(q, k, v, mask, x)
    w = mask[:, None, :, None].float()
    mean_q = (q * w).sum(2, keepdim=True) / w.sum(2, keepdim=True)      # per batch element and head
    scores = torch.einsum("bhid,bhjd->bhij", mean_q, k) / math.sqrt(DH)
    scores = scores.masked_fill(~mask[:, None, None, :], float("-inf"))
    expected = torch.softmax(scores, -1) @ v                            # [B,H,1,D]
    torch.testing.assert_close(out, expected.expand_as(out) * mask[:, None, :, None], **TOL)


@pytest.mark.parametrize("lengths", [LENGTHS, [N, 0, 30]])
def test_i_clustered_topk_all_keys_equals_softmax_on_padded_batches(lengths):
    q, k, v, x = qkvx()
    mask = lengths_mask(lengths)
    for clusters in (1, 4):
        mixer = make_mixer("i_clustered", clusters=clusters, topk=N).eval()
        torch.testing.assert_close(mixer(q, k, v, mask, x), softmax_reference(q, k, v, mask), **TOL)


def dense_reference(q, k, v, mask, labels, topk: int | None):
    """Eqs. 3-6 (topk None) or 9-11, built per batch element and head with explicit loops."""
    out = torch.zeros_like(q)
    scale = 1.0 / math.sqrt(q.shape[-1])
    for b in range(q.shape[0]):
        keys = mask[b]
        for h in range(q.shape[1]):
            for j in labels[b, h][mask[b]].unique().tolist():
                members = (labels[b, h] == j) & mask[b]
                qc = q[b, h, members].mean(0)
                ac = torch.softmax((k[b, h] @ qc * scale).masked_fill(~keys, float("-inf")), -1)
                if topk is None:
                    out[b, h, members] = ac @ v[b, h]
                    continue
                top = ac.topk(topk).indices
                mass = ac[top].sum()
                for i in members.nonzero().flatten().tolist():
                    at = ac.clone()
                    logits = (k[b, h, top] @ q[b, h, i] * scale).masked_fill(~keys[top], float("-inf"))
                    at[top] = mass * torch.softmax(logits, -1)
                    out[b, h, i] = at @ v[b, h]
    return out


@pytest.mark.parametrize("name,topk", [("clustered", None), ("i_clustered", 5), ("i_clustered", 20)])
def test_matches_dense_reference_per_batch_and_head(name, topk):
    """Three lengths (one below k=20) and two heads with their own clusterings and masks."""
    q, k, v, x = qkvx()
    mask = lengths_mask([N, 23, 9])
    mixer = make_mixer(name, clusters=4, topk=topk or 32).eval()
    labels = mixer.cluster(q, mask)  # eval: the same planes as the forward below
    assert (labels[~mask[:, None, :].expand_as(labels)] == 4).all(), "padded queries must not join clusters"
    assert not torch.equal(labels[:, 0], labels[:, 1]), "heads should cluster differently"
    torch.testing.assert_close(mixer(q, k, v, mask, x), dense_reference(q, k, v, mask, labels, topk), **TOL)


@pytest.mark.slow
def test_improved_output_hand_written_backward_matches_autograd_gradcheck():
    """The exact top-k node's backward (eqs. 10-11) against finite differences in float64: padded
    queries and keys, clusters of uneven size (one empty), several slices of chunks (the CPU
    split), top-k sets that hold padded keys; padded queries get exactly zero output."""
    g = torch.Generator().manual_seed(0)
    b, h, n, d, c, kk = 2, 2, 11, 4, 3, 4
    mask = torch.arange(n) < torch.tensor([n, 7])[:, None]
    labels = torch.randint(0, c - 1, (b, h, n), generator=g).masked_fill(~mask[:, None, :], c)  # cluster 2 empty
    top_idx = torch.rand(b, h, c, n, generator=g).argsort(-1)[..., :kk]
    q, k, v = (torch.randn(b, h, n, d, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(3))
    rest = torch.randn(b, h, c, d, generator=g, dtype=torch.float64, requires_grad=True)
    mass = torch.rand(b, h, c, generator=g, dtype=torch.float64, requires_grad=True)

    def run(*args):
        return improved_output(args[0], args[1], args[2], mask, labels, top_idx, args[3], args[4], 0.5, 3)   # 3-chunk slices, one short

    out = run(q, k, v, rest, mass)
    assert (out[1, :, 7:] == 0).all(), "padded queries must get zero output"
    assert torch.autograd.gradcheck(run, (q, k, v, rest, mass))


def test_hamming_kmeans_recovers_separated_groups():
    """Three noisy copies of three random codes (runs of 10, resp. 8 in the padded row) -> 3 clusters."""
    g = torch.Generator().manual_seed(0)
    base = torch.randint(0, 2, (3, 63), generator=g).float() * 2 - 1
    n = 30
    groups = torch.stack([torch.arange(n) // 10, (torch.arange(n) // 8).clamp(max=2)])   # [2, n]
    codes = base[groups]                                                # [2, n, 63]
    codes = torch.where(torch.rand(2, n, 63, generator=g) < 0.03, -codes, codes)   # ~2 flipped bits
    codes[1, 24:] = torch.randn(6, 63, generator=g).sign()              # padded: arbitrary codes
    mask = torch.tensor([[True] * n, [True] * 24 + [False] * 6])
    labels = hamming_kmeans(codes[:, None], mask, n_clusters=3, iters=5)[:, 0]
    assert (labels[1, 24:] == 3).all()
    for b in range(2):
        real, grp = labels[b][mask[b]], groups[b][mask[b]]
        for gid in range(3):
            assert (real[grp == gid] == real[grp == gid][0]).all(), f"group {gid} split across clusters"
        assert len(set(real.tolist())) == 3


def test_hamming_kmeans_one_cluster_per_distinct_code():
    codes = torch.randn(1, 2, 16, 63).sign()
    labels = hamming_kmeans(codes, torch.ones(1, 16, dtype=torch.bool), n_clusters=16, iters=3)
    for h in range(2):
        assert len(set(labels[0, h].tolist())) == 16


@pytest.mark.parametrize("name", ["clustered", "i_clustered"])
def test_kmeans_path_padding_invariance_and_gradients(name):
    """The contract tests, repeated with C=4 < N so hashing and K-means run."""
    mask = lengths_mask([N, 23, 0])
    q, k, v, x = qkvx(seed=1, requires_grad=True)
    q2, k2, v2, _ = qkvx(seed=2)
    pad = ~mask[:, None, :, None]
    mixed = [torch.where(pad, b_, a_) for a_, b_ in ((q, q2), (k, k2), (v, v2))]
    mixer = make_mixer(name, clusters=4, topk=5)
    for mode in (mixer.train, mixer.eval):
        mode()
        out = mixer(q, k, v, mask, x)
        if not mixer.training:
            out2 = mixer(*mixed, mask, x)
            real = ~pad.expand_as(out)
            torch.testing.assert_close(out[real], out2[real], **TOL)
        assert torch.isfinite(out).all() and (out[2] == 0).all()
        out.pow(2).sum().backward()
        for t in (q, k, v):
            assert torch.isfinite(t.grad).all() and t.grad.abs().sum() > 0
            t.grad = None


def test_planes_redrawn_in_training_fixed_in_eval():
    q, _, _, _ = qkvx()
    mask = lengths_mask(LENGTHS)
    mixer = make_mixer("clustered", clusters=4)
    train_labels = [mixer.cluster(q, mask) for _ in range(3)]
    assert not all(torch.equal(train_labels[0], t) for t in train_labels[1:])
    mixer.eval()
    torch.testing.assert_close(mixer.cluster(q, mask), mixer.cluster(q, mask))


def test_hamming_kmeans_matches_the_plain_lloyd_loop():
    """The batched K-means (keyed baddbmm + argmax, votes by scatter_add, every iteration run) gives
    the labels of the plain per-row loop, with duplicate codes (clusters left empty keep their bits)."""
    from tests.reference.clustered import hamming_kmeans_reference

    g = torch.Generator().manual_seed(3)
    codes = torch.where(torch.randn(2, 2, 300, 63, generator=g) >= 0, 1.0, -1.0)
    codes[:, :, 100:160] = codes[:, :, 100:101]                         # 60 equal codes
    mask = torch.ones(2, 300, dtype=torch.bool)
    mask[1, 250:] = False
    labels = hamming_kmeans(codes, mask, n_clusters=20, iters=10)
    for b in range(2):
        real = mask[b].nonzero().flatten().tolist()
        for h in range(2):
            expected = hamming_kmeans_reference(codes[b, h], real, 20, 10)
            assert labels[b, h, real].tolist() == [expected[i] for i in real]
