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
matmul against the chunks' gathered keys. Cost O(N C D + N k D).

Grouping (section 3.2.2): queries are hashed with the sign of B random projections (Charikar's
SimHash, ref. [25]) and clustered by K-means in Hamming space for L Lloyd iterations.

What each step computes, and what a GPU launches (one path, static shapes, no host read; every
head and row batched, no Python loop over them):

1. Hash: one matmul ``q @ planes`` and a sign, ``[B,H,N,B_bits]`` of +-1.
2. K-means, L iterations, each 5 kernels: one ``baddbmm`` gives, for every (row, cluster, query),
   ``key = -M (code . centroid) + bh C + j`` (exact integers, see below), one ``amin`` over the
   clusters gives the nearest centroid, a ``remainder`` its row in the flat ``[B H C, bits]``
   centroids, one ``index_add`` adds ``2 * code`` of every member to its centroid's row and one
   ``sign`` takes the majority. The first iteration also restarts empty clusters (about 15 small
   kernels, once). A final ``baddbmm`` + ``amin`` assigns the labels.
3. Eq. 3: two ``index_add`` (member sums and counts) and a division. Eqs. 4-6 (clustered): one fused
   ``scaled_dot_product_attention`` of the C centroids against all keys, and one row gather.
4. i_clustered: eqs. 4, 9 and the non-top-k part of eq. 10 in one node (:class:`_ClusteredBelowTopK`:
   ``baddbmm``, softmax, ``topk``, an in-place scatter, one matmul); the cluster-major layout (one
   stable sort, cumulative sums, scatters: about 15 small kernels); eq. 10's exact part in one node
   (:class:`_ExactTopK`: gathers, two ``baddbmm``, a softmax, one gather back).

Choices the paper leaves open, written down:

* Hash planes: ``B`` standard-normal directions through the origin (no offset), drawn per head from
  :meth:`Mixer.randn` on every call (new planes each training step; fixed planes in eval).
  Hashing, K-means, top-k selection are discrete and carry no gradient; gradients flow through the
  centroid means (eq. 3), the clustered softmax, and (i_clustered) the exact top-k softmax and m_j.
* Hamming distance: codes are +-1 vectors, so ``B - 2 * hamming = code . centroid``. The nearest
  centroid, ties to the lowest cluster index, is the ``amin`` of ``-M (code . centroid) + bh C + j``
  with ``M >= B H C`` a power of two; the key modulo M is the centroid's row. Exact integers in
  float32 (float64 when ``(bits + 1) M >= 2^24``), so no tie can go another way on any device.
* K-means update: per-bit majority vote of the members, a tied bit keeps its value (computed as the
  sign of ``centroid + 2 * sum of the members' codes``), so an empty cluster keeps its centroid.
  Empty clusters restart after the first assignment only (where duplicate seeds leave them): the
  r-th empty cluster restarts at the r-th real query farthest from its centroid (equal distances:
  lower position first), unless that distance is 0. Later iterations do not restart: a restart
  costs about 15 kernels, three times an iteration, and in the first one it already gives every
  distinct query of a short row a cluster of its own. All L iterations always run (a fixed point
  repeats itself, so the labels equal those of a loop that stops there).
* Padded queries enter the K-means with the zero code: they vote for nothing, never seed a centroid,
  and get the discard label C afterwards; they get zero output.
* Initial centroids: the codes of C real queries evenly spaced in position order (rank
  ``floor(j len / C)``; deterministic, no randomness spent). When C >= the number of real queries
  every query seeds a centroid, so distinct queries get clusters of their own and the method
  reduces to exact softmax (the oracle test).
* Defaults C=100 (the paper's clustered-100 / i-clustered-100), B=63, L=10, k=32 (the paper's k).
  Short sequences: C is clamped to the (padded) length N and k to N, so they work from N=1. When C >= N
  every query is its own cluster (the zero-distortion partition), so hashing and K-means are
  skipped and the result is exact softmax; the i_clustered top-k step is then the identity and skipped.
* Scale 1/sqrt(D) as in softmax attention (the paper omits it "for clarity").
* Padding, per batch element AND per head: padded keys get a large negative bias in A^c; in
  i_clustered, when a row has fewer than k real keys the padded keys that fill its top-k set are
  masked again in the exact recomputation (their clustered mass is exactly 0).
* i_clustered's layout: chunks of ``min(16, N // C)`` slots, each cluster padded to a multiple of a
  chunk, in the static bound ``N + (C+1)(chunk-1)`` slots (about a third more than a tight count at
  N = 1024; a tight count would be a data-dependent shape). Empty slots read query 0 and are never
  read back, so their gradient is exactly 0.
* The two autograd nodes are kept because each wins a measured ratio (written at each): they store
  one ``[B,H,C,N]`` matrix and the exact part's probabilities instead of autograd's copies. Their
  backwards re-enter the forward's autocast; a reduction there runs in float32 on CUDA, so every
  gradient is cast to its accumulator's dtype before it is added in place.
* The one device choice, made from :attr:`Mixer.on_cpu`: on CPU the exact part runs in slices of
  chunks whose gathered keys fit 2 MiB (``cpu_slice_bytes``; 0.77 of the one-pass time at B 8, N
  1024, one thread: the slices stay in cache); on an accelerator it is one pass.
* Host syncs per call: none, on any device (the member counts are an ``index_add``, not
  ``bincount``, which reads its input's min and max on the host).
* Dispatches (issue 62, ``python -m lra.bench --protocol dispatches``, the accelerator path, N =
  1024, batch 16): clustered 1.58x and i_clustered 2.3x linear attention's count; most of the rest
  is the L K-means iterations (about 7 operators each, 140 per step for two layers).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from attention.base import Mixer, autocast_as, autocast_state, require_non_negative, require_positive
from attention.masking import key_bias
from attention.padding import Padding
from attention.spec import FT, Grid, Knob, Peer, Spec, cap, int_range


def hash_queries(q: Tensor, planes: Tensor) -> Tensor:
    """SimHash codes as +-1 float32: the sign of ``q [B,H,N,D] @ planes [H,D,bits]`` (0 counts as +)."""
    proj = torch.matmul(q.float(), planes)
    return torch.where(proj >= 0, 1.0, -1.0)


def hamming_kmeans(codes: Tensor, mask: Tensor, n_clusters: int, iters: int) -> Tensor:
    """Lloyd's K-means in Hamming space on +-1 ``codes [B,H,N,bits]``; labels ``[B,H,N]`` in
    ``[0, n_clusters)`` for real queries, ``n_clusters`` for padded ones. Static shapes, no host read:
    an iteration is one ``baddbmm`` (assignment), one ``amin`` and a ``remainder`` (the nearest
    centroid's row, see :func:`_keys`), one ``index_add`` (votes) and one ``sign`` (majority); the
    first also restarts the clusters its assignment left empty."""
    with torch.autocast(codes.device.type, enabled=False):   # the exact-integer matmul needs full precision
        b, h, n, nb = codes.shape
        bh, c = b * h, n_clusters
        m, tie, dtype = _keys(bh, c, nb, codes.device)
        # Padded queries get the zero code: they vote for nothing, so they never move a centroid.
        keep = mask[:, None, :, None].to(dtype)
        real = codes.to(dtype) * keep                                       # [B,H,N,bits]
        x_sim = (real * -m).view(bh, n, nb).mT.contiguous()                 # [BH,bits,N]
        x_vote = (real * 2).view(bh * n, nb)
        # Seed j: the real query of rank floor(j len / C), real positions first in order.
        order = torch.argsort((~mask).to(torch.uint8), dim=-1, stable=True)   # [B,N]
        ranks = (torch.arange(c, device=codes.device) * mask.sum(-1, keepdim=True)) // c
        seeds = order.gather(1, ranks.clamp(max=n - 1))                     # [B,C]
        cent = real.gather(2, seeds[:, None, :, None].expand(b, h, c, nb)).view(bh, c, nb)   # +-1
        rows = cent.view(bh * c, nb)                                        # the same memory, row by row
        for it in range(iters):
            key = torch.baddbmm(tie, cent, x_sim).amin(1)                   # [BH,N]: -M (bits - 2 ham) + row
            row = key.remainder(m).long().view(-1)                          # nearest centroid's row in rows
            # c + 2 * votes: a majority sets the bit; a tie (and every bit of an empty cluster) keeps it
            if it:
                rows.index_add_(0, row, x_vote)
                cent.sign_()
            else:
                rows.copy_(_restart(rows.index_add(0, row, x_vote), key, row, keep.view(b, 1, n).expand(b, h, n), x_vote, m, c))
        key = torch.baddbmm(tie, cent, x_sim).amin(1)
        labels = (key.remainder(m).long() - torch.arange(0, bh * c, c, device=codes.device)[:, None]).view(b, h, n)
        return labels.masked_fill(~mask[:, None, :], c)


def _keys(bh: int, c: int, nb: int, device: torch.device) -> tuple[int, Tensor, torch.dtype]:
    """``key = -M (code . centroid) + bh C + j`` for cluster j of row bh, ``M >= BH C`` a power of
    two: the ``amin`` over j is the nearest centroid (ties to the lowest j) and ``key mod M`` its row
    in the flat ``[BH C, bits]`` centroids. Integers below 2^24 (2^53) are exact in float32 (float64)
    whatever the summation order."""
    m = 1 << max(0, bh * c - 1).bit_length()
    dtype = torch.float32 if (nb + 1) * m < 2 ** 24 else torch.float64
    return m, torch.arange(bh * c, device=device, dtype=dtype).view(bh, c, 1), dtype


def _restart(votes: Tensor, key: Tensor, row: Tensor, keep: Tensor, x_vote: Tensor, m: int, c: int) -> Tensor:
    """The first Lloyd update, with restarts: the r-th cluster the seeds' assignment left empty (a
    duplicate seed) restarts at the r-th real query farthest from its centroid (equal distances:
    lower position first), unless that distance is 0; the others take the majority (``votes`` is
    ``centroid + 2 * sum of the members' codes``, so a tied bit keeps its value)."""
    bh, n = key.shape
    nb = votes.shape[1]
    empty = (keep.new_zeros(bh * c).index_add(0, row, keep.reshape(-1)) == 0).view(bh, c)   # no member
    pos = 1 << max(1, (n - 1).bit_length())
    key_dtype = torch.float32 if 2 * (nb + 1) * pos < 2 ** 24 else torch.float64
    # 2 hamming * pos + (pos - 1 - position) for real queries, -1 for padded ones (never a restart)
    dist = key.div(m, rounding_mode="floor").to(key_dtype).add_(nb)          # bits + floor(key / M) = 2 hamming
    far_key = dist * pos + (pos - 1 - torch.arange(n, device=key.device))
    far_key, far = far_key.masked_fill(keep.reshape(bh, n) == 0, -1).topk(c, dim=-1)   # [BH,C], farthest first
    rank = empty.cumsum(-1) - empty.long()                                 # r of the r-th empty cluster
    reseed = empty & (far_key.gather(-1, rank) >= pos)                     # its candidate is not at distance 0
    src = far.gather(-1, rank) + torch.arange(0, bh * n, n, device=key.device)[:, None]
    restart = x_vote.index_select(0, src.view(-1))                         # 2 code: the same signs
    return torch.where(reseed.view(-1, 1), restart, votes).sign()


def cluster_major_slots(labels: Tensor, n_clusters: int, chunk: int) -> tuple[Tensor, Tensor, Tensor, int]:
    """Queries laid out cluster by cluster, each cluster padded to a multiple of ``chunk`` slots, in
    the static bound ``M = N + (C+1)(chunk-1)`` slots (rounded up to a chunk).

    Returns the slot of every query ``[B,H,N]``, the query of every slot ``[B,H,M]`` (0: empty), the
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
    source = torch.full((b, h, n_slots), 0, dtype=torch.long, device=dev).scatter_(2, sorted_slots, order)
    chunk_cluster = torch.full((b, h, n_slots // chunk), n_clusters, dtype=torch.long, device=dev)
    return slots, source, chunk_cluster.scatter_(2, sorted_slots // chunk, sorted_labels), n_slots


def _rows(t: Tensor, idx: Tensor) -> Tensor:
    """Rows of ``t [B,H,R,D]`` at ``idx [B,H,S]`` -> ``[B,H,S,D]``: one row gather (``index_select``),
    whose backward is one ``index_add`` (an element ``gather`` and its ``scatter_add`` are several
    times slower on CPU)."""
    b, h, r, d = t.shape
    flat = idx + torch.arange(0, b * h * r, r, device=t.device).view(b, h, 1)
    return t.reshape(b * h * r, d).index_select(0, flat.view(-1)).view(b, h, -1, d)


def improved_output(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, labels: Tensor, top_idx: Tensor,
                    rest: Tensor, mass: Tensor, scale: float, split: int | None = None) -> Tensor:
    """Eqs. 10-11 for every query i of cluster j: ``rest_j + m_j softmax(q_i K_T^T) V_T`` over the
    top-k keys T of its cluster (padded keys masked), ``rest [B,H,C,D]``, ``mass [B,H,C]``.

    The member queries of a cluster share its key set, so queries are laid out cluster-major in
    chunks of ``min(16, N // C)`` slots and each chunk does one small matmul against its cluster's k
    keys. Padded queries (label C) and chunks without a query read ``m = 0`` and ``rest = 0``: output
    0. Empty slots of a chunk read query 0; their output is never read, so their gradient is 0.
    """
    b, h, n, d = q.shape
    c, kk = top_idx.shape[2], top_idx.shape[3]
    chunk = max(1, min(16, n // c))                                         # about the mean cluster size
    slots, source, chunk_cluster, n_slots = cluster_major_slots(labels, c, chunk)
    g, bh = b * h * (n_slots // chunk), b * h
    split = g if split is None else split
    base = torch.arange(bh, device=q.device).view(b, h, 1)
    keys = top_idx.gather(2, chunk_cluster.clamp(max=c - 1)[..., None].expand(-1, -1, -1, kk)).view(b, h, -1)
    bias = key_bias(mask, q.dtype)[:, 0].expand(b, h, n).gather(2, keys).view(g, 1, kk)
    rest = F.pad(rest, (0, 0, 0, 1)).view(bh * (c + 1), d)                # row C: 0, read by padded queries
    mass = F.pad(mass, (0, 1)).view(bh * (c + 1))
    out = _ExactTopK.apply(*(t.reshape(bh * n, d) for t in (q, k, v)), rest, mass, bias,
                           (keys + base * n).view(-1), (chunk_cluster + base * (c + 1)).view(-1),
                           (source + base * n).view(-1), (slots + base * n_slots).view(-1), scale, split)
    return out.view(b, h, n, d)


class _ExactTopK(torch.autograd.Function):
    """Eq. 10's exact part over the cluster-major chunks, ``out_i = rest_j + m_j softmax(q_i K_T^T
    scale + bias) V_T``, in one node: ``q, k, v [R, D]`` flat rows, ``rest [C', D]``, ``mass [C']``,
    ``bias [G, 1, k]``; ``key_rows [G k]`` (into k, v), ``chunk_rows [G]`` (into rest, mass),
    ``source_rows [G chunk]`` (the query of each slot), ``slot_rows [R]`` (the slot of each query).

    Autograd would keep the chunks' gathered queries, keys and values (``G k D`` each, about 6x K at
    N = 1024) and the probabilities; here only the probabilities ``[G, chunk, k]`` are kept and the
    backward gathers again, so on CPU it can run in slices that stay in cache (``split`` chunks at a
    time; one pass on an accelerator). Measured (fwd + bwd of :func:`improved_output`, B 8, H 2,
    N 1024, D 32, C 100, k 32, one thread, interleaved: ``OMP_NUM_THREADS=1 python -m
    tests.bench.node_ratios exact``): against this node in one pass, its CPU slices take 0.77-0.82
    and plain operators 0.91-1.07 (two runs on a loaded machine), so on CPU it wins 1.1-1.35x over
    plain operators and stays; on an accelerator it keeps the memory of one probability tensor
    instead of the gathered keys and values. Slots without a query are never read, so
        their gradient is exactly 0."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, rest: Tensor, mass: Tensor, bias: Tensor, key_rows: Tensor,
                chunk_rows: Tensor, source_rows: Tensor, slot_rows: Tensor, scale: float, split: int) -> Tensor:
        g, _, kk = bias.shape
        d = q.shape[1]
        chunk = source_rows.shape[0] // g
        p, part = q.new_empty(0), q.new_empty(0)
        parts, probs = [], []
        for a, z in _slices(g, split):
            qs = q.index_select(0, source_rows[a * chunk:z * chunk]).view(z - a, chunk, d)
            rows = key_rows[a * kk:z * kk]
            p = torch.softmax(torch.baddbmm(bias[a:z], qs, k.index_select(0, rows).view(z - a, kk, d).mT, alpha=scale), -1)
            m = _as(mass.index_select(0, chunk_rows[a:z]).view(z - a, 1, 1), p.dtype)
            parts.append(torch.baddbmm(rest.index_select(0, chunk_rows[a:z]).view(z - a, 1, d), p * m,
                                       v.index_select(0, rows).view(z - a, kk, d)))
            probs.append(p)
        p, part = (torch.cat(t) if len(t) > 1 else t[0] for t in (probs, parts))
        ctx.save_for_backward(q, k, v, mass, p, key_rows, chunk_rows, source_rows, slot_rows)
        ctx.amp, ctx.scale, ctx.rest_dtype, ctx.split = autocast_state(q), scale, rest.dtype, split   # backward as forward
        return _as(part.view(-1, d).index_select(0, slot_rows), q.dtype)

    @staticmethod
    def backward(ctx, d_out: Tensor):
        q, k, v, mass, probs, key_rows, chunk_rows, source_rows, slot_rows = ctx.saved_tensors
        g, chunk, kk = probs.shape
        d = q.shape[1]
        with autocast_as(ctx.amp):
            d_parts = d_out.new_zeros(g * chunk, d).index_copy_(0, slot_rows, d_out).view(g, chunk, d)
            d_q, d_k, d_v = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
            d_m = mass.new_zeros(g)
            for a, z in _slices(g, ctx.split):
                p, d_part, rows, src = probs[a:z], d_parts[a:z], key_rows[a * kk:z * kk], source_rows[a * chunk:z * chunk]
                m = _as(mass.index_select(0, chunk_rows[a:z]).view(z - a, 1, 1), p.dtype)
                d_pv = _as(torch.bmm(d_part, v.index_select(0, rows).view(z - a, kk, d).mT), p.dtype)   # dL/d(m p)
                d_m[a:z] = (p * d_pv).sum((1, 2))
                d_v.index_add_(0, rows, _as(torch.bmm((p * m).mT, d_part).view(-1, d), v.dtype))
                d_p = d_pv.mul_(m)
                d_logits = d_p.sub_((p * d_p).sum(-1, keepdim=True)).mul_(p * ctx.scale)   # softmax backward
                qs = _as(q.index_select(0, src).view(z - a, chunk, d), d_logits.dtype)
                d_q.index_add_(0, src, _as(torch.bmm(d_logits, _as(k.index_select(0, rows).view(z - a, kk, d), d_logits.dtype))
                                           .view(-1, d), q.dtype))
                d_k.index_add_(0, rows, _as(torch.bmm(d_logits.mT, qs).view(-1, d), k.dtype))
            d_mass = mass.new_zeros(mass.shape).index_add_(0, chunk_rows, d_m)
            d_rest = d_out.new_zeros(mass.shape[0], d).index_add_(0, chunk_rows, _as(d_parts.sum(1), d_out.dtype))
        return d_q, d_k, d_v, _as(d_rest, ctx.rest_dtype), d_mass, None, None, None, None, None, None, None


def _as(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t`` in ``dtype``, dispatching nothing when it already is (autocast is the only mixer)."""
    return t if t.dtype == dtype else t.to(dtype)


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
    top-k columns and ``dA = dm`` on them. Measured (fwd + bwd, B 8, H 2, C 100, N 1024, D 32, k 32,
    one thread, 8 interleaved rounds: ``OMP_NUM_THREADS=1 python -m tests.bench.node_ratios below``):
    plain operators (softmax, topk, scatter, matmul) take 1.31x this node's time, so it stays.
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
            d_mass = _as(d_mass[..., None], top_mass.dtype)
            # sum_l A_l dA_l: off the top-k columns sum_l R_l (dR . V_l) = dR . (R V), on them m dm.
            dot = _as((d_rest * out).sum(-1, keepdim=True), top_mass.dtype) + top_mass.sum(-1, keepdim=True) * d_mass
            dl = da.sub_(_as(dot, da.dtype)).mul_(rest)                       # softmax backward, 0 on top-k
            dl.scatter_(-1, top_idx, _as(top_mass * (d_mass - dot), dl.dtype))   # ... and its top-k columns
            dq, dk = dl @ k, dl.transpose(-1, -2) @ centroids
        return (_as(dq * ctx.scale, centroids.dtype), _as(dk * ctx.scale, k.dtype), _as(dv, v.dtype),
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

    cpu_slice_bytes = 2 ** 21   # on CPU, i_clustered's exact part runs in slices whose keys fit this

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
        q = q.contiguous()                  # the shell's heads are strided views: one copy, not one per flattening
        labels = self.cluster(q, mask)
        # eq. 3: centroid = mean of the member queries (slot C collects the padded queries, dropped)
        flat = (labels + (torch.arange(b * h, device=q.device) * (c + 1)).view(b, h, 1)).view(-1)
        sums = q.new_zeros(b * h * (c + 1), d).index_add(0, flat, q.reshape(b * h * n, d))
        counts = q.new_zeros(b * h * (c + 1)).index_add(0, flat, q.new_ones(flat.shape))
        centroids = (sums / counts.clamp(min=1.0)[:, None]).view(b, h, c + 1, d)[:, :, :c]
        bias = key_bias(mask, q.dtype)                                       # [B,1,1,N]

        if not self.improved or c == n:  # c == n: each query is its centroid, the top-k step is the identity
            vc = F.scaled_dot_product_attention(centroids, k, v, attn_mask=bias)   # eqs. 4-5
            return _rows(F.pad(vc, (0, 0, 0, 1)), labels)                   # eq. 6; label C reads a zero row

        scale = 1.0 / math.sqrt(d)
        k, v = k.contiguous(), v.contiguous()                               # one copy for every flattening below
        rest, mass, top_idx = _ClusteredBelowTopK.apply(centroids, k, v, bias, min(self.topk, n), scale)
        # On CPU the exact part runs in slices whose gathered keys fit a 2 MiB cache (one pass on a GPU)
        split = max(1, self.cpu_slice_bytes // (top_idx.shape[-1] * d * q.element_size())) if self.on_cpu else None
        return improved_output(q, k, v, mask, labels, top_idx, rest, mass, scale, split)   # eqs. 10-11
