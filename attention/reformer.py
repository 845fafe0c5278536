"""Reformer LSH attention (Kitaev et al. 2020, Sec. 2 and App. A), bidirectional, shared-QK.

* Shared QK: keys are the unit-normalised queries, ``k_j = q_j / ||q_j||`` (Sec. 2, "Shared-QK");
  logits ``q_i . k_j / sqrt(d)`` (divided, not multiplied, by sqrt(d)).
* Angular LSH: ``h(x) = argmax([xR; -xR])`` with a random Gaussian ``R [d, n_buckets/2]`` per round
  and head, drawn from :meth:`Mixer.generator` (fresh rotations every training step, fixed at eval).
* Sort by (bucket, position), cut into chunks of ``m`` tokens; each chunk attends to itself and the
  previous chunk (no wrap-around), and only to keys of the query's own bucket:
  ``o_i^(r) = sum_{j in P~_i^(r)} exp(q_i.k_j/sqrt(d) - m_ij - z(i, P_i^(r))) v_j`` (App. A) with
  ``m_ij = inf`` for another bucket or a padded key, ``1e5`` for ``i = j`` (a token attends to
  itself only when nothing else is available), ``log N_ij`` otherwise, where ``N_ij`` counts the
  rounds in which i and j share a bucket (so a pair found by several rounds is not over-weighted).
* Rounds are combined by their log-partition functions:
  ``o_i = sum_r exp(z(i, P_i^(r)) - z(i, P_i)) o_i^(r)``, ``z(i, P_i) = logsumexp_r z(i, P_i^(r))``.

Choices the paper leaves open (and fixes of known port defects), written down:

* Defaults follow the Nyströmformer LRA protocol (``reformer-2``, HF LSH attention): 2 hash rounds,
  chunk length 64, about two buckets per chunk (``bucket_size = 32`` average tokens per bucket).
* The bucket count and the chunk length follow ``max_len``, never the (padded) batch length:
  ``n_buckets = ceil(max_len / bucket_size)`` rounded up to even (the paper's ``m = 2N / n_buckets``
  at N = max_len) and ``m = min(chunk_size, max_len)``. So the same sequence padded to N or to 2N
  hashes into the same buckets and the same chunks and gives the same output (deriving them from
  the padded N, as before, changed the output with the batch's padding).
* Short configurations: ``n_buckets`` is 1 (no hashing) when ``max_len <= bucket_size``, and with
  one chunk covering the sequence the method is exact shared-QK attention with the self-token rule.
* Padding: padded tokens get bucket id ``n_buckets`` (after every real bucket), so they sort behind
  all real tokens and cannot change which real tokens share a chunk; as keys they are masked by the
  same rule (a real query never shares their bucket).
  The sequence is padded inside to whole chunks (those tokens are padding too).
* ``N_ij`` uses bucket equality per round (the paper's definition), not whether chunking actually
  let j into i's window in that round.
* No attention dropout, no causal masking (classification), no reversible layers (a memory trick
  that does not change the function).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from attention.base import Mixer
from attention.masking import neg_fill, pad_to_multiple, zero_padded
from attention.padding import Padding
from attention.windows import WindowAttention
from attention.spec import FT, Grid, Knob, Peer, Spec, cap, int_range


def _look_back(t: Tensor, fill: float | bool | int) -> Tensor:
    """Chunks ``[..., nc, m, *rest]`` at dim 3 -> keys of each chunk: previous chunk + own, ``[..., nc, 2m, *rest]``.

    Chunk 0 gets a ``fill`` chunk (masked by the caller) instead of wrapping around.
    """
    prev = torch.cat([torch.full_like(t[:, :, :, :1], fill), t[:, :, :, :-1]], dim=3)
    return torch.cat([prev, t], dim=4)


class ReformerAttention(Mixer):
    spec = Spec(
        grid=Grid({"n_hashes": (2, 1, 3), "bucket_size": (32, 2, 5, 8, 64), "chunk_size": (64, 1, 3, 7),
                   "self_penalty": (1e5, 1.0)}, size="chunk_size", unit=lambda r: cap(r["chunk_size"])),
        ranges={"n_hashes": int_range(1, 4), "bucket_size": int_range(1, 16), "chunk_size": int_range(1, 12)},
        knobs=(Knob("n_hashes", (1, 2, 4, 8)), Knob("bucket_size", (8, 16, 32, 64))), draws=True,
        small={"bucket_size": 8, "chunk_size": 16},
        precision={"flips": 0.15},   # angular LSH argmax over 6 buckets of 8 tokens (9% of rows flip when cast)
        documented=lambda m, o, heads, max_len: [
            *((k, getattr(m, k), o[k]) for k in ("n_hashes", "bucket_size", "chunk_size", "self_penalty")),
            ("n_buckets", m.n_buckets, (lambda nb: 1 if nb <= 1 else nb + nb % 2)(-(-max_len // o["bucket_size"])))],
        peers=(Peer("reformer", "fast-transformers ReformerAttention", *FT,
                    "rounds=2 chunk_size=64 bits=N/64", "peer_reformer_ft",
                    why_not="LSH planes drawn inside the peer's forward"),
               Peer("reformer", "reformer-pytorch LSHSelfAttention", "reformer-pytorch", "reformer_pytorch",
                    "n_hashes=2 bucket_size=64, own bucket only, duplicates discounted", "peer_reformer_lucid",
                    why_not="random rotations drawn inside the peer's forward", biases=(False, True))))
    shared_qk = True

    def __init__(self, n_heads: int, head_dim: int, max_len: int, layer_idx: int = 0, n_hashes: int = 2,
                 bucket_size: int = 32, chunk_size: int = 64, self_penalty: float = 1e5) -> None:
        super().__init__(n_heads, head_dim, max_len, layer_idx)
        if n_hashes <= 0 or bucket_size <= 0 or chunk_size <= 0:
            raise ValueError(f"reformer needs positive n_hashes, bucket_size, chunk_size; got "
                             f"{n_hashes}, {bucket_size}, {chunk_size}")
        self.n_hashes = n_hashes
        self.bucket_size = bucket_size
        self.chunk_size = chunk_size
        self.self_penalty = self_penalty

    def setting_warnings(self, max_len: int) -> list[str]:
        if self.bucket_size >= max_len:
            return [f"attention.bucket_size={self.bucket_size} >= task.max_len={max_len}: one bucket holds every "
                    f"token: full attention, no hashing (attention=reformer measures nothing of its own here; use a "
                    f"bucket_size below max_len)"]
        return []

    @property
    def n_buckets(self) -> int:
        """About ``max_len / bucket_size`` buckets, even (h(x) needs b/2 axes); 1 (no hashing) when
        ``max_len <= bucket_size``. From max_len, not the batch length, so padding changes nothing."""
        nb = math.ceil(self.max_len / self.bucket_size)
        return 1 if nb <= 1 else nb + nb % 2

    def rotations(self, n_buckets: int, device: torch.device, dtype: torch.dtype) -> Tensor:
        """Random rotations ``[H, n_hashes, Dh, n_buckets // 2]`` from this mixer's stream."""
        shape = (self.n_heads, self.n_hashes, self.head_dim, max(n_buckets // 2, 1))
        return self.randn(shape, device).to(dtype)

    def buckets(self, kn: Tensor, mask: Tensor, rot: Tensor, n_buckets: int) -> Tensor:
        """Bucket ids ``[B, H, R, N]``; padded tokens get ``n_buckets`` (sorted after every real one)."""
        b, h, n, _ = kn.shape
        if n_buckets == 1:
            ids = torch.zeros(b, h, self.n_hashes, n, dtype=torch.long, device=kn.device)
        else:
            proj = torch.einsum("bhnd,hrdk->bhrnk", kn, rot)
            ids = torch.cat([proj, -proj], dim=-1).argmax(-1)
        return ids.masked_fill(~mask[:, None, None, :], n_buckets)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, pad: Padding, x: Tensor) -> Tensor:
        mask = pad.mask
        b, h, n, d = q.shape
        r = self.n_hashes
        m = min(self.chunk_size, self.max_len)
        nbk = self.n_buckets
        rot = self.rotations(nbk, q.device, q.dtype)
        kn = F.normalize(q, dim=-1, eps=1e-6)
        qs = pad_to_multiple(q * (1.0 / math.sqrt(d)), m, dim=2)
        kn, vp = pad_to_multiple(kn, m, dim=2), pad_to_multiple(v, m, dim=2)
        maskp = pad_to_multiple(mask, m, dim=1, value=False)
        np_ = qs.shape[2]
        nc = np_ // m

        with torch.no_grad():
            bkt = self.buckets(kn, maskp, rot, nbk)                                    # [B, H, R, Np]
            pos = torch.arange(np_, device=q.device)
            perm = (bkt * np_ + pos).argsort(dim=-1)                                   # sort by (bucket, position)
            sbkt = bkt.gather(-1, perm)

        def sort(t: Tensor) -> Tensor:                                                 # [B,H,Np,D] -> [B,H,R,nc,m,D]
            dd = t.shape[-1]
            g = t[:, :, None].expand(b, h, r, np_, dd).gather(3, perm[..., None].expand(b, h, r, np_, dd))
            return g.view(b, h, r, nc, m, dd)

        def chunk_buffer(t: Tensor) -> Tensor:                  # keys or values: [T + 1, m, D], an empty chunk first
            return F.pad(sort(t).view(-1, m, d), (0, 0, 0, 0, 1, 0))

        qc, pq, bq = sort(qs), perm.view(b, h, r, nc, m), sbkt.view(b, h, r, nc, m)
        pk, bk = _look_back(pq, -1), _look_back(bq, -1)                               # [B, H, R, nc, 2m]
        with torch.no_grad():                                                          # additive logit bias m_ij
            # A small code per pair: 0 = another bucket this round (or padding: padded tokens have their own
            # bucket and the look-back fill has none), c in 1..R = same bucket, shared in c rounds (- log N_ij),
            # R + 1 = the token itself (- penalty; it shares every round). Integer work on bytes.
            code = (bq[..., :, None] == bk[..., None, :]).to(torch.uint8)             # [B, H, R, nc, m, 2m]
            if r > 1:                                                                  # - log N_ij, App. A
                count = None
                flat_q, flat_k = pq.reshape(b, h, -1), pk.clamp(min=0).reshape(b, h, -1)
                for rr in range(r):
                    b_rr = bkt[:, :, rr]                                               # buckets by position
                    bq_rr, bk_rr = b_rr.gather(2, flat_q).view(pq.shape), b_rr.gather(2, flat_k).view(pk.shape)
                    eq = bq_rr[..., :, None] == bk_rr[..., None, :]
                    count = eq.to(torch.uint8) if count is None else count.add_(eq)
                code.mul_(count)
            code.masked_fill_(pq[..., :, None] == pk[..., None, :], r + 1)
            penalty = min(self.self_penalty, torch.finfo(q.dtype).max / 8)
            bias = torch.full(code.shape, neg_fill(q.dtype), dtype=q.dtype, device=q.device)
            for c in range(1, r + 2):                       # one bool pass per code value (no index tensor)
                bias.masked_fill_(code == c, -math.log(c) if c <= r else -penalty - math.log(r))
            del code
        o, lse = WindowAttention.apply(qc.reshape(-1, m, d), chunk_buffer(kn), chunk_buffer(vp), bias.view(-1, m, 2 * m), 2)
        del bias                                                                       # the logits' buffer
        o, lse = o.view(b, h, r, np_, d), lse.view(b, h, r, np_)

        undo = perm.argsort(dim=-1)                                                    # back to positions
        o = o.gather(3, undo[..., None].expand(b, h, r, np_, d))
        lse = lse.gather(3, undo)
        out = (torch.softmax(lse, dim=2)[..., None] * o).sum(dim=2)                    # combine rounds
        return zero_padded(out[:, :, :n], pad)
