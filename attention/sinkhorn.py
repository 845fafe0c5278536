"""Sparse Sinkhorn attention (Tay et al. 2020, "Sparse Sinkhorn Attention").

The sequence is cut into n_B blocks of ``block_size`` tokens. A sorting network reads one summary
per key block and outputs, for every block i, logits over the blocks j it may be matched with
(section 3.1, R = P(psi(X)) in R^{n_B x n_B}). Sinkhorn balancing (section 3.2) turns R into a
doubly stochastic, near-permutation matrix S::

    S = Sinkhorn((R + gumbel noise) / temperature),  alternately normalising rows and columns
        ``sinkhorn_iterations`` times in log space,

and the keys and values of the sorted block i are the mixture sum_j S_ij K_j (resp. V_j). Each query
block attends, in one softmax with 1/sqrt(d) scaling, over its own block's keys and the sorted
block's keys (the paper's sorted attention combined with local block attention).

Choices the paper leaves open, written down:

* Summary psi: the masked mean of the block's keys per head (real tokens only); the sorting
  network is a two-layer MLP (head_dim -> head_dim, ReLU, -> ceil(max_len / block_size) logits)
  shared by the heads, its output cut to the n_B blocks of the batch.
* Defaults: block 32, 7 Sinkhorn iterations, temperature 0.75 (the settings the paper reports
  best, as used by the public PyTorch reproduction); Gumbel noise (Gumbel-Sinkhorn, Mena et al.
  2018) is added in training only, drawn from :meth:`Mixer.rand` at the ``max_len`` size
  ``[B, H, max_blocks, max_blocks]`` and cut to the batch's blocks (a draw of the batch's size
  would give a block other noise when the batch is padded further); eval uses no noise.
  ``block_size`` is clamped to ``max_len``. A length not divisible by the block is padded inside
  and the output cut back. With one block covering the sequence the method is exact softmax.
* Padding: blocks with no real token are left out of the matching: their rows and columns of the
  Sinkhorn input are replaced by the identity, so the real blocks' submatrix is balanced on its own
  and no real block is matched with an empty one. Padded keys and values are zeroed before
  mixing; the sorted slot t of block i carries the real mass w_it = sum_j S_ij m_jt, its key and
  value are the real-only mixture divided by w_it (a conditional mean), and log(w_it) is added to
  its logit, so a half-padded slot counts half and a slot with (almost) no real mass (below 1e-6,
  e.g. all contributors padding) gets no weight. In the own block, padded keys get no weight.
  Padded query rows are zeroed. Whether the batch has padding at all is decided once per batch, as
  in softmax (``Padding.any``: the host's statement, else one read shared
  by the layers): an unpadded batch skips every mask pass. Cost: O(N * 2 * block_size * d)
  for the attention, O(N n_B d) for the sorted mixtures and O(n_B^2) for the matching; block 32
  keeps the matching at <= 128 x 128 at LRA's 4K lengths.
* Execution: one path, the hand-written node :class:`_SortedBlockAttention` (it wins its measured
  ratio against plain ops, written there), static shapes, no host read; compiles with
  ``fullgraph=True`` and no break. The Gumbel draws come from :meth:`Mixer.rand`.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor, nn

from attention.base import Mixer, require_positive
from attention.masking import neg_fill, pad_to_multiple, zero_padded
from attention.padding import Padding
from attention.spec import Grid, Knob, Peer, Range, Spec, cap, int_range


def sinkhorn(log_alpha: Tensor, iterations: int) -> Tensor:
    """Log-space Sinkhorn balancing of ``[..., n, n]`` scores; returns the balanced matrix."""
    for _ in range(iterations):
        log_alpha = log_alpha - torch.logsumexp(log_alpha, dim=-1, keepdim=True)
        log_alpha = log_alpha - torch.logsumexp(log_alpha, dim=-2, keepdim=True)
    return log_alpha.exp()


def _with_sorted_into(x: Tensor, keep: Tensor | None, s: Tensor, inv: Tensor) -> Tensor:
    """``[B,H,n_B,bs,d]`` -> ``[B,H,n_B,2bs,d]``: each block's own rows (padded ones zeroed by
    ``keep``), then its sorted slots ``(sum_j S_ij x_j) * inv_i`` (the conditional mean), copied
    into one buffer through views (no concatenation; ``copy_`` into a view traces under
    ``torch.compile``, an ``out=`` view does not)."""
    b, h, nb, bs, d = x.shape
    out = x.new_empty(b, h, nb, 2 * bs, d)
    own = out[..., :bs, :]
    own.copy_(x if keep is None else x * keep)
    mix = torch.matmul(s, own.reshape(b, h, nb, bs * d)).view(b, h, nb, bs, d)
    out[..., bs:, :].copy_(mix * inv[..., None])
    return out


class _SortedBlockAttention(torch.autograd.Function):
    """Each query block's softmax attention over its own block and its sorted block (sec. 3):
    ``softmax(scale q [K; K_sorted]^T + bias) [V; V_sorted]`` with ``K_sorted_i = (sum_j S_ij K_j) /
    mass_i`` (likewise V); ``q, k, v [B,H,n_B,bs,d]``, ``keep [B,1,n_B,bs,1]`` (0 zeroes a padded key
    and value; None: no padding), ``S [B,H,n_B,n_B]``, ``inv = 1 / mass [B,H,n_B,bs]``, ``bias [B,H,n_B,2bs]``.

    One node that keeps the scaled queries, the two ``[own; sorted]`` buffers and the weights.
    Autograd would keep the own keys twice (masked for the mixture, and in the concatenation), the
    mixtures before the division and the scaled logits' inputs; here the rows are written straight
    into the buffers and the backward is written out: ``dS = w (dw - dO . O)`` (O recomputed), the
    division's gradient from ``K_sorted / inv`` (the mixture; ``inv > 0``). Computed in the inputs'
    common dtype (float32 under autocast). ``pieces``: the backward runs over that many slices of
    the (batch, head) groups (4 on CPU, where the smaller temporaries stay in cache; 1 on an
    accelerator, a choice made from ``Mixer.on_cpu``). Compiles (``fullgraph``, no break).

    Kept against the same formula in plain autograd ops (concatenated buffers, softmax, matmuls)
    because it wins, forward + backward on one CPU thread (B 4, H 2, d 64, block 32, 7 interleaved
    rounds): time 0.91x at N 1024 and 0.83x at 4096, peak memory 0.83x at both. (Written without
    the sliced backward and the buffers, to the plain ops' shape, it lost: 1.19x and 1.05x.)
    """

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, keep: Tensor | None, s: Tensor, inv: Tensor, bias: Tensor,
                scale: float, pieces: int) -> Tensor:
        ctx.dtypes = [q.dtype, k.dtype, v.dtype, None, s.dtype, inv.dtype, bias.dtype, None, None]
        dt = torch.promote_types(q.dtype, torch.promote_types(s.dtype, bias.dtype))
        q, k, v, keep, s, inv, bias = (t if t is None else t.to(dt) for t in (q, k, v, keep, s, inv, bias))
        b, h, nb, bs, d = q.shape
        rows = b * h * nb
        with torch.autocast(q.device.type, enabled=False):
            keys, values = _with_sorted_into(k, keep, s, inv), _with_sorted_into(v, keep, s, inv)
            qf = (q * scale).reshape(rows, bs, d)
            logits = torch.baddbmm(bias.reshape(rows, 1, 2 * bs), qf, keys.view(rows, 2 * bs, d).transpose(1, 2))
            w = torch.softmax(logits, -1)
            del logits
            out = torch.bmm(w, values.view(rows, 2 * bs, d))
        ctx.save_for_backward(qf, keys, values, keep, s, inv, w)
        ctx.scale, ctx.pieces = scale, pieces
        return out.view(b, h, nb, bs, d).to(ctx.dtypes[0])

    @staticmethod
    def backward(ctx, d_out: Tensor):
        qf, keys, values, keep, s, inv, w = ctx.saved_tensors
        b, h, nb, bs2, d = keys.shape
        g, bs = b * h, bs2 // 2
        # Per (batch, head) group: the blocks mix only within a group, so the backward runs over a few
        # slices of groups and its score-sized temporaries are a fraction of the saved weights.
        qg, kg, vg, wg = qf.view(g, nb, bs, d), keys.view(g, nb, bs2, d), values.view(g, nb, bs2, d), w.view(g, nb, bs, bs2)
        keepg = None if keep is None else keep.expand(b, h, nb, bs, 1).reshape(g, nb, bs, 1)
        sg, invg = s.reshape(g, nb, nb), inv.reshape(g, nb, bs)
        dog = d_out.to(w.dtype).reshape(g, nb, bs, d)
        dq, dk, dv = (qf.new_empty(g, nb, bs, d) for _ in range(3))
        ds, d_inv, d_bias = s.new_empty(g, nb, nb), inv.new_empty(g, nb, bs), w.new_empty(g, nb, bs2)
        step = -(-g // min(g, ctx.pieces))
        with torch.autocast(qf.device.type, enabled=False):
            for sl in (slice(i, i + step) for i in range(0, g, step)):
                rows = lambda t: t[sl].reshape(-1, *t.shape[2:])  # noqa: E731  [groups, nb, ...] -> [rows, ...]
                do, wr, kw, vw = rows(dog), rows(wg), rows(kg), rows(vg)
                # sum_j w_j dw_j = dO . O, with O recomputed (one GEMM) rather than kept.
                row_dot = (do * torch.bmm(wr, vw)).sum(-1, keepdim=True)
                keep_sl = None if keepg is None else keepg[sl]
                ds_v, di_v = _sorted_backward(wr, do, vg[sl], keep_sl, sg[sl], invg[sl], dv[sl])
                dl = torch.bmm(do, vw.transpose(1, 2)).sub_(row_dot).mul_(wr)      # softmax backward
                d_bias[sl] = dl.view(-1, nb, bs, bs2).sum(2)
                rows(dq).copy_(torch.bmm(dl, kw)).mul_(ctx.scale)
                ds_k, di_k = _sorted_backward(dl, rows(qg), kg[sl], keep_sl, sg[sl], invg[sl], dk[sl])  # qf is scaled
                ds[sl] = ds_k + ds_v
                d_inv[sl] = di_k + di_v
        shape = (b, h, nb)
        grads = (dq.view(*shape, bs, d), dk.view(*shape, bs, d), dv.view(*shape, bs, d), None, ds.view(*shape, nb),
                 d_inv.view(*shape, bs), d_bias.view(*shape, bs2), None, None)
        return tuple(t if t is None else t.to(dt) for t, dt in zip(grads, ctx.dtypes))


def _sorted_backward(p: Tensor, x: Tensor, buf: Tensor, keep: Tensor | None, s: Tensor, inv: Tensor,
                     d_own: Tensor) -> tuple[Tensor, Tensor]:
    """Gradients of the own rows (into ``d_own [g, nb, bs, d]``), ``S`` and ``inv`` of a
    :func:`_with_sorted_into` buffer ``[g, nb, 2bs, d]`` whose gradient is ``p^T x`` (``p [g nb, bs, 2bs]``,
    ``x [g nb, bs, d]``): the sorted half first, through the conditional mean, then the own half added
    in place (no ``[., 2bs, d]`` gradient is formed)."""
    g, nb, bs2, d = buf.shape
    bs = bs2 // 2
    own, mixed = buf[..., :bs, :], buf[..., bs:, :]
    d_mixed = torch.bmm(p[..., bs:].transpose(1, 2), x).view(g, nb, bs, d)
    d_inv = (d_mixed * mixed).sum(-1) / inv                                  # mixed = mixture * inv
    d_mix = d_mixed.mul_(inv[..., None]).view(g, nb, bs * d)
    d_s = d_mix @ own.reshape(g, nb, bs * d).transpose(-1, -2)
    d_own.view(g, nb, bs * d).copy_(torch.bmm(s.transpose(-1, -2), d_mix))
    del d_mixed, d_mix
    d_own.view(-1, bs, d).baddbmm_(p[..., :bs].transpose(1, 2), x)
    if keep is not None:
        d_own.mul_(keep)
    return d_s, d_inv





class SinkhornAttention(Mixer):
    spec = Spec(
        grid=Grid({"block_size": (32, 1, 3, 4), "sinkhorn_iterations": (7, 1, 3), "temperature": (0.75, 0.3, 2.0),
                   "gumbel_noise": (True, False)}, size="block_size", unit=lambda r: cap(r["block_size"], most=8)),
        ranges={"block_size": int_range(1, 8), "sinkhorn_iterations": int_range(1, 8),
                "temperature": Range("float", 0.0, low_open=True, draw=(0.05, 3.0))},
        knobs=(Knob("block_size", (8, 16, 32, 64, 128)),), draws=lambda s: s["gumbel_noise"], small={"block_size": 8},
        # the Gumbel noise over block pairs is drawn at the padded shape: another sample at another padded length
        train_noise_off={"gumbel_noise": False},
        # the column normalisation removes a per-column shift of the sorting logits: the last layer's bias
        precision={"cancelled": ("sort_net.2.bias",)},
        documented=lambda m, o, heads, max_len: [
            ("block_size", m.block_size, min(o["block_size"], max_len)),
            ("max_blocks", m.max_blocks, -(-max_len // min(o["block_size"], max_len))),
            *((k, getattr(m, k), o[k]) for k in ("sinkhorn_iterations", "temperature", "gumbel_noise"))],
        peers=(Peer("sinkhorn", "sinkhorn-transformer SinkhornSelfAttention", "sinkhorn-transformer",
                    "sinkhorn_transformer", "bucket 32, 7 iterations, temperature 0.75, Gumbel-Sinkhorn", "peer_sinkhorn",
                    why_not="Gumbel noise, and a different sorting network (ours: MLP on block means)",
                    biases=(False, True)),))

    def __init__(
        self,
        n_heads: int,
        head_dim: int,
        max_len: int,
        layer_idx: int = 0,
        block_size: int = 32,
        sinkhorn_iterations: int = 7,
        temperature: float = 0.75,
        gumbel_noise: bool = True,
    ) -> None:
        super().__init__(n_heads, head_dim, max_len, layer_idx)
        require_positive(block_size=block_size, sinkhorn_iterations=sinkhorn_iterations, temperature=temperature)
        self.block_size = min(block_size, max_len)
        self.max_blocks = math.ceil(max_len / self.block_size)
        self.sinkhorn_iterations = sinkhorn_iterations
        self.temperature = temperature
        self.gumbel_noise = gumbel_noise
        self.sort_net = nn.Sequential(
            nn.Linear(head_dim, head_dim), nn.ReLU(), nn.Linear(head_dim, self.max_blocks)
        )

    def block_logits(self, summaries: Tensor, n_blocks: int) -> Tensor:
        """Sorting-network logits ``[B, H, n_B, n_B]`` (row: query block, column: matched block)."""
        if n_blocks > self.max_blocks:
            raise ValueError(f"{n_blocks} blocks exceed sinkhorn max_len {self.max_len}: set task.max_len")
        return self.sort_net(summaries)[..., :n_blocks]

    def sorting_matrix(self, summaries: Tensor, block_valid: Tensor) -> Tensor:
        """Doubly stochastic ``[B, H, n_B, n_B]``; empty blocks are matched only with themselves."""
        n_b = summaries.shape[2]
        logits = self.block_logits(summaries, n_b)
        if self.training and self.gumbel_noise:
            # Drawn at the size of max_len and cut, so a block's noise does not depend on the padding.
            full = (*logits.shape[:-2], self.max_blocks, self.max_blocks)
            # drawn and transformed in float32 at least: in bfloat16 u rounds to 1 and log(-log u) is -inf
            u = self.rand(full, logits.device, torch.promote_types(logits.dtype, torch.float32))[..., :n_b, :n_b]
            logits = logits - torch.log(-torch.log(u.clamp(1e-6, 1 - 1e-6))).to(logits.dtype)
        logits = logits / self.temperature
        pair = (block_valid[:, :, None] & block_valid[:, None, :])[:, None]
        eye = torch.eye(n_b, dtype=torch.bool, device=logits.device)
        fill = torch.full_like(logits, torch.finfo(logits.dtype).min / 4).masked_fill(eye, 0.0)
        logits = torch.where(pair, logits, fill)
        return sinkhorn(logits, self.sinkhorn_iterations)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, pad: Padding, x: Tensor) -> Tensor:
        mask = pad.mask
        b, h, n, d = q.shape
        bs = self.block_size
        dtype = q.dtype
        # Slots with less real mass than this count as empty: keeps 1/mass and its gradient finite.
        min_mass = 1e-6 if torch.finfo(dtype).bits > 16 else torch.finfo(dtype).eps
        neg = neg_fill(dtype)
        q, k, v = (pad_to_multiple(t, bs, dim=2) for t in (q, k, v))
        m = pad_to_multiple(mask, bs, dim=1, value=False)
        n_b = m.shape[1] // bs
        mb = m.view(b, n_b, bs)
        mf = mb.to(dtype)
        qb, kb, vb = (t.view(b, h, n_b, bs, d) for t in (q, k, v))
        # Decided once per batch, as softmax: an unpadded batch skips every mask pass.
        keep = mf[:, None, :, :, None] if pad.any else None

        counts = mf.sum(-1)                                                  # [B, n_B]
        summaries = (kb if keep is None else kb * keep).sum(3) / counts.clamp_min(1.0)[:, None, :, None]   # masked means
        s = self.sorting_matrix(summaries, counts > 0)                       # [B, H, n_B, n_B]

        mass = torch.einsum("bhij,bjt->bhit", s, mf)                         # real mass per slot
        has_mass = mass > min_mass
        inv_mass = 1.0 / mass.clamp_min(min_mass)
        sorted_bias = torch.where(has_mass, torch.log(mass.clamp_min(min_mass)), torch.full_like(mass, neg))
        own_bias = torch.zeros_like(mf).masked_fill(~mb, neg)[:, None].expand(b, h, n_b, bs)
        bias = torch.cat([own_bias, sorted_bias], dim=3)                     # [B, H, n_B, 2bs]
        out = _SortedBlockAttention.apply(qb, kb, vb, keep, s, inv_mass, bias, d ** -0.5, 4 if self.on_cpu else 1)
        out = out.reshape(b, h, n_b * bs, d)[:, :, :n]
        return zero_padded(out, pad)
