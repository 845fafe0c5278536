"""Clustered and improved clustered attention (Vyas, Katharopoulos & Fleuret, NeurIPS 2020).

``clustered`` (eqs. 3-6): the queries of each (batch element, head) are grouped into C clusters;
each centroid ``Q^c_j = sum_i S_ij Q_i / sum_i S_ij`` (eq. 3) attends to every key,
``A^c = softmax(Q^c K^T / sqrt(D))`` (eq. 4), ``V^c = A^c V`` (eq. 5), and every query takes the
output of its cluster (eq. 6). Cost O(N C D) instead of O(N^2 D).

``i_clustered`` (eqs. 9-11): for each cluster the k keys with the highest clustered attention are
recomputed exactly for every member query; their clustered mass ``m_j = sum_l T_jl A^c_jl`` (eq. 9)
is redistributed by the exact softmax over those k keys, the other keys keep ``A^c_jl`` (eq. 10),
and ``V_i = A^t_i V`` (eq. 11). Computed as ``(A^c_j with top-k columns zeroed) V + m_j softmax(q_i
K_top^T) V_top``: no N x N matrix, no cancellation between the clustered and exact parts. The
exact part lays queries out cluster by cluster in chunks that share one key set, so it is a batched
matmul against O(N k D / chunk) gathered keys. Cost O(N C D + N k D).

Grouping (section 3.2.2): queries are hashed with the sign of B random projections (Charikar's
SimHash, ref. [25]) and clustered by K-means in Hamming space for L Lloyd iterations.

Choices the paper leaves open, written down:

* Hash planes: ``B`` standard-normal directions through the origin (no offset), drawn per head from
  :meth:`Mixer.randn` on every call (new planes each training step; fixed planes in eval;
  counter-based draws in graph-safe mode).
  Hashing, K-means, top-k selection are discrete and carry no gradient; gradients flow through the
  centroid means (eq. 3), the clustered softmax, and (i_clustered) the exact top-k softmax and m_j.
* Hamming distance: codes are +-1 vectors, so ``B - 2 * hamming = code . centroid``; the nearest
  centroid, ties to the lowest cluster index, is the max of one matmul of ``[code, 1]`` against
  ``[M * centroid, M - 1 - j]`` (M >= C a power of two): exact integers in float32 (float64 when
  ``(B + 1) M >= 2^24``), so an ``amax`` replaces an ``argmax`` and no tie can go another way.
* K-means update: per-bit majority vote of the members (a tie gives bit -1). The r-th empty cluster
  restarts at the r-th real query farthest from its centroid (equal distances: lower position
  first; unless that distance is 0), else keeps its centroid. ``L`` iterations of (assign,
  update), then a final assignment.
* Speed, with the same labels as the plain loop: the ``[C, N]`` similarity matrix is kept across
  iterations and only the rows of centroids that moved are recomputed (the integers are exact, so
  this equals recomputing all); once no centroid moves the iterations stop (every further one would
  repeat the last). That costs one host read per iteration (how many rows to recompute), so it is
  done on CPU only, where the matmul is the cost; on a GPU every row is recomputed and all ``L``
  iterations run, with no host sync (the same labels: the extra iterations are fixed points). Votes
  and member counts are one ``index_add`` of ``[code, 1]`` rows. On CPU a second host read per
  iteration skips the restart work (a top-k over every query, gathers) when no cluster is empty;
  on a GPU it always runs, and then restarts nothing. "On CPU" is
  :func:`attention.graph_safe.host_reads_free`, which tests switch off to run the GPU branches here.
* Host syncs per call on a GPU: none. The centroid member counts are an ``index_add``-style
  ``scatter_add`` (``bincount`` reads its input's min and max on the host).
* i_clustered's exact part (eq. 10's top-k softmax) is one autograd node that keeps only the
  probabilities ``[chunks, chunk, k]``; its backward gathers the queries, keys and values of each
  slice of chunks again, and both passes run over slices whose gathered keys are at most the size of
  K, so no per-chunk copy of the keys (several times K) is ever whole. Chunk size ``min(16, N // C)``;
  the slot count is the largest row's real one on CPU (one host read), the static bound
  ``N + (C+1)(chunk-1)`` on a GPU (no sync). Its backward re-enters the forward's autocast: a
  reduction there runs in float32 on CUDA (``sum`` is on CUDA autocast's float32 list), so every
  gradient is cast to its accumulator's dtype before it is added in place.
* i_clustered's clustered part (eqs. 4, 9, the non-top-k part of 10) is one autograd node that keeps
  a single ``[B,H,C,N]`` matrix (A^c with its top-k columns zeroed in place); its backward rebuilds
  the softmax gradient from that matrix and the top-k values (``sum_l A_l dA_l = dR . (R V) + m dm``).
* Initial centroids: the codes of C real queries evenly spaced in position order (deterministic, no
  randomness spent). When C >= the number of real queries every query seeds a centroid, so distinct
  queries get clusters of their own and the method reduces to exact softmax (the oracle test).
* Defaults C=100 (the paper's clustered-100 / i-clustered-100), B=63, L=10, k=32 (the paper's k).
  Short sequences: C is clamped to the (padded) length N and k to N, so they work from N=1. When C >= N
  every query is its own cluster (the zero-distortion partition that the K-means above reaches from
  its seeds up to hash collisions), so hashing and K-means are skipped and the result is exact
  softmax; the i_clustered top-k recomputation then reproduces A^c exactly and is skipped too.
* Scale 1/sqrt(D) as in softmax attention (the paper omits it "for clarity").
* Padding, per batch element AND per head: padded queries get a discard label C: they never seed,
  join or move a centroid, and get zero output. Padded keys get a large negative bias in A^c; in
  i_clustered, when a row has fewer than k real keys the padded keys that fill its top-k set are
  masked again in the exact recomputation (their clustered mass is exactly 0). The key mask of a
  query's top-k set is gathered with that query's own (batch, head, cluster) indices.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from attention.base import Mixer, require_non_negative, require_positive
from attention.masking import key_bias
from attention.padding import Padding


def hash_queries(q: Tensor, planes: Tensor) -> Tensor:
    """SimHash codes as +-1 float32: the sign of ``q [B,H,N,D] @ planes [H,D,bits]`` (0 counts as +)."""
    proj = torch.matmul(q.float(), planes)
    return torch.where(proj >= 0, 1.0, -1.0)


def hamming_kmeans(codes: Tensor, mask: Tensor, n_clusters: int, iters: int) -> Tensor:
    """Lloyd's K-means in Hamming space on +-1 ``codes [B,H,N,bits]``; labels ``[B,H,N]`` in
    ``[0, n_clusters)`` for real queries, ``n_clusters`` for padded ones. Static shapes, no host read:
    an iteration is one ``baddbmm`` (assignment), one ``argmax``, one ``scatter_add`` (votes) and one
    ``sign`` (majority); the first also restarts the clusters its assignment left empty."""
    with torch.autocast(codes.device.type, enabled=False):   # the exact-integer matmul needs full precision
        b, h, n, nb = codes.shape
        c, dev = n_clusters, codes.device
        m = 1 << max(0, c - 1).bit_length()                                 # M >= C, a power of two
        dtype = torch.float32 if (nb + 1) * m < 2 ** 24 else torch.float64
        # Padded queries get the zero code: they vote for nothing, so they never move a centroid.
        keep = mask[:, None, :, None].to(dtype)
        real = (codes.to(dtype) * keep).view(b * h, n, nb)
        x_sim, x_vote = real * m, real * 2                                  # M code . centroid = M (bits - 2 hamming)
        tie = (m - 1) - torch.arange(c, device=dev, dtype=dtype)           # ties go to the lowest cluster
        # Seed j: the real query of rank floor(j len / C), real positions first in order.
        order = torch.argsort((~mask).to(torch.uint8), dim=-1, stable=True)   # [B,N]
        ranks = (torch.arange(c, device=dev) * mask.sum(-1, keepdim=True)) // c
        seeds = order.gather(1, ranks.clamp(max=n - 1))                     # [B,C]
        cent = real.view(b, h, n, nb).gather(2, seeds[:, None, :, None].expand(b, h, c, nb)).view(b * h, c, nb)
        for it in range(iters):
            if it == 0:
                cent = _first_update(cent, real, x_sim, x_vote, tie, keep.view(b, 1, n).expand(b, h, n).reshape(b * h, n), m)
                continue
            nearest = torch.baddbmm(tie, x_sim, cent.mT).argmax(-1, keepdim=True)          # [BH,N,1]
            # c + 2 * votes: a majority sets the bit; a tie (and every bit of an empty cluster) keeps it
            cent = torch.scatter_add(cent, 1, nearest.expand(-1, -1, nb), x_vote).sign()
        labels = torch.baddbmm(tie, x_sim, cent.mT).argmax(-1).view(b, h, n)
        return labels.masked_fill(~mask[:, None, :], c)


def _first_update(cent: Tensor, real: Tensor, x_sim: Tensor, x_vote: Tensor, tie: Tensor, keep: Tensor, m: int) -> Tensor:
    """The first Lloyd update, with restarts: the r-th cluster the seeds' assignment left empty (a
    duplicate seed) restarts at the r-th real query farthest from its centroid (equal distances:
    lower position first), unless that distance is 0; the other clusters take the majority vote."""
    bh, n, nb = real.shape
    c = cent.shape[1]
    best, nearest = torch.baddbmm(tie, x_sim, cent.mT).max(-1)              # M (bits - 2 hamming) + M - 1 - j
    votes = torch.scatter_add(cent, 1, nearest[..., None].expand(-1, -1, nb), x_vote)
    empty = torch.zeros_like(keep).scatter_add_(1, nearest, keep)[:, :c] == 0   # [BH,C] no member
    pos = 1 << max(1, (n - 1).bit_length())
    key_dtype = torch.float32 if 2 * (nb + 1) * pos < 2 ** 24 else torch.float64
    # 2 hamming * pos + (pos - 1 - position) for real queries, -1 for padded ones (never a restart)
    far_key = (nb - best.div(m, rounding_mode="floor")).to(key_dtype) * pos + (pos - 1 - torch.arange(n, device=real.device))
    far_key, far = far_key.masked_fill(keep == 0, -1).topk(c, dim=-1)        # [BH,C], farthest first
    rank = empty.cumsum(-1) - empty.long()                                 # r of the r-th empty cluster
    reseed = empty & (far_key.gather(-1, rank) >= pos)                     # its candidate is not at distance 0
    restart = real.gather(1, far.gather(-1, rank)[..., None].expand(-1, -1, nb))
    return torch.where(reseed[..., None], restart, votes.sign())


def cluster_major_slots(labels: Tensor, n_clusters: int, chunk: int) -> tuple[Tensor, Tensor, Tensor, int]:
    """Queries laid out cluster by cluster, each cluster padded to a multiple of ``chunk`` slots, in
    the static bound ``M = N + (C+1)(chunk-1)`` slots (rounded up to a chunk).

    Returns the slot of every query ``[B,H,N]``, the query of every slot ``[B,H,M]`` (N: empty), the
    cluster of every chunk ``[B,H,M/chunk]`` (C for chunks with no query) and ``M``.
    """
    b, h, n = labels.shape
    dev = labels.device
    counts = torch.zeros(b, h, n_clusters + 1, dtype=torch.long, device=dev).scatter_add_(2, labels, torch.ones_like(labels))
    padded = (counts + chunk - 1).div(chunk, rounding_mode="floor").mul(chunk)
    offset = padded.cumsum(-1) - padded - counts.cumsum(-1) + counts         # first slot - first sorted index
    sorted_labels, order = labels.sort(dim=-1, stable=True)
    sorted_slots = torch.arange(n, device=dev) + offset.gather(2, sorted_labels)
    n_slots = -(-(n + (n_clusters + 1) * (chunk - 1)) // chunk) * chunk
    slots = torch.empty_like(labels).scatter_(2, order, sorted_slots)
    source = torch.full((b, h, n_slots), n, dtype=torch.long, device=dev).scatter_(2, sorted_slots, order)
    chunk_cluster = torch.full((b, h, n_slots // chunk), n_clusters, dtype=torch.long, device=dev)
    return slots, source, chunk_cluster.scatter_(2, sorted_slots // chunk, sorted_labels), n_slots


def _take(t: Tensor, idx: Tensor) -> Tensor:
    """Rows of ``t [B,H,R,D]`` at ``idx [B,H,S]`` -> ``[B,H,S,D]``."""
    return t.gather(2, idx[..., None].expand(-1, -1, -1, t.shape[-1]))


def improved_output(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, labels: Tensor, top_idx: Tensor,
                    rest: Tensor, mass: Tensor, scale: float) -> Tensor:
    """Eqs. 10-11 for every query i of cluster j: ``rest_j + m_j softmax(q_i K_T^T) V_T`` over the
    top-k keys T of its cluster (padded keys masked), ``rest [B,H,C,D]``, ``mass [B,H,C]``.

    The member queries of a cluster share its key set, so queries are laid out cluster-major in
    chunks of ``min(16, N // C)`` slots and each chunk does one small matmul against its cluster's k
    keys. Padded queries (label C) and empty slots read ``m = 0`` and ``rest = 0``: output 0.
    """
    b, h, n, d = q.shape
    c, kk = top_idx.shape[2], top_idx.shape[3]
    chunk = max(1, min(16, n // c))                                         # about the mean cluster size
    slots, source, chunk_cluster, n_slots = cluster_major_slots(labels, c, chunk)
    g = n_slots // chunk
    keys = top_idx.gather(2, chunk_cluster.clamp(max=c - 1)[..., None].expand(-1, -1, -1, kk)).view(b, h, g * kk)
    bias = key_bias(mask, q.dtype)[:, 0].expand(b, h, n).gather(2, keys).view(b * h * g, 1, kk)
    qs = _take(F.pad(q, (0, 0, 0, 1)), source).view(b * h * g, chunk, d)   # empty slots: a zero query
    ks, vs = (_take(t, keys).view(b * h * g, kk, d) for t in (k, v))
    p = torch.softmax(torch.baddbmm(bias, qs, ks.mT, alpha=scale), dim=-1)  # [BHG, chunk, k]
    m = F.pad(mass, (0, 1)).gather(2, chunk_cluster).view(b * h * g, 1, 1)
    part = torch.baddbmm(_take(F.pad(rest, (0, 0, 0, 1)), chunk_cluster).view(b * h * g, 1, d), p * m, vs)
    return _take(part.view(b, h, n_slots, d), slots)


class ClusteredAttention(Mixer):
    """Clustered attention; ``improved=True`` gives improved clustered attention (i_clustered)."""

    def __init__(
        self,
        n_heads: int,
        head_dim: int,
        max_len: int,
        layer_idx: int = 0,
        clusters: int = 100,
        bits: int = 63,
        iterations: int = 10,
        improved: bool = False,
        topk: int = 32,
    ) -> None:
        super().__init__(n_heads, head_dim, max_len, layer_idx)
        require_positive(clusters=clusters, bits=bits, topk=topk)
        require_non_negative(iterations=iterations)
        self.clusters = clusters
        self.bits = bits
        self.iterations = iterations
        self.improved = improved
        self.topk = topk

    @torch.no_grad()
    def cluster(self, q: Tensor, mask: Tensor) -> Tensor:
        """Cluster labels ``[B,H,N]`` (padded queries: label C) with this call's hash planes."""
        b, h, n, d = q.shape
        if self.clusters >= n:  # a centroid per query: the zero-distortion partition, no hashing needed
            labels = torch.arange(n, device=q.device).expand(b, h, n)
            return labels.masked_fill(~mask[:, None, :], n)
        return hamming_kmeans(hash_queries(q, self.hash_planes(h, d, q.device)), mask, self.clusters, self.iterations)

    def hash_planes(self, h: int, d: int, device: torch.device) -> Tensor:
        """This call's SimHash directions ``[H, D, bits]`` (fresh in training, fixed in eval)."""
        return self.randn((h, d, self.bits), device)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, pad: Padding, x: Tensor) -> Tensor:
        mask = pad.mask
        b, h, n, d = q.shape
        c = min(self.clusters, n)
        labels = self.cluster(q, mask)
        # eq. 3: centroid = mean of the member queries (slot C collects the padded queries, dropped)
        flat = (labels + (torch.arange(b * h, device=q.device) * (c + 1)).view(b, h, 1)).view(-1)
        sums = q.new_zeros(b * h * (c + 1), d).index_add(0, flat, q.reshape(b * h * n, d))
        counts = q.new_zeros(b * h * (c + 1)).index_add(0, flat, q.new_ones(flat.shape))
        centroids = (sums / counts.clamp(min=1.0)[:, None]).view(b, h, c + 1, d)[:, :, :c]
        bias = key_bias(mask, q.dtype)                                       # [B,1,1,N]

        if not self.improved or c == n:  # c == n: each query is its centroid, the top-k step is the identity
            vc = F.scaled_dot_product_attention(centroids, k, v, attn_mask=bias)   # eqs. 4-5
            return _take(F.pad(vc, (0, 0, 0, 1)), labels)                   # eq. 6; label C reads a zero row

        scale = 1.0 / math.sqrt(d)
        ac = torch.softmax(torch.matmul(centroids, k.mT) * scale + bias, dim=-1)   # eq. 4, [B,H,C,N]
        top_mass, top_idx = ac.topk(min(self.topk, n), dim=-1)              # eq. 9's T_j
        rest = ac.scatter(-1, top_idx, 0.0) @ v                             # eq. 10 off the top-k columns
        return improved_output(q, k, v, mask, labels, top_idx, rest, top_mass.sum(-1), scale)   # eqs. 10-11
