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
``m`` the mean of the unit queries and keys whose nearest centroid is ``mu`` (padding excluded),
computed as ``lerp(m, mu, lambda)`` and put back on the sphere.
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
  attention in their window, with the same layer-normed q and k: never a zero row (a real token
  is taken iff its summed softmax mass is > 0: every real key's weight is >= exp(-2 sqrt(D))).
  Tokens taken by several clusters combine the per-cluster outputs weighted by each cluster's softmax mass,
  ``o_i = sum_c exp(lse_ic) o_ic / sum_c exp(lse_ic)``: exactly softmax over the multiset union
  of their key sets (a key in two such clusters counts twice).
* Padding: padded tokens rank last in every cluster's top-w (they fill slots only when a row has
  fewer than w real tokens), are masked as keys, their query outputs are zeroed, and they never
  move a centroid nor enter the commitment loss.
* Attention scale 1/sqrt(D) on the layer-normed vectors (norm sqrt(D)), as in softmax attention.

How it is computed (one path, static shapes, no host read; heads and rows batched, no Python loop
over them; same values as the plain form the float64 reference writes out), and what a GPU launches:

1. The routing heads' q and k are stacked (``[2, B, H_r, N, D]``), so layer norm, the unit
   normalisation, the cosines to the centroids (one matmul), the top-w membership (one ``topk``)
   and the gathers run once for both. The unit vectors times sqrt(D) are a second layer norm, with
   epsilon float32's smallest normal (1.2e-38) instead of 1e-5 (the centroids' copy takes the
   1 / sqrt(D)): ``(x - mean) / ||x - mean||`` is the direction of the layer-normed vector (layer
   norm's epsilon only scales it), here in one operator and one backward operator (``F.normalize``
   of the layer-normed vector took four and about fifteen). The factor between the two,
   ``sqrt(var / (var + 1.2e-38))``, is 1 in any float unless the variance itself is near 1e-38,
   where both are degenerate (``F.normalize`` clamped the norm at 1e-12); a zero vector stays zero.
   That is the training form; in eval no gradient reaches the unit vectors (membership is
   discrete, there is no commitment loss), so eval keeps ``F.normalize``, the cheaper forward on CPU
   (one thread, ``[2, 8, 1, 1024, 64]``: about 0.5 ms against the layer norm's 1.1 ms; with their
   backward the layer norm takes 7.1 ms against 10.9 ms).
2. Eq. 8 per cluster, unnormalised: one ``baddbmm`` + ``exp`` gives ``[B H_r C, w, w]`` weights,
   one matmul against the gathered ``[V, 1]`` rows gives numerators and masses together, one
   ``index_add`` sums them per query over the clusters that took it, one division normalises.
   A layer-normed vector has norm <= sqrt(D), so every logit is <= sqrt(D) and ``exp(logit -
   sqrt(D))`` lies in ``[exp(-2 sqrt(D)), 1]`` (no overflow, no underflow in float32 or bfloat16;
   float16 keeps these weights in float32): softmax over the multiset union without per-cluster
   log-sum-exps.
3. The fallback is block-local attention of the layer-normed q and k computed for every query of
   the routing heads and selected by ``where(taken, routed, fallback)`` (a query is taken iff its
   summed mass is > 0): the static-shape form; packing only the untaken queries (about 1/e of
   them) would need their per-block count, a data-dependent shape. On an accelerator the local
   heads and the fallback are one fused ``scaled_dot_product_attention`` over all heads, and the
   routed sums are padded with the local heads (zero mass: untaken) so that one ``where`` over all
   heads selects; on CPU (:attr:`Mixer.on_cpu`, the one device choice) they are two calls on views
   of the shell's projections, which saves copying q and k (interleaved, one thread, B 8, N 1024:
   the one-call form is 1.13x the step's time there). Both give the same values (a test checks
   it). The blocks are one ``reshape`` per tensor to ``[B H N/window, 1, window, D]``.
4. Training: the commitment loss from the cosine maxima (gradient to q^ and k^), the EMA update from
   one ``index_add`` of ``[u, 1]`` rows (sums and counts together), all-reduced under DDP.

Host syncs per call: none, on any device (padding is decided once per batch, ``Padding.any``).
Dispatches (issue 62, ``python -m lra.bench --protocol dispatches --variants linear,routing
--lengths 1024``, accelerator path, N = 1024, batch 16): 685 operators, 1.44x linear attention's
477 (target 1.5x; 757, 1.58x, before the block layout, the unit vectors and the all-heads ``where``
above). A layer's step is about 150 operators: the head splits, the one block attention, the final
``where`` and their backward about 35; the two layer norms with their backward 6; the cosines,
top-w, gathers, eq. 8 matmuls, ``index_add`` and normalisation with their backward about 75; the
commitment loss and EMA update about 30. Linear attention's whole layer is about 40.
* The centroid statistics are sums by index (``index_add_``), not a ``[B, H, N, C]`` one-hot.
"""
from __future__ import annotations

import math

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import Tensor

from attention.base import Mixer, require_positive
from attention.masking import neg_fill, pad_to_multiple, zero_padded
from attention.padding import Padding
from attention.spec import Grid, Knob, Peer, Range, Spec, cap, int_range


def block_local_attention(q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, window: int) -> Tensor:
    """Softmax attention within non-overlapping blocks of ``window`` positions; ``[B,H,N,D]``.
    ``mask None``: no padded key (the batch has no padding and N is a multiple of ``window``)."""
    b, h, n, d = q.shape
    nb = -(-n // window)
    bias = None
    if mask is not None or n % window:
        real = pad_to_multiple(torch.ones(b, n, dtype=torch.bool, device=q.device) if mask is None else mask,
                               window, dim=1, value=False)
        bias = torch.zeros(real.shape, dtype=q.dtype, device=q.device).masked_fill(~real, neg_fill(q.dtype))
        # finite: a fully padded block stays NaN-free (zeroed by the caller)
        bias = bias.view(b, 1, nb * window).expand(b, h, nb * window).reshape(-1, 1, 1, window)
    out = F.scaled_dot_product_attention(*(_blocks(t, window) for t in (q, k, v)), attn_mask=bias)
    out = out.reshape(b, h, nb * window, d)           # a view: one head per block row
    return out[:, :, :n] if n % window else out


def _blocks(t: Tensor, window: int) -> Tensor:
    """``[B,H,N,D]`` -> ``[B*H*N/window, 1, window, D]`` (zero-padded to a multiple of ``window``):
    every block of every head a batch row of the fused attention, one ``reshape`` (a view of a
    contiguous ``[B,H,N,D]`` or of one head of the shell's ``[B,N,H,D]`` projections, a copy of
    several). One head per row: on CPU (one thread, B 8, N 1024, interleaved) the fused kernel's
    forward and backward ran 2-8% slower with the blocks as its heads (``[B, H*N/window, window,
    D]``), and as fast as ``[B*N/window, H, window, D]`` (three transposes and a reshape per tensor)."""
    return pad_to_multiple(t, window, dim=2).reshape(-1, 1, window, t.shape[-1])


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
        mask = pad.mask if pad.any else None
        b, h, n, d = q.shape
        nl, window = self.local_heads, min(self.window, n)
        if nl == h:
            return zero_padded(block_local_attention(q, k, v, mask, window), pad)
        # Routing heads: q and k stacked so that every step below runs once for both.
        (ql, qr), (kl, kr), (vl, vr) = (t.split([nl, h - nl], dim=1) for t in (q, k, v))
        qk = torch.stack([qr, kr])                                          # [2,B,Hr,N,D]
        qkn = F.layer_norm(qk, (d,))
        qn, kn = qkn.unbind()
        if self.on_cpu or not nl:  # two block attentions on the shell's views (1.13x faster on CPU)
            routed, taken = self._route(qk, qkn, vr, pad, 0)
            out = torch.where(taken, routed, block_local_attention(qn, kn, vr, mask, window))
            out = torch.cat([block_local_attention(ql, kl, vl, mask, window), out], 1) if nl else out
        else:  # the local heads (raw q, k) and the fallback (layer-normed) in one launch
            routed, taken = self._route(qk, qkn, vr, pad, nl)               # every head, the local ones untaken
            local = block_local_attention(torch.cat([ql, qn], 1), torch.cat([kl, kn], 1), v, mask, window)
            out = torch.where(taken, routed, local)
        return zero_padded(out, pad)                                        # untaken queries: the fallback

    def _route(self, qk: Tensor, qkn: Tensor, v: Tensor, pad: Padding, lead: int) -> tuple[Tensor, Tensor]:
        """Eq. 8 over each cluster's top-w queries and keys, combined over the clusters that took a
        query; returns it ``[B,lead+Hr,N,D]`` and ``taken [B,lead+Hr,N,1]`` (a cluster took the
        query), the first ``lead`` heads zero and untaken."""
        _, b, h, n, d = qkn.shape
        c = self.n_clusters
        # q^ = (x - mean) / ||x - mean||, the layer-normed vector's direction. Training: layer norm with
        # an epsilon below any float variance gives sqrt(d) q^ (one op and one backward op), the
        # centroids' copy takes the 1 / sqrt(d). Eval: no gradient reaches them (membership is
        # discrete), and F.normalize is the cheaper forward on CPU.
        if self.training:
            qks, scale = F.layer_norm(qk, (d,), eps=_TINY), 1 / math.sqrt(d)
        else:
            qks, scale = F.normalize(qkn, dim=-1), 1.0
        mu = _as(self.centroids, qkn.dtype) * scale   # a copy: the EMA update writes the buffer in place
        # Cluster size from max_len, not the batch's padded length: padding must not change membership.
        w = min(n, -(-self.max_len // c))
        sim = torch.matmul(mu, qks.mT)                                      # cosines [2,B,Hr,C,N]
        with torch.no_grad():  # membership is discrete; padded tokens rank last
            ranked = sim.masked_fill(~pad.mask[:, None, None, :], -math.inf) if pad.any else sim
            idx = ranked.topk(w, dim=-1).indices                            # [2,B,Hr,C,w]: queries, keys
            rows = (idx + torch.arange(0, 2 * b * h * n, n, device=idx.device).view(2, b, h, 1, 1)).view(2, -1)
            # exp(logit - sqrt(d)) <= 1: layer-normed vectors have norm <= sqrt(d), so every logit
            # q.k / sqrt(d) <= sqrt(d). Padded keys get exp(-inf) = 0.
            ct = torch.float32 if qkn.dtype == torch.float16 else qkn.dtype   # float16 cannot hold exp(-2 sqrt(d))
            shift = torch.full((1, 1, 1), -math.sqrt(d), dtype=ct, device=idx.device)
            if pad.any:
                real_k = pad.mask[:, None, :].expand(b, h, n).reshape(-1).index_select(0, rows[1] - b * h * n)
                shift = shift.masked_fill(~real_k.view(-1, 1, w), -math.inf)
        # Eq. 8 per cluster, unnormalised: each query's clusters are then summed and divided once,
        # which is softmax over the multiset union of their key sets (no per-cluster log-sum-exp).
        qg, kg = _as(qkn.reshape(-1, d).index_select(0, rows.view(-1)), ct).view(2, b * h * c, w, d)
        v1 = F.pad(v, (0, 1), value=1.0).reshape(b * h * n, d + 1)           # [V, 1]: numerator and mass at once
        vg = _as(v1.index_select(0, rows[1] - b * h * n), ct).view(b * h * c, w, d + 1)
        weights = torch.baddbmm(shift, qg, kg.mT, alpha=1 / math.sqrt(d)).exp_()   # [BHrC, w, w]
        part = (weights @ vg).view(-1, d + 1)                                # autocast may lower it
        num = part.new_zeros(b * h * n, d + 1).index_add_(0, rows[0], part).view(b, h, n, d + 1)
        num = F.pad(num, (0, 0, 0, 0, lead, 0)) if lead else num            # the local heads: untaken
        num, den = num.split([d, 1], dim=-1)                                # den 0: no cluster took the query
        if self.training:
            self._train_step(qks, sim, pad)
        return _as(num / den.clamp(min=torch.finfo(num.dtype).tiny), qkn.dtype), den > 0

    def _train_step(self, qks: Tensor, sim: Tensor, pad: Padding) -> None:
        """Commitment loss (with gradient to q and k) and the EMA centroid update (no gradient);
        ``qks``: sqrt(d) q^ and sqrt(d) k^, ``sim``: their cosines to the centroids."""
        _, b, h, n, d = qks.shape
        c = self.n_clusters
        # ||u - mu(u)||^2 = 2 - 2 max_c u.mu_c for unit vectors; mu is a buffer (stop-gradient).
        best, nearest = sim.max(dim=-2)                                     # [2,B,Hr,N]
        gap = 1 - best
        real = pad.mask[:, None, :, None].to(qks.dtype) if pad.any else None
        if pad.any:
            gap = gap * real[..., 0]                                        # padded tokens: no loss
        with torch.no_grad():  # per-centroid sums and counts of the real tokens, by index
            rows = (nearest + torch.arange(0, h * c, c, device=qks.device).view(h, 1)).view(-1)   # rows of mu [Hr C, D]
            stats = F.pad(qks * (1 / math.sqrt(d)), (0, 1), value=1.0)      # [u, 1]
            if pad.any:
                stats = stats * real                                        # padded tokens: no vote
            stats = qks.new_zeros(h * c, d + 1).index_add_(0, rows, stats.view(-1, d + 1)).view(h, c, d + 1)
            world = 1
            if dist.is_available() and dist.is_initialized():  # every rank: the global batch's statistics
                dist.all_reduce(stats)
                world = dist.get_world_size()               # DDP averages the ranks' gradients
        sums, counts = stats.split([d, 1], dim=-1)
        # A mean over the real tokens of the global batch (the counts hold each q^ and k^ once):
        # beta (mean ||q^ - mu||^2 + mean ||k^ - mu||^2).
        self.aux_loss = gap.sum() * (4 * self.commitment * world) / counts.sum().clamp(min=2.0)
        with torch.no_grad():
            mu = self.centroids
            moved = torch.lerp(_as(sums / counts.clamp(min=1.0), mu.dtype), mu, self.decay)
            moved = moved / torch.linalg.vector_norm(moved, dim=-1, keepdim=True).clamp_min(1e-12)   # to the sphere
            mu.copy_(torch.where(counts > 0, moved, mu))


_TINY = torch.finfo(torch.float32).tiny   # the layer norm epsilon of the unit vectors: below any variance


def _as(t: Tensor, dtype: torch.dtype) -> Tensor:
    """``t`` in ``dtype``, dispatching nothing when it already is."""
    return t if t.dtype == dtype else t.to(dtype)
