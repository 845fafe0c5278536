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

from attention.base import Mixer, autocast_as, autocast_state, require_non_negative, require_positive
from attention.graph_safe import host_reads_free
from attention.masking import key_bias
from attention.padding import Padding
from attention.spec import FT, Grid, Knob, Peer, Spec, cap, int_range


def hash_queries(q: Tensor, planes: Tensor) -> Tensor:
    """Sign-of-random-projection codes as +-1 int8 (a quarter of a float copy while the K-means
    runs): q ``[B,H,N,D]``, planes ``[H,D,bits]``."""
    proj = torch.einsum("bhnd,hdk->bhnk", q.float(), planes)
    return (proj >= 0).to(torch.int8).mul_(2).sub_(1)                      # a compare, not a scalar where


def _similarity_key(codes: Tensor, n_clusters: int) -> tuple[Tensor, int, torch.dtype]:
    """``[codes, 1]``: a matmul against ``[M * centroid, M - 1 - j]`` gives ``M (bits - 2 hamming) +
    M - 1 - j`` per cluster j, whose max is the nearest centroid with ties to the lowest index.
    Integers below 2^24 (2^53) are exact in float32 (float64) whatever the summation order; every
    factor (+-1, +-M, M - 1 - j < 2^8 for C <= 256) is exact in TF32 and bfloat16 too."""
    nb = codes.shape[-1]
    m = 1 << max(0, n_clusters - 1).bit_length()                            # M >= C, a power of two
    dtype = torch.float32 if (nb + 1) * m < 2 ** 24 else torch.float64
    return torch.cat([codes.to(dtype), codes.new_ones(codes.shape[:-1] + (1,), dtype=dtype)], -1), m, dtype


def hamming_kmeans(codes: Tensor, mask: Tensor, n_clusters: int, iters: int, incremental: bool | None = None) -> Tensor:
    """Lloyd's K-means in Hamming space on +-1 ``codes [B,H,N,bits]``.

    Returns labels ``[B,H,N]`` in ``[0, n_clusters)`` for real queries and ``n_clusters`` (a discard
    slot) for padded ones, so padding never seeds, joins or moves a centroid. One Lloyd iteration is
    one matmul (assignment, its argmax folded into an amax by :func:`_similarity_key`), one
    ``index_add`` (per-bit votes and member counts together) and one top-k (restarts).
    ``incremental`` (default: where host reads are free, i.e. on CPU) recomputes only the moved
    centroids' rows, at one host read per iteration; the labels are the same either way.
    """
    if incremental is None:
        incremental = host_reads_free(codes)
    with torch.autocast(codes.device.type, enabled=False):   # the exact-integer matmul needs full precision
        return _hamming_kmeans(codes, mask, n_clusters, iters, incremental)


def _hamming_kmeans(codes: Tensor, mask: Tensor, n_clusters: int, iters: int, incremental: bool) -> Tensor:
    b, h, n, nb = codes.shape
    c, dev = n_clusters, codes.device
    lengths = mask.sum(-1)                                                  # [B]
    # Real positions first, in order; seed c takes the real query of rank floor(c * len / C).
    order = torch.argsort((~mask).to(torch.uint8), dim=-1, stable=True)     # [B,N]
    ranks = (torch.arange(c, device=dev)[None, :] * lengths[:, None]) // c
    seeds = order.gather(1, ranks.clamp(max=n - 1))                         # [B,C]
    keyed, m, dtype = _similarity_key(codes, c)                             # [B,H,N,bits+1]
    keyed = keyed.view(b * h, n, nb + 1)
    rows = b * h
    # Centroids as [M * code, M - 1 - j]: the last column breaks ties towards the lowest index.
    cent = keyed.view(b, h, n, nb + 1).gather(2, seeds[:, None, :, None].expand(b, h, c, nb + 1))
    cent = cent.reshape(rows, c, nb + 1)
    cent[..., :nb] *= m
    cent[..., nb] = (m - 1 - torch.arange(c, device=dev)).to(dtype)
    padded = ~mask[:, None, :].expand(b, h, n).reshape(rows, n)
    shift = m.bit_length() - 1
    # Restart candidates: farthest first, equal distances by lower position, padded last.
    pos_bits = max(1, (n - 1).bit_length())
    tie = (1 << pos_bits) - 1 - torch.arange(n, device=dev)
    slot_base = torch.arange(rows, device=dev)[:, None] * (c + 1)

    # sim[j, i] = M (bits - 2 hamming(i, j)) + M - 1 - j, kept across iterations: only the rows of
    # centroids that moved are recomputed (exact integers, so the same as recomputing them all).
    sim = torch.bmm(cent, keyed.transpose(1, 2))                            # [BH,C,N]
    row_base = torch.arange(rows, device=dev)[:, None] * c

    def nearest() -> tuple[Tensor, Tensor]:
        key = sim.amax(1).to(torch.int64)                                   # [BH,N]
        labels = (m - 1) - (key & (m - 1))
        return labels.masked_fill(padded, c), key >> shift                # label, bits - 2 * hamming

    for _ in range(iters):
        labels, best = nearest()
        # Per-bit majority: the sum of the members' +-1 codes is > 0 iff most members have the bit;
        # the constant column sums to the member count.
        votes = keyed.new_zeros(rows * (c + 1), nb + 1).index_add_(0, (labels + slot_base).flatten(),
                                                                   keyed.view(rows * n, nb + 1))
        votes = votes.view(rows, c + 1, nb + 1)[:, :c]
        members = votes[..., nb]
        bits = cent[..., :nb]
        majority = (votes[..., :nb] > 0).to(dtype).mul_(2 * m).sub_(m)      # +-M (a tie gives -M)
        empty = members == 0
        if incremental and not bool(empty.any()):   # CPU (host reads are free there): no restart to do
            moved_bits = majority
        else:
            # The r-th empty cluster restarts at the r-th worst-represented real query (if it is not
            # already exactly represented): duplicate seeds do not waste clusters.
            distortion = (nb - best).masked_fill(padded, -1)                # = 2 * hamming
            far_key, far = ((distortion << pos_bits) + tie).topk(min(c, n), dim=-1)    # [BH,C], sorted
            rank = (empty.cumsum(-1) - 1).clamp(min=0)
            reseed = empty & (far_key.gather(-1, rank) >> pos_bits > 0)
            restart = keyed.gather(1, far.gather(-1, rank)[..., None].expand(rows, c, nb + 1))[..., :nb] * m
            moved_bits = torch.where(empty[..., None], torch.where(reseed[..., None], restart, bits), majority)
        moved = (moved_bits != bits).any(-1)                                # [BH,C]
        cent[..., :nb] = moved_bits
        if not incremental:                 # no host sync: every row again (a fixed point repeats itself)
            sim = torch.bmm(cent, keyed.transpose(1, 2))
            continue
        most = int(moved.sum(-1).max())     # one host read per iteration: the work it saves is data-dependent
        if most == 0:                       # a fixed point: every further iteration would repeat this one
            break
        rows_moved = moved.to(torch.uint8).argsort(dim=-1, descending=True, stable=True)[:, :most]   # [BH,most]
        fresh = torch.bmm(cent.gather(1, rows_moved[..., None].expand(rows, most, nb + 1)), keyed.transpose(1, 2))
        sim.view(rows * c, n).index_copy_(0, (rows_moved + row_base).flatten(), fresh.view(rows * most, n))
    return nearest()[0].view(b, h, n)


def cluster_major_slots(labels: Tensor, n_clusters: int, chunk: int, tight: bool = False) -> tuple[Tensor, Tensor, int]:
    """Lay queries out cluster by cluster, each cluster padded to a multiple of ``chunk`` slots.

    Returns the slot of every query ``[B,H,N]``, the cluster of every chunk ``[B,H,M/chunk]``
    (0 for chunks with no query) and the slot count ``M``: the static bound ``N + (C+1)(chunk-1)``
    rounded up to a chunk, or with ``tight`` the largest row's real count (one host read).
    """
    b, h, n = labels.shape
    counts = torch.zeros(b, h, n_clusters + 1, dtype=torch.long, device=labels.device)
    counts.scatter_add_(2, labels, torch.ones_like(labels))
    padded = (counts + chunk - 1) // chunk * chunk
    start = padded.cumsum(-1) - padded                                      # first slot of a cluster
    first = counts.cumsum(-1) - counts                                      # its first sorted index
    order = labels.argsort(dim=-1, stable=True)
    sorted_labels = labels.gather(2, order)
    rank = torch.arange(n, device=labels.device) - first.gather(2, sorted_labels)  # rank in its cluster
    sorted_slots = start.gather(2, sorted_labels) + rank
    slots = torch.empty_like(labels).scatter_(2, order, sorted_slots)
    n_slots = int(padded.sum(-1).max()) if tight else -(-(n + (n_clusters + 1) * (chunk - 1)) // chunk) * chunk
    chunk_cluster = torch.zeros(b, h, n_slots // chunk, dtype=torch.long, device=labels.device)
    return slots, chunk_cluster.scatter_(2, slots // chunk, labels), n_slots


def _rows(t: Tensor, idx: Tensor) -> Tensor:
    """Rows of ``t [B,H,R,D]`` at ``idx [B,H,S]`` -> ``[B*H*S, D]`` (one row gather, whose backward
    is one ``index_add``)."""
    b, h, r, d = t.shape
    flat = idx + (torch.arange(b * h, device=t.device) * r).view(b, h, 1)
    return t.reshape(b * h * r, d).index_select(0, flat.reshape(-1))


def improved_output(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, labels: Tensor, top_idx: Tensor,
                    rest: Tensor, mass: Tensor, scale: float) -> Tensor:
    """Eqs. 10-11 for every query i of cluster j: ``rest_j + m_j softmax(q_i K_T^T) V_T`` over the
    top-k keys T of its cluster (padded keys masked), ``rest [B,H,C,D]``, ``mass [B,H,C]``.

    The member queries of a cluster share its key set, so queries are laid out cluster-major in
    chunks and each chunk does one small matmul against its cluster's k keys (:class:`_ExactTopK`).
    Padded queries (label C) read cluster C-1 with ``m = 0`` and ``rest = 0``: their output is 0.
    """
    b, h, n, d = q.shape
    c, kk = top_idx.shape[2], top_idx.shape[3]
    chunk = max(1, min(16, n // c))                                         # about the mean cluster size
    # On CPU the real slot count (one host read) instead of the static bound: about a quarter fewer chunks.
    slots, chunk_cluster, n_slots = cluster_major_slots(labels, c, chunk, tight=host_reads_free(labels))
    bh = b * h
    base = torch.arange(bh, device=q.device).view(b, h, 1)
    keys = top_idx.gather(2, chunk_cluster.clamp(max=c - 1)[..., None].expand(-1, -1, -1, kk)).view(b, h, -1)
    bias = key_bias(mask, q.dtype)[:, 0].expand(b, h, n).gather(2, keys).view(-1, kk)     # [B*H*G, k]
    key_rows = (keys + base * n).reshape(-1)                                # [B*H*G*k] rows of K, V
    out_group = (chunk_cluster + base * (c + 1)).reshape(-1)                # [B*H*G] rows of rest, m
    slot_rows = (slots + base * n_slots).reshape(-1)
    rest = F.pad(rest, (0, 0, 0, 1)).reshape(bh * (c + 1), d)
    mass = F.pad(mass, (0, 1)).reshape(bh * (c + 1))
    out = _ExactTopK.apply(q.reshape(bh * n, d), k.reshape(bh * n, d), v.reshape(bh * n, d), rest, mass, bias,
                           key_rows, out_group, slot_rows, chunk, scale)
    return out.view(b, h, n, d)


class _ExactTopK(torch.autograd.Function):
    """Eq. 10's exact part: ``out_i = rest_j + m_j softmax(q_i K_j^T * scale + bias_j) V_j`` with the
    queries ``q [R, D]`` laid out in chunks (``slot_rows [R]``) that share their cluster's top-k key
    rows (``key_rows [G k]`` into ``k, v [R', D]``); ``rest [C'', D]``, ``m [C'']`` read through
    ``out_group [G]``.

    Autograd would keep the per-chunk copies of the keys and values (``G k D`` each, several times K)
    and the laid-out queries. Here only the probabilities ``[G, chunk, k]`` are kept; both passes run
    over slices of about ``R' / k`` chunks, gathering the slice's queries, keys and values again, so
    no transient exceeds the size of K. Empty slots read some query (the last one): their output is
    never read and their output gradient is zeroed, so they contribute exactly 0 to every gradient.
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, rest: Tensor, mass: Tensor, bias: Tensor,
                key_rows: Tensor, out_group: Tensor, slot_rows: Tensor, chunk: int, scale: float) -> Tensor:
        g, kk = bias.shape
        r, d = q.shape
        source = _slot_sources(slot_rows, g * chunk)                        # [G * chunk], r for empty slots
        out, probs = q.new_zeros(r + 1, d), None
        for a, z in _slices(g, k.shape[0] // kk):
            rows, src = key_rows[a * kk:z * kk], source[a * chunk:z * chunk]
            qp = q.index_select(0, src.clamp(max=r - 1)).view(z - a, chunk, d)
            logits = torch.baddbmm(bias[a:z, None, :], qp, k.index_select(0, rows).view(z - a, kk, d).transpose(1, 2),
                                   alpha=scale)
            p = torch.softmax(logits, dim=-1)                               # [slice, chunk, k]
            probs = p.new_empty(g, chunk, kk) if probs is None else probs
            probs[a:z] = p
            m = mass.index_select(0, out_group[a:z])[:, None, None].to(p.dtype)
            part = torch.baddbmm(rest.index_select(0, out_group[a:z])[:, None, :], p * m,
                                 v.index_select(0, rows).view(z - a, kk, d))
            out.index_copy_(0, src, part.view(-1, d).to(out.dtype))        # empty slots land on row r
        ctx.save_for_backward(q, k, v, mass, probs, key_rows, out_group, source)
        ctx.amp = autocast_state(q)                                 # backward as forward
        ctx.scale, ctx.rest_dtype = scale, rest.dtype
        return out[:r]

    @staticmethod
    def backward(ctx, d_out: Tensor):
        q, k, v, mass, probs, key_rows, out_group, source = ctx.saved_tensors
        g, chunk, kk = probs.shape
        r, d = q.shape
        with autocast_as(ctx.amp):
            d_k, d_v, d_q = torch.zeros_like(k), torch.zeros_like(v), q.new_zeros(r + 1, d)
            d_rest = d_out.new_zeros(mass.shape[0], d)
            d_m = mass.new_zeros(g)
            for a, z in _slices(g, k.shape[0] // kk):
                rows, src, p = key_rows[a * kk:z * kk], source[a * chunk:z * chunk], probs[a:z]
                m = mass.index_select(0, out_group[a:z])[:, None, None].to(p.dtype)
                d_part = (d_out.index_select(0, src.clamp(max=r - 1)) * (src < r)[:, None]).view(z - a, chunk, d)
                d_rest.index_add_(0, out_group[a:z], d_part.sum(1).to(d_rest.dtype))   # float32 under CUDA autocast
                d_pv = torch.bmm(d_part, v.index_select(0, rows).view(z - a, kk, d).transpose(1, 2)).to(p.dtype)
                d_m[a:z] = (p * d_pv).sum((1, 2))                          # dL/dm per chunk
                d_v.index_add_(0, rows, torch.bmm((p * m).transpose(1, 2), d_part).view(-1, d).to(v.dtype))
                d_p = d_pv.mul_(m)
                d_logits = d_p.sub_((p * d_p).sum(-1, keepdim=True)).mul_(p * ctx.scale)   # softmax backward
                qp = q.index_select(0, src.clamp(max=r - 1)).view(z - a, chunk, d).to(d_logits.dtype)
                d_q.index_add_(0, src, torch.bmm(d_logits, k.index_select(0, rows).view(z - a, kk, d).to(d_logits.dtype))
                               .view(-1, d).to(q.dtype))
                d_k.index_add_(0, rows, torch.bmm(d_logits.transpose(1, 2), qp).view(-1, d).to(k.dtype))
            d_mass = mass.new_zeros(mass.shape).index_add_(0, out_group, d_m)
        return d_q[:r], d_k, d_v, d_rest.to(ctx.rest_dtype), d_mass, None, None, None, None, None, None


def _slot_sources(slot_rows: Tensor, n_slots: int) -> Tensor:
    """The query row of every slot ``[n_slots]`` (the inverse of ``slot_rows``); empty slots read R."""
    r = slot_rows.shape[0]
    return torch.full((n_slots,), r, dtype=slot_rows.dtype, device=slot_rows.device).index_copy_(
        0, slot_rows, torch.arange(r, device=slot_rows.device))


def _slices(total: int, size: int) -> list[tuple[int, int]]:
    """``[a, z)`` ranges of at most ``max(size, 1)`` covering ``range(total)``."""
    size = max(size, 1)
    return [(a, min(a + size, total)) for a in range(0, total, size)]


class _ClusteredBelowTopK(torch.autograd.Function):
    """Eqs. 4, 9 and the non-top-k part of eq. 10 in one node that keeps one ``[B,H,C,N]`` matrix.

    ``A^c = softmax(Q^c K^T * scale + bias)``; returns ``(A^c with its top-k columns zeroed) V``,
    the top-k mass ``m`` and the top-k key indices. Autograd would keep ``A^c`` and its zeroed copy;
    here the top-k entries are zeroed in place and kept aside (``C k`` values), and the softmax
    backward is rebuilt from the two parts: ``dL = A (dA - sum(A dA))`` with ``dA = dR V^T`` off the
    top-k columns and ``dA = dm`` on them.
    """

    @staticmethod
    def forward(ctx, centroids: Tensor, k: Tensor, v: Tensor, bias: Tensor, topk: int, scale: float):
        b, h, c, d = centroids.shape
        n = k.shape[2]
        logits = torch.baddbmm(bias.expand(b, h, 1, n).reshape(b * h, 1, n), centroids.reshape(b * h, c, d),
                               k.reshape(b * h, n, d).transpose(1, 2), alpha=scale).view(b, h, c, n)   # one pass
        ac = torch.softmax(logits, dim=-1)                                  # eq. 4, [B,H,C,N]
        del logits                                                          # one [B,H,C,N] matrix at a time
        top_mass, top_idx = ac.topk(topk, dim=-1)                           # [B,H,C,k]
        rest = ac.scatter_(-1, top_idx, 0.0)                                # A^c off the top-k columns
        out = rest @ v                                                      # eq. 10's first part
        ctx.save_for_backward(centroids, k, v, rest, out, top_mass, top_idx)
        ctx.amp = autocast_state(centroids)                                 # backward as forward
        ctx.scale = scale
        ctx.mark_non_differentiable(top_idx)
        return out, top_mass.sum(-1), top_idx                               # and eq. 9

    @staticmethod
    def backward(ctx, d_rest: Tensor, d_mass: Tensor, _):
        centroids, k, v, rest, out, top_mass, top_idx = ctx.saved_tensors
        with autocast_as(ctx.amp):
            dv = rest.transpose(-1, -2) @ d_rest
            da = d_rest @ v.transpose(-1, -2)                               # dL/dA^c off the top-k columns
            d_mass = d_mass[..., None].to(top_mass.dtype)
            # sum_l A_l dA_l: off the top-k columns sum_l R_l (dR . V_l) = dR . (R V), on them m dm.
            dot = (d_rest * out).sum(-1, keepdim=True).to(top_mass.dtype) + top_mass.sum(-1, keepdim=True) * d_mass
            dl = da.sub_(dot.to(da.dtype)).mul_(rest)                       # softmax backward, 0 on top-k
            dl.scatter_(-1, top_idx, (top_mass * (d_mass - dot)).to(dl.dtype))   # ... and its top-k columns
            dq, dk = dl @ k, dl.transpose(-1, -2) @ centroids
        return ((dq * ctx.scale).to(centroids.dtype), (dk * ctx.scale).to(k.dtype), dv.to(v.dtype),
                None, None, None)


class ClusteredAttention(Mixer):
    """Clustered attention; ``improved=True`` gives improved clustered attention (i_clustered)."""
    spec = Spec(
        grid=Grid({"clusters": (100, 1, 3, 5), "bits": (63, 1, 4), "iterations": (10, 0, 1, 4),
                   "improved": (False, True), "topk": (32, 1, 3)},
                  size="clusters", unit=lambda r: cap(r["clusters"], most=8), spans=(6, 5)),   # queries per cluster
        ranges={"clusters": int_range(1, 8), "bits": int_range(1, 16), "iterations": int_range(0, 6),
                "topk": int_range(1, 8)},
        knobs=(Knob("clusters", (25, 50, 100, 200, 400)),), draws=True, small={"clusters": 6, "topk": 8},
        # a query near a hash hyperplane changes bits, then its cluster of 6: 10-21% of rows flip
        precision={"flips": 0.3},
        documented=("clusters", "bits", "iterations", "improved", "topk"), representative="i_clustered",
        peers=(Peer("clustered", "fast-transformers ClusteredAttention", *FT, "clusters=100 iterations=10 bits=63",
                    "peer_clustered", why_not="hash planes drawn inside the peer's forward"),
               Peer("i_clustered", "fast-transformers ImprovedClusteredAttention", *FT,
                    "clusters=100 iterations=10 bits=63 topk=32", "peer_clustered",
                    why_not="hash planes drawn inside the peer's forward")),
        configs={"clustered": {"small": {"clusters": 6}}})

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
        # The shell's heads are strided views; one copy here instead of one per flattening below.
        q = q.contiguous()
        if self.improved:
            k, v = k.contiguous(), v.contiguous()
        labels = self.cluster(q, mask)
        # eq. 3: centroid = mean of the member queries (slot c collects padded queries, dropped).
        flat = (labels + (torch.arange(b * h, device=q.device) * (c + 1)).view(b, h, 1)).reshape(-1)
        sums = q.new_zeros(b * h * (c + 1), d).index_add(0, flat, q.reshape(b * h * n, d))
        counts = torch.zeros(b * h * (c + 1), dtype=torch.long, device=q.device).scatter_add_(
            0, flat, torch.ones_like(flat)).to(q.dtype)                      # no host read (bincount has two)
        centroids = (sums / counts.clamp(min=1.0)[:, None]).view(b, h, c + 1, d)[:, :, :c]
        bias = key_bias(mask, q.dtype)                                       # [B,1,1,N]

        if not self.improved or c == n:  # c == n: each query is its centroid, the top-k step is the identity
            vc = F.scaled_dot_product_attention(centroids, k, v, attn_mask=bias)   # eqs. 4-5
            vc = F.pad(vc, (0, 0, 0, 1))                  # padded queries (label C) read a zero row
            return _rows(vc, labels).view(b, h, n, d)                           # eq. 6

        scale = 1.0 / math.sqrt(d)
        rest, mass, top_idx = _ClusteredBelowTopK.apply(centroids, k, v, bias, min(self.topk, n), scale)
        return improved_output(q, k, v, mask, labels, top_idx, rest, mass, scale)   # eqs. 10-11
