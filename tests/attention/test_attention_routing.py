"""Oracles for routing attention (attention/routing.py). Tolerances: atol 1e-5 (float32, N <= 37)."""
from __future__ import annotations

import math
import warnings

import torch
import torch.nn.functional as F

from attention.registry import build_mixer
from attention.routing import block_local_attention
from models.module import LRAModule
from models.network import LRAClassifier
from tests.attention_harness import DH, H, N, lengths_mask, make_mixer, qkvx, softmax_reference

TOL = dict(atol=1e-5, rtol=1e-5)
LENGTHS = [N, 23, 9]


def ln(t: torch.Tensor) -> torch.Tensor:
    return F.layer_norm(t, (t.shape[-1],))


def test_one_cluster_full_window_equals_softmax():
    """Local head (raw q, k) and routing head (layer-normed q, k, the paper's choice) both reduce to
    exact softmax with one cluster and window >= N; in training too (one cluster takes everything)."""
    q, k, v, x = qkvx()
    mask = lengths_mask(LENGTHS)
    local = softmax_reference(q, k, v, mask)
    routed = softmax_reference(ln(q), ln(k), v, mask)
    for local_heads, expected in ((1, torch.cat([local[:, :1], routed[:, 1:]], 1)), (0, routed), (H, local)):
        mixer = make_mixer("routing", n_clusters=1, window=N, local_heads=local_heads)
        for mode in (mixer.eval, mixer.train):
            mode()
            torch.testing.assert_close(mixer(q, k, v, mask, x), expected, **TOL)


def test_block_local_attention_matches_dense_block_mask():
    q, k, v, _ = qkvx()
    mask = lengths_mask(LENGTHS)
    window = 8  # 37 = 4 * 8 + 5: a ragged last block
    block = torch.arange(N) // window
    allowed = (block[:, None] == block[None, :])[None, None] & mask[:, None, None, :]
    scores = (q @ k.transpose(-1, -2) / math.sqrt(DH)).masked_fill(~allowed, float("-inf"))
    expected = (torch.softmax(scores, -1).nan_to_num(0.0) @ v) * mask[:, None, :, None]
    out = block_local_attention(q, k, v, mask, window) * mask[:, None, :, None]
    torch.testing.assert_close(out, expected, **TOL)



def test_untaken_queries_fall_back_to_block_local_attention_values_and_gradients():
    """A query no cluster took reads block-local attention of the layer-normed q and k in its
    window (values and gradients of q, k, v), computed for every query and selected by ``where``."""
    q, k, v, x = qkvx(requires_grad=True)
    mask = lengths_mask(LENGTHS)
    window = 8
    mixer = make_mixer("routing", n_clusters=3, window=window, local_heads=0, max_len=N).eval()
    idx_q, _ = memberships(mixer, q.detach(), k.detach(), mask)
    taken = torch.zeros(q.shape[:3], dtype=torch.bool).scatter_(2, idx_q.flatten(2), True)
    untaken = (~taken & mask[:, None, :])[..., None].to(q.dtype)
    assert untaken.sum() > 0
    got = mixer(q, k, v, mask, x) * untaken
    expected = block_local_attention(ln(q), ln(k), v, mask, window) * untaken
    torch.testing.assert_close(got, expected, **TOL)
    g = torch.randn_like(got)
    for a, b in zip(torch.autograd.grad((got * g).sum(), (q, k, v)), torch.autograd.grad((expected * g).sum(), (q, k, v))):
        torch.testing.assert_close(a, b, **TOL)


def test_padded_keys_in_a_short_rows_clusters_get_no_weight():
    """A row with fewer real tokens than the cluster size w fills every cluster with padded keys:
    they must get no weight, so the real outputs ignore what sits at padded positions."""
    q, k, v, x = qkvx()
    q2, k2, v2, _ = qkvx(seed=5)
    mask = lengths_mask(LENGTHS)                     # the 9-token row: 9 < w = ceil(37 / 2) = 19
    mixer = make_mixer("routing", n_clusters=2, local_heads=0, max_len=N).eval()
    pad = ~mask[:, None, :, None]
    out = mixer(q, k, v, mask, x)
    out2 = mixer(torch.where(pad, q2, q), torch.where(pad, k2, k), torch.where(pad, v2, v), mask, x)
    torch.testing.assert_close(out, out2, **TOL)


def memberships(mixer, q, k, mask):
    """Each cluster's top-w queries and keys, recomputed from the mixer's centroids."""
    mu = mixer.centroids
    pad = ~mask[:, None, None, :]
    w = min(q.shape[2], math.ceil(mixer.max_len / mixer.n_clusters))
    sq = torch.einsum("bhnd,hcd->bhcn", F.normalize(ln(q), dim=-1), mu).masked_fill(pad, -math.inf)
    sk = torch.einsum("bhnd,hcd->bhcn", F.normalize(ln(k), dim=-1), mu).masked_fill(pad, -math.inf)
    return sq.topk(w, -1).indices, sk.topk(w, -1).indices


def test_routing_head_matches_dense_reference():
    """Queries taken by several clusters see the union (multiset) of their key sets; queries taken by
    none fall back to their local window; all with layer-normed q, k. Built with explicit loops."""
    q, k, v, x = qkvx()
    mask = lengths_mask(LENGTHS)
    window = 6
    mixer = make_mixer("routing", n_clusters=6, window=window, local_heads=0, max_len=N).eval()
    idx_q, idx_k = memberships(mixer, q, k, mask)
    out = mixer(q, k, v, mask, x)
    qn, kn = ln(q), ln(k)
    n_multi = n_none = 0
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            for i in mask[b].nonzero().flatten().tolist():
                taken = [c for c in range(mixer.n_clusters) if i in idx_q[b, h, c].tolist()]
                if taken:
                    keys = torch.cat([idx_k[b, h, c] for c in taken])
                    n_multi += len(taken) > 1
                else:
                    keys = torch.arange(i // window * window, min(i // window * window + window, N))
                    n_none += 1
                keys = keys[mask[b, keys]]
                wts = torch.softmax(kn[b, h, keys] @ qn[b, h, i] / math.sqrt(DH), -1)
                torch.testing.assert_close(out[b, h, i], wts @ v[b, h, keys], **TOL)
    assert n_multi > 0 and n_none > 0, (n_multi, n_none)  # both special cases were exercised
    assert (out.norm(dim=-1)[mask[:, None, :].expand(-1, H, -1)] > 0).all(), "a real token got a zero row"
    assert (out[~mask[:, None, :].expand(-1, H, -1)] == 0).all()


def test_centroids_move_only_in_training_and_ignore_padding():
    q, k, v, x = qkvx()
    mask = lengths_mask(LENGTHS)
    mixer = make_mixer("routing", n_clusters=4, decay=0.5)
    start = mixer.centroids.clone()
    mixer.eval()
    mixer(q, k, v, mask, x)
    assert torch.equal(mixer.centroids, start), "centroids changed in eval mode"
    assert mixer.aux_loss is None, "no loss term in eval"
    mixer.train()
    mixer(q, k, v, mask, x)
    moved = mixer.centroids.clone()
    assert not torch.allclose(moved, start), "centroids did not move in training"
    torch.testing.assert_close(moved.norm(dim=-1), torch.ones(moved.shape[:2]))
    # The same update with different padded content.
    q2, k2, v2, _ = qkvx(seed=5)
    pad = ~mask[:, None, :, None]
    mixer.centroids.copy_(start)
    mixer(torch.where(pad, q2, q), torch.where(pad, k2, k), v, mask, x)
    torch.testing.assert_close(mixer.centroids, moved, atol=1e-6, rtol=0)


def test_commitment_loss_in_training():
    q, k, v, x = qkvx(requires_grad=True)
    mask = lengths_mask(LENGTHS)
    mixer = make_mixer("routing", n_clusters=4, commitment=0.5).train()
    mu = mixer.centroids.clone()
    mixer(q, k, v, mask, x)
    aux = mixer.aux_loss
    assert aux is not None and aux.dim() == 0 and aux > 0
    # beta * (mean_q ||q^ - mu(q^)||^2 + mean_k ||k^ - mu(k^)||^2), routing heads, real tokens.
    real = mask[:, None, :].expand(-1, 1, -1)
    expected = 0.0
    for t in (q[:, 1:], k[:, 1:]):
        u = F.normalize(ln(t.detach()), dim=-1)
        d2 = (u[:, :, :, None, :] - mu[None, :, None]).pow(2).sum(-1).amin(-1)
        expected = expected + d2[real].mean()
    torch.testing.assert_close(aux.detach(), 0.5 * expected, **TOL)
    aux.backward()
    assert q.grad[:, 1:].abs().sum() > 0 and k.grad[:, 1:].abs().sum() > 0
    assert q.grad[:, :1].abs().sum() == 0  # the local head has no commitment term


def test_training_step_adds_the_commitment_loss():
    torch.manual_seed(0)
    net = LRAClassifier(build_mixer("routing", commitment=1.0), vocab_size=12, num_classes=4, max_len=32,
                        d_model=32, n_layers=2, n_heads=2, d_ffn=64, d_head=64, dropout=0.0)
    module = LRAModule(net, num_classes=4).train()
    seen = {}
    forward, pop = module.forward, net.pop_aux_loss
    module.forward = lambda ids, mask, padded=None: seen.setdefault("logits", forward(ids, mask, padded))
    net.pop_aux_loss = lambda: seen.setdefault("aux", pop())
    g = torch.Generator().manual_seed(0)
    batch = {"ids": torch.randint(1, 12, (8, 32), generator=g), "mask": lengths_mask([32, 20] * 4, 32),
             "label": torch.randint(0, 4, (8,), generator=g)}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # self.log without a Trainer
        loss = module.training_step(batch, 0)
    assert seen["aux"] is not None and seen["aux"] > 0
    expected = F.cross_entropy(seen["logits"], batch["label"]) + seen["aux"]
    torch.testing.assert_close(loss, expected)
    loss.backward()
    assert all(b.attn.mixer.aux_loss is None for b in net.encoder.blocks)  # popped: no stale graph
