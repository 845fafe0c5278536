"""Oracles for Reformer LSH attention: dense shared-QK softmax with the self-token rule over the
pairs the hashing allows (one bucket; the union of several rounds; chunks of the sorted order),
on full and padded batches; fresh hashes in training, fixed at eval."""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from tests.attention_harness import N, lengths_mask, make_mixer, qkvx

LENGTHS = [N, 23, 1, 0]
ATOL, RTOL = 2e-5, 1e-4
SELF = 1e5


def shared_qk_reference(q, v, mask, allowed=None):
    """softmax(q_i . (q_j/|q_j|) / sqrt(d) - 1e5 [i = j]) over real keys j with ``allowed [B, H, n, n]``."""
    kn = F.normalize(q, dim=-1, eps=1e-6)
    scores = torch.einsum("bhid,bhjd->bhij", q, kn) / math.sqrt(q.shape[-1])
    scores = scores - SELF * torch.eye(q.shape[2])
    ok = mask[:, None, None, :].expand_as(scores)
    if allowed is not None:
        ok = ok & allowed
    w = torch.softmax(scores.masked_fill(~ok, float("-inf")), dim=-1).nan_to_num(0.0)
    return torch.einsum("bhij,bhjd->bhid", w, v) * mask[:, None, :, None]


def eval_buckets(mixer, q, mask):
    """The buckets the eval forward draws (the eval stream is re-seeded per call): ``[B, H, R, n]``."""
    nbk = mixer.n_buckets
    rot = mixer.rotations(nbk, q.device, q.dtype)
    return mixer.buckets(F.normalize(q, dim=-1, eps=1e-6), mask, rot, nbk), nbk


def test_reformer_shares_qk():
    assert make_mixer("reformer").shared_qk


def test_one_bucket_covering_sequence_equals_shared_qk_softmax():
    mixer = make_mixer("reformer", n_hashes=1, bucket_size=64, chunk_size=64).eval()
    q, _, v, x = qkvx(b=len(LENGTHS), requires_grad=True)
    mask = lengths_mask(LENGTHS)
    out = mixer(q, q, v, mask, x)
    ref = shared_qk_reference(q, v, mask)
    torch.testing.assert_close(out, ref, atol=ATOL, rtol=RTOL)
    # The lone token of row 2 can only attend to itself (the self rule still lets it).
    torch.testing.assert_close(out[2, :, 0], v[2, :, 0], atol=ATOL, rtol=RTOL)
    g = torch.randn_like(out)
    for a, b in zip(torch.autograd.grad((out * g).sum(), (q, v)), torch.autograd.grad((ref * g).sum(), (q, v))):
        torch.testing.assert_close(a, b, atol=ATOL, rtol=RTOL)


def test_rounds_combine_to_softmax_over_union_of_buckets():
    """With one chunk covering the sequence, the log-sum-exp combination of rounds with the log N_ij
    duplicate correction (App. A) is exactly softmax over the union of the rounds' buckets."""
    mixer = make_mixer("reformer", n_hashes=3, bucket_size=8, chunk_size=64).eval()
    q, _, v, x = qkvx(b=len(LENGTHS))
    mask = lengths_mask(LENGTHS)
    bkt, nbk = eval_buckets(mixer, q, mask)
    assert nbk == 8                                                   # ceil(max_len 64 / 8)
    same = (bkt[..., :, None] == bkt[..., None, :]).any(dim=2)        # [B, H, n, n]
    assert not same[0].all()                                          # hashing does restrict
    with torch.no_grad():
        out = mixer(q, q, v, mask, x)
    torch.testing.assert_close(out, shared_qk_reference(q, v, mask, same), atol=ATOL, rtol=RTOL)


def test_chunks_attend_to_own_and_previous_chunk_within_bucket():
    mixer = make_mixer("reformer", n_hashes=1, bucket_size=8, chunk_size=5).eval()
    q, _, v, x = qkvx(b=len(LENGTHS))
    mask = lengths_mask(LENGTHS)
    bkt, _ = eval_buckets(mixer, q, mask)
    bkt = bkt[:, :, 0]                                                # [B, H, n]
    # Rank in the sorted order: by bucket (padding last), then position.
    order = (bkt * N + torch.arange(N)).argsort(-1)
    rank = order.argsort(-1)
    chunk = rank // 5
    dc = chunk[..., :, None] - chunk[..., None, :]
    allowed = (bkt[..., :, None] == bkt[..., None, :]) & ((dc == 0) | (dc == 1))
    with torch.no_grad():
        out = mixer(q, q, v, mask, x)
    torch.testing.assert_close(out, shared_qk_reference(q, v, mask, allowed), atol=ATOL, rtol=RTOL)
    # The chunk window really cuts pairs away beyond the bucket restriction.
    assert (allowed != (bkt[..., :, None] == bkt[..., None, :])).any()


def test_padding_sorts_last_with_small_chunks():
    """Padded content cannot move real tokens between chunks (padding gets the last bucket)."""
    mixer = make_mixer("reformer", n_hashes=2, bucket_size=4, chunk_size=4).eval()
    mask = lengths_mask([N, 23, 9])
    q, _, v, x = qkvx(seed=1)
    q2, _, v2, _ = qkvx(seed=2)
    pad = ~mask[:, None, :, None]
    with torch.no_grad():
        out = mixer(q, q, v, mask, x)
        out2 = mixer(torch.where(pad, q2, q), torch.where(pad, q2, q), torch.where(pad, v2, v), mask, x)
    real = mask[:, None, :, None].expand_as(out)
    torch.testing.assert_close(out[real], out2[real], atol=1e-6, rtol=1e-5)


def test_hashes_redrawn_in_training_fixed_in_eval():
    mixer = make_mixer("reformer", bucket_size=4, chunk_size=8)
    q, _, v, x = qkvx()
    mask = lengths_mask([N, 30, 12])
    with torch.no_grad():
        a, b = mixer.train()(q, q, v, mask, x), mixer(q, q, v, mask, x)
        c, d = mixer.eval()(q, q, v, mask, x), mixer(q, q, v, mask, x)
    assert not torch.allclose(a, b)
    torch.testing.assert_close(c, d, atol=0, rtol=0)
