"""Routing attention (Roy, Saffar, Vaswani & Grangier, TACL 2021), beside local-window heads.

Routing heads (section 4.1): queries and keys are layer-normed without scale or bias, which puts
them on a sphere of radius sqrt(D), and routed by online spherical k-means with centroids
``mu [heads, n_clusters, D]`` shared across sequences. Balanced membership: each cluster takes its
top-w nearest queries and its top-w nearest keys, ``w = min(N, ceil(max_len / n_clusters))`` (from
``max_len``, not the padded N, so padding never changes membership); a query attends to
the keys of the clusters that took it (eq. 8, ``X'_i = sum_{j: K_j in mu(Q_i)} A_ij V_j``), using the
layer-normed queries and keys for the dot products, as the paper does. Cost O(N k D + N w D); with
the default ``k = sqrt(max_len)`` this is the paper's O(N^1.5 D).

Centroid update (section 4.1, training only, never in eval): ``mu <- lambda mu + (1 - lambda) m``,
``m`` the mean of the unit queries and keys whose nearest centroid is ``mu`` (padding excluded).
lambda = 0.999 as in the paper. Commitment loss (not written out in the paper's text; the
VQ-VAE-style term of public implementations, pulling q and k towards their centroids), stored in
``self.aux_loss`` in training: ``beta * (mean ||q^ - sg(mu(q^))||^2 + mean ||k^ - sg(mu(k^))||^2)``
over real tokens of the routing heads (q^, k^ unit vectors), beta = ``commitment``.

Local heads (the paper gives half the heads to local attention): non-overlapping blocks of
``window`` positions, each query attends to the keys of its own block, with the raw q and k.

Choices the paper leaves open, written down:

* No causal masking: LRA encoders are bidirectional (the paper notes encoder attention needs no
  extra masking), so queries and keys have separate projections.
* Heads ``0 .. local_heads-1`` are local, the rest route; ``local_heads: null`` = ``n_heads // 2``.
  ``n_clusters: null`` = ``round(sqrt(max_len))`` (the paper's optimal k); the centroids are
  buffers, so k is fixed at construction. ``w`` and ``window`` are clamped to N.
* Centroids are initialised as random unit vectors from :meth:`Mixer.generator` at construction (no
  data needed, deterministic per seed); routing compares unit-normalised q and k to them (spherical
  k-means: nearest = largest cosine). The update uses the mean of the assigned vectors rather than
  the paper's sum (a sum scales with batch and length, making lambda meaningless), weights queries
  and keys by their counts, renormalises to the sphere, and leaves a cluster with no assigned vector
  unchanged. Under data parallelism (``trainer=ddp``) the sums and counts are summed over the
  processes (``torch.distributed.all_reduce``) before the mean, so every rank applies the same
  update, the one a single process would make on the global batch. The commitment loss is a mean
  over the real tokens of the *global* batch too: each rank divides its sum by the global count
  over the world size (DDP averages the ranks' gradients), so ranks with more padding do not
  weigh more (a per-rank mean would).
* Tokens taken by no cluster (top-w membership is not a partition) fall back to block-local
  attention in their window, with the same layer-normed q and k: never a zero row. Tokens taken by
  several clusters combine the per-cluster outputs weighted by each cluster's softmax mass,
  ``o_i = sum_c exp(lse_ic) o_ic / sum_c exp(lse_ic)``: exactly softmax over the multiset union
  of their key sets (a key in two such clusters counts twice).
* Padding: padded tokens rank last in every cluster's top-w (they fill slots only when a row has
  fewer than w real tokens), are masked as keys, their query outputs are zeroed, and they never
  move a centroid nor enter the commitment loss.
* Attention scale 1/sqrt(D) on the layer-normed vectors (norm sqrt(D)), as in softmax attention.

How it is computed (same values as the plain form the float64 reference writes out):

* Clusters are combined without per-cluster log-sum-exps: a layer-normed vector has norm <= sqrt(D),
  so every logit is <= sqrt(D) and ``exp(logit - sqrt(D))`` lies in ``[exp(-2 sqrt(D)), 1]`` (no
  overflow, no underflow in float32 or bfloat16; float16 keeps these weights in float32). Each query
  sums its clusters' unnormalised numerators and masses and divides once: softmax over the union.
* The fallback is computed only for the queries no cluster took (about 1/e of them for balanced
  top-w membership), not for every query of every routing head: each block's untaken queries are
  packed into as many slots as the fullest block needs, a count read back on CPU, where the read is
  free (:func:`attention.graph_safe.host_reads_free`). On a GPU the read would be a host sync per
  layer, so there the slots are the static bound, the window: the fallback then costs what a local
  head costs, with the same values (the extra slots are multiplied by 0). Either way the shapes stay
  rectangular (fused kernels, no per-block loop). Host syncs per call on a GPU: none (padding is
  decided once per batch, ``Padding.any``).
* Block attention (local heads and fallback) runs through PyTorch's fused attention
  (``scaled_dot_product_attention`` on 4-d views of the shell's ``[B, N, H, D]`` projections), so no
  ``[window, window]`` probability matrix is stored for the backward pass.
* The centroid statistics are sums by index (``index_add_``), not a ``[B, H, N, C]`` one-hot.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from attention.base import Mixer, require_positive
from attention.graph_safe import host_reads_free
from attention.masking import neg_fill, pad_to_multiple, zero_padded
from attention.padding import Padding
from attention.spec import Grid, Knob, Peer, Range, Spec, cap, int_range


def block_local_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, window: int) -> Tensor:
    """Softmax attention within non-overlapping blocks of ``window`` positions; ``[B,H,N,D]``."""
    b, h, n, d = q.shape
    out = F.scaled_dot_product_attention(*(_blocks(t, window) for t in (q, k, v)),
                                         attn_mask=_block_key_bias(mask, window, q.dtype))
    return _unblock(out, b, n)


def _blocks(t: Tensor, window: int) -> Tensor:
    """``[B,H,N,D]`` -> ``[B*N/window, H, window, D]`` (zero-padded to a multiple of ``window``): the
    4-d layout of PyTorch's fused (flash) attention; a view of the shell's ``[B,N,H,D]`` projections when
    the heads' memory allows (all heads, or one), a copy otherwise."""
    b, h, _, d = t.shape
    return pad_to_multiple(t.transpose(1, 2), window, dim=1).reshape(-1, window, h, d).transpose(1, 2)


def _unblock(t: Tensor, b: int, n: int) -> Tensor:
    """Inverse of :func:`_blocks`: ``[B*nb, H, window, D]`` -> ``[B,H,N,D]``."""
    return t.transpose(1, 2).reshape(b, -1, t.shape[1], t.shape[3])[:, :n].transpose(1, 2)


def _block_key_bias(mask: Tensor, window: int, dtype: torch.dtype) -> Tensor:
    """Additive key bias ``[B*nb,1,1,window]``: 0 for real keys, a finite large negative for padded
    ones (a fully padded block stays NaN-free; its query rows are zeroed by the caller)."""
    real = pad_to_multiple(mask, window, dim=1, value=False)
    bias = torch.zeros(real.shape, dtype=dtype, device=mask.device).masked_fill(~real, neg_fill(dtype))
    return bias.view(-1, 1, 1, window)


def fallback_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor, need: Tensor, window: int) -> Tensor:
    """:func:`block_local_attention` computed only for the queries with ``need [B,H,N]`` True; zero
    rows elsewhere. Each block's needed queries are packed into ``cap`` slots, ``cap`` the largest
    count of any block (read back where that is free; else the static bound ``window``), so the work
    shrinks with the share of needed queries while shapes stay rectangular; spare slots compute a
    row that is multiplied by 0."""
    b, h, n, d = q.shape
    qb, kb, vb = (_blocks(t, window) for t in (q, k, v))                    # [B*nb,H,window,D]
    needb = _blocks(need[..., None], window)[..., 0]                        # [B*nb,H,window]
    counts = needb.sum(-1)                                                  # [B*nb,H]
    cap = int(counts.amax()) if host_reads_free(counts) else window
    if cap == 0:
        return torch.zeros_like(q)
    # Positions of the needed queries first, in order (a stable sort of "not needed").
    pos = torch.sort((~needb).to(torch.uint8), dim=-1, stable=True).indices[..., :cap]   # [B*nb,H,cap]
    valid = torch.arange(cap, device=q.device) < counts[..., None]
    picked = qb.gather(2, pos[..., None].expand(-1, -1, -1, d))                          # [B*nb,H,cap,D]
    out = F.scaled_dot_product_attention(picked, kb, vb, attn_mask=_block_key_bias(mask, window, q.dtype))
    out = out * valid[..., None].to(out.dtype)
    full = out.new_zeros(qb.shape).scatter_add(2, pos[..., None].expand(-1, -1, -1, d), out)
    return _unblock(full, b, n)


def _take(t: Tensor, idx: Tensor) -> Tensor:
    """Rows of ``t [B,H,N,D]`` at ``idx [B,H,...]`` -> ``[B,H,...,D]`` (no N x N intermediate)."""
    b, h, n, d = t.shape
    offsets = (torch.arange(b * h, device=t.device) * n).view(b, h, *([1] * (idx.dim() - 2)))
    return t.reshape(b * h * n, d).index_select(0, (idx + offsets).reshape(-1)).view(*idx.shape, d)


class RoutingAttention(Mixer):
    spec = Spec(
        grid=Grid({"n_clusters": (None, 1, 3, 7, 16), "local_heads": (None, 0, 1, 2), "window": (256, 1, 3, 8),
                   "decay": (0.999, 0.0, 0.3, 1.0), "commitment": (1e-4, 0.0, 0.3)},
                  size="window", unit=lambda r: cap(r["window"], most=8),
                  # no more local heads than heads; decay and commitment act in training only
                  allowed=lambda r: not (r.get("local_heads") is not None and "heads" in r
                                         and r["local_heads"] > r["heads"])
                  and (r.get("mode") != "eval" or (r.get("decay", 0.999) == 0.999
                                                   and r.get("commitment", 1e-4) == 1e-4))),
        ranges={"n_clusters": int_range(1, 8, nullable=True), "local_heads": int_range(0, 4, nullable=True),
                "window": int_range(1, 8), "decay": Range("float", 0.0, 1.0, draw=(0.0, 1.0)),
                "commitment": Range("float", 0.0, draw=(0.0, 1.0))},
        knobs=(Knob("n_clusters", (4, 8, 16, 32, 64)),), draws=False, small={"window": 8},
        # top-w cluster membership flips: 0.9% of outputs, 3.2% of key gradients (a whole cluster's keys move)
        precision={"flips": 0.06},
        documented=lambda m, o, heads, max_len: [
            ("local_heads", m.local_heads, heads // 2 if o["local_heads"] is None else o["local_heads"]),
            ("n_clusters", m.n_clusters, max(1, round(max_len ** 0.5)) if o["n_clusters"] is None else o["n_clusters"]),
            ("centroids", tuple(m.centroids.shape),
             (heads - (heads // 2 if o["local_heads"] is None else o["local_heads"]),
              max(1, round(max_len ** 0.5)) if o["n_clusters"] is None else o["n_clusters"], m.head_dim)),
            *((k, getattr(m, k), o[k]) for k in ("window", "decay", "commitment"))],
        peers=(Peer("routing", "routing-transformer SelfAttention", "routing-transformer", "routing_transformer",
                    "h/2 local heads (window 256, own block), k=round(sqrt(N)) clusters of N/k", "peer_routing",
                    why_not="k-means centroids and memory keys initialised by the peer", biases=(True, False)),))
    def __init__(
        self,
        n_heads: int,
        head_dim: int,
        max_len: int,
        layer_idx: int = 0,
        n_clusters: int | None = None,
        local_heads: int | None = None,
        window: int = 256,
        decay: float = 0.999,
        commitment: float = 1e-4,
    ) -> None:
        super().__init__(n_heads, head_dim, max_len, layer_idx)
        self.local_heads = n_heads // 2 if local_heads is None else local_heads
        if not 0 <= self.local_heads <= n_heads:
            raise ValueError(f"attention.local_heads={local_heads} must lie in [0, model.n_heads={n_heads}]")
        self.n_clusters = max(1, round(math.sqrt(max_len))) if n_clusters is None else n_clusters
        require_positive(n_clusters=self.n_clusters, window=window)
        if not 0.0 <= decay <= 1.0 or commitment < 0:
            raise ValueError(f"attention.decay={decay} must lie in [0, 1] and attention.commitment={commitment} >= 0")
        self.window = window
        self.decay = decay
        self.commitment = commitment
        init = torch.randn(n_heads - self.local_heads, self.n_clusters, head_dim, generator=self.init_generator())
        self.register_buffer("centroids", F.normalize(init, dim=-1))

    def forward(self, q: Tensor, k: Tensor, v: Tensor, pad: Padding, x: Tensor) -> Tensor:
        mask = pad.mask
        n, nl = q.shape[2], self.local_heads
        window = min(self.window, n)
        # split (not slices): its backward concatenates the heads' gradients instead of zero-filling
        # a full-size gradient per slice.
        (ql, qr), (kl, kr), (vl, vr) = (t.split([nl, q.shape[1] - nl], dim=1) for t in (q, k, v))
        outs = []
        if nl > 0:
            outs.append(block_local_attention(ql, kl, vl, mask, window))
        if nl < q.shape[1]:
            outs.append(self._route(qr, kr, vr, mask, window))
        # Heads joined in [B, N, H, D] memory: the shell's output projection then reads a view.
        out = torch.cat([o.transpose(1, 2) for o in outs], dim=2).transpose(1, 2)
        return zero_padded(out, pad)

    def _route(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, window: int) -> Tensor:
        b, h, n, d = q.shape
        qn, kn = F.layer_norm(q, (d,)), F.layer_norm(k, (d,))
        qu, ku = F.normalize(qn, dim=-1), F.normalize(kn, dim=-1)
        mu = self.centroids.to(q.dtype, copy=True)  # the EMA update below writes the buffer in place
        sim_q = torch.einsum("bhnd,hcd->bhcn", qu, mu)                      # cosines [B,H,C,N]
        sim_k = torch.einsum("bhnd,hcd->bhcn", ku, mu)
        pad = ~mask[:, None, None, :]
        # Cluster size from max_len, not the batch's padded length: padding must not change membership.
        w = min(n, -(-self.max_len // self.n_clusters))
        with torch.no_grad():  # membership is discrete; padded tokens rank last
            idx_q = sim_q.masked_fill(pad, -math.inf).topk(w, dim=-1).indices   # [B,H,C,w]
            idx_k = sim_k.masked_fill(pad, -math.inf).topk(w, dim=-1).indices
            real_k = mask[:, None, :].expand(b, h, n).gather(2, idx_k.flatten(2)).view_as(idx_k)
            # exp(logit - sqrt(d)) <= 1: layer-normed vectors have norm <= sqrt(d), so every logit
            # q.k / sqrt(d) <= sqrt(d). Padded keys get exp(-inf) = 0.
            shift = torch.zeros(real_k.shape, dtype=self._exp_dtype(q), device=q.device)
            shift = shift.masked_fill_(~real_k, -math.inf).sub_(math.sqrt(d)).flatten(0, 2)[:, None, :]

        # Eq. 8 per cluster, unnormalised: each query's clusters are then summed and divided once,
        # which is softmax over the multiset union of their key sets (no per-cluster log-sum-exp).
        ct = shift.dtype
        qg, kg, vg = (_take(t, i).to(ct).flatten(0, 2) for t, i in ((qn, idx_q), (kn, idx_k), (v, idx_k)))
        weights = torch.baddbmm(shift, qg, kg.transpose(1, 2), alpha=1 / math.sqrt(d)).exp_()  # [BHC,w,w]
        num = (weights @ vg).view(b, h, -1, d)                              # [B,H,C*w,D]
        den = weights.sum(-1).view(b, h, -1)
        flat = idx_q.flatten(2)                                             # [B,H,C*w]
        num = num.new_zeros(b, h, n, d).scatter_add(2, flat[..., None].expand(-1, -1, -1, d), num)
        den = den.new_zeros(b, h, n).scatter_add(2, flat, den)
        with torch.no_grad():
            taken = torch.zeros(b, h, n, dtype=torch.bool, device=q.device).scatter_(2, flat, True)
        routed = (num / den.clamp(min=torch.finfo(ct).tiny)[..., None]).to(q.dtype)   # untaken rows: 0 / tiny
        out = routed + fallback_attention(qn, kn, v, mask, ~taken & mask[:, None, :], window)

        if self.training:
            self._train_step(qu, ku, sim_q, sim_k, mask)
        return out

    @staticmethod
    def _exp_dtype(q: Tensor) -> torch.dtype:
        """float16 cannot hold exp(-2 sqrt(d)): the unnormalised weights are then kept in float32."""
        return torch.float32 if q.dtype == torch.float16 else q.dtype

    def _train_step(self, qu: Tensor, ku: Tensor, sim_q: Tensor, sim_k: Tensor, mask: Tensor) -> None:
        """Commitment loss (with gradient to q and k) and the EMA centroid update (no gradient)."""
        real = mask[:, None, :].to(qu.dtype)                                # [B,1,N]
        n_real = real.sum() * qu.shape[1]
        h, c, d = self.centroids.shape
        # ||u - mu(u)||^2 = 2 - 2 max_c u.mu_c for unit vectors; mu is a buffer (stop-gradient).
        commit = 0
        sums = qu.new_zeros(h * c, d)
        counts = qu.new_zeros(h * c)
        for u, s in ((qu, sim_q), (ku, sim_k)):
            best, nearest = s.max(dim=2)                                    # [B,H,N]
            commit = commit + ((2 - 2 * best) * real).sum()
            with torch.no_grad():  # per-centroid sums and counts of the real tokens, by index
                rows = (nearest + torch.arange(0, h * c, c, device=u.device)[:, None]).flatten()
                weight = real.expand(-1, h, -1).flatten()
                sums.index_add_(0, rows, u.detach().flatten(0, 2) * weight[:, None])
                counts.index_add_(0, rows, weight)
        world = 1
        with torch.no_grad():
            sums, counts = sums.view(h, c, d), counts.view(h, c)
            if dist.is_available() and dist.is_initialized():  # every rank: the global batch's statistics
                dist.all_reduce(sums)
                dist.all_reduce(counts)
                dist.all_reduce(n_real := n_real.clone())
                world = dist.get_world_size()               # DDP averages the ranks' gradients
        self.aux_loss = self.commitment * commit * world / n_real.clamp(min=1.0)
        with torch.no_grad():
            mean = sums / counts.clamp(min=1.0)[..., None]
            mu = self.centroids
            moved = F.normalize(self.decay * mu + (1 - self.decay) * mean.to(mu.dtype), dim=-1)
            mu.copy_(torch.where(counts[..., None] > 0, moved, mu))
