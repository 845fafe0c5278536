"""Adaptive Multi-Resolution Attention (AdaMRA; Zhang, Ma, Seidl, Tresp), eqs. 6-9.

Every AdaMRA head ``h`` has a compression rate ``c_h``: keys and values are compressed by segment
means into ``m_h ~ n * c_h`` landmarks; a router ``P = softmax(Q W)`` (eq. 6) sends each query to
the head of highest probability; the query then reads its head's compressed memory with kernel
attention (eq. 7)::

    out_i = phi(q_i^h)^T sum_j phi(k~_j^h) (v~_j^h)^T / phi(q_i^h)^T sum_j phi(k~_j^h)

Each head is split into ``S`` subheads of the same resolution (eqs. 8-9), and the heads are summed
(only the routed one is non-zero for a query) before the shell's output projection ``W^O``.

Choices the paper leaves open, written down:

* **Heads vs. the shell's heads.** The rate list defines the AdaMRA heads (``H = len(rates)``,
  default the paper's best ``(1/2, 1/8, 1/32)``, Table 4 row 3), independent of the shell. The
  shell's ``n_heads`` are the ``S`` subheads of eq. 8 (``S * d_v = d``, as in the paper): with the
  default backbone (2 heads of 32) AdaMRA has 3 heads of 2 subheads each. Every subhead of a head
  uses that head's resolution; a query is routed per token, so all its subheads go to one head.
* **Per-head projections (eq. 9).** ``W^{Q,K,V}_{h,s}`` project the shell's Q, K, V (eq. 1) into
  head ``h``'s subspaces: one ``d x d`` map per head and role (``head_proj=True``), split into the
  ``S`` subheads, initialised to the identity (a product of two random projections adds nothing
  but noise; the heads diverge through their resolutions and routed queries). Keys and values are
  compressed *before* the projection (exact: segment means and linear maps commute).
  ``head_proj=False`` shares the shell's projections.
* **Segments.** Head ``h`` averages consecutive windows of ``s_h = round(1 / c_h)`` positions
  (the paper pads ``n`` to a multiple of ``m``; here the last window is ragged instead). Padded
  tokens are excluded from the means and a window with no real token is no landmark at all, so a
  sequence gives the same output whatever the batch padding. ``c_h = 1`` is uncompressed.
* **Router input.** ``F(Q) = Q W`` on the full (all subheads) query of the shell, ``W`` in
  ``R^{d x H}`` without bias, as eq. 6 writes it.
* **Router gradient.** Argmax routing has no gradient, and the paper does not say how ``W`` learns
  (it only cites Shazeer et al. 2017). We use a straight-through scale ``P_{i,h*} /
  stopgrad(P_{i,h*})``, exactly 1 in the forward pass (outputs are eq. 7 unchanged), whose
  gradient is the Switch/MoE gate gradient divided by ``P_{i,h*}`` (:meth:`AdaMRAAttention._normalise`).
* **Feature map** (Table 5): ``relu`` (default, the paper's), ``elu`` (``elu(x) + 1``) or
  ``softmax`` (exact softmax attention over the compressed keys, scaled by ``1/sqrt(d_k)``; this
  ablation is not linear-time). Kernel attention uses no ``1/sqrt(d)`` scale (it cancels for
  ReLU). A ReLU query whose features miss every landmark's has a zero normaliser: it gets a zero
  output (the denominator is clamped at ``eps``) instead of NaN, computed in float32 under
  float16 (:meth:`AdaMRAAttention._wide`).
* **Random router** (Table 5, "Rand"): ``router="random"`` draws each query's head uniformly
  (:meth:`AdaMRAAttention.random_heads`); no router parameters exist. Training draws afresh per
  token every step; eval draws one head per *position*, shared by the rows, so a sequence's eval
  output depends neither on the rest of the batch nor on how far it is padded.
* **Padded queries** read their routed head like any query, then are multiplied by 0: their output
  is zero and they send no gradient anywhere.

Computation: one path, static shapes, no host read in forward or backward, ``torch.compile``
with ``fullgraph=True`` (tests compare it with the plain formulas of eqs. 6-9 in float64).
:meth:`AdaMRAAttention.forward_input` (through the shell) and :meth:`AdaMRAAttention.forward` (the
reference, on given ``q, k, v``) both run :meth:`AdaMRAAttention._attend`; they differ only in the
affine maps they hand it: the shell's projections ``[W | b]``, or the identity on the three thirds
of ``[q, k, v]``. Eq. 9's maps are composed with those (``[3, H, d, d_in + 1]``, one matmul of
parameters per call), and each query is read in its routed head alone:

1. *Router* (eq. 6): ``X (W^Q W)`` (composed the same way), softmax and argmax per token.
2. *Groups in tiles* (:meth:`AdaMRAAttention._tiles`). A query's group is its routed head and
   batch row, ``g = h B + row``. The queries of each group are laid out in consecutive tiles of
   ``tile`` (64) slots, the last one partly empty, in a static number of tiles ``B N / tile +
   H B`` (at most ``H B (tile - 1)`` empty slots: 1.25x the queries at Table 2's N 1K, batch 16,
   1.06x at N 4K, batch 4). The layout costs a stable sort, a count per group (``scatter_add``), a
   cumulative sum and gathers of integers on the device: static shapes, no host read.
3. *Queries, one matmul.* Each tile's tokens ``[X, 1]`` times its head's composed map ``[W^Q W^Q_h;
   b^Q W^Q_h]``, ``[tiles, tile, d]``: ``O(n d_in d)``, what one head costs.
4. *Landmarks, nested.* Masked segment sums carry their token count as an extra column; a coarse
   level is summed from the finest level whose size divides it (1/2, 1/8, 1/32 nest). One division
   gives the means and, in the count column, 1 for a landmark and 0 for an empty window, so the
   affine maps fold in (``[m, 1] [W; b] = m W + b``) and an empty window contributes nothing with
   no mask of its own.
5. *Memories.* Keys ``phi(L W^K_h)``, ``phi(K~)^T L`` and the value maps with a unit row appended
   (``[W^V_h | b^V_h ; e]``) give every (head, row)'s eq. 7 state ``[phi(K~)^T V~ | phi(K~)^T 1]``
   of each subhead, without building the values. The states of a (head, row) are laid out
   block-diagonally over the subheads, ``[H B, d, S (Dh + 1)]``, so that one matmul reads all of a
   query's subheads (``S`` times the read's flops: 2x with the default backbone's two heads, and
   no copy of the features per subhead). Device choice (``Mixer.on_cpu``, made at construction):
   on an accelerator the landmarks of all heads are zero-padded to the finest head's count and
   stacked, ``[H, B, m_1, d_in + 1]`` (zero rows add nothing), so each step is one launch for all
   heads; on CPU each head runs at its own size (fewer flops, ``H`` launches).
6. *Read.* Each tile reads its group's state, ``[tiles, tile, d] x [tiles, d, S (Dh + 1)]``, and
   each token takes its slot back. :meth:`AdaMRAAttention._normalise` divides by the normaliser
   and applies the straight-through gate. A padded query's output is multiplied by 0: output 0,
   no gradient.

The softmax ablation reads, in each tile, the stacked keys and values of step 5 (always padded
and stacked) of the tile's head with a key bias (zero-padded rows and empty windows are masked).

Cost: ``O(n d_in d)`` for the query projection and ``O(n d S (Dh + 1))`` for the read, plus the
empty slots. The memories cost ``O(sum_h m_h d_in d)`` on CPU and ``O(H m_1 d_in d)`` on an
accelerator (``m_1 = n c_1``, the finest head's landmarks; the zero padding costs ``H m_1 / sum_h
m_h``: 2.1x for (1/2, 1/4, 1/8, 1/16), 2.3x for the default rates), the compression ``O(n d_in)``.
Measured (issue 62; ``python -m lra.bench --protocol dispatches --variants linear,adamra_t2a``): a
training step at Table 2's shapes, on the accelerator branch, dispatches 1.62x linear attention's
operators (775 against 477). The target of 1.3x is not met: the router, eq. 9's per-head maps
composed with the shell's, the multi-resolution landmarks (one window sum and one zero-pad per
head), the grouping (about 20 integer operators per layer) and the normaliser with its
straight-through gate are operators that linear attention does not have. The previous layout (every
query projected and read in every head, the routed one kept by a large negative on the others'
features: 1.62x) did ``H`` times this read's query work, and on one CPU thread at N 4096 took 2.0x
linear attention's time for a layer's forward and backward, against 1.35x for the grouped read.
"""
from __future__ import annotations

import contextlib
import math
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention.base import Mixer, require_positive
from attention.masking import key_bias, pad_to_multiple
from attention.padding import Padding
from attention.spec import Grid, Knob, Range, Spec, cap

FEATURE_MAPS = ("relu", "elu", "softmax")
ROUTERS = ("learned", "random")


def landmark_maps(a: Tensor, w: Tensor) -> Tensor:
    """Landmarks ``a [h, B, m, D + 1]`` through each head's affine maps ``w [h or 1, d, D + 1]``:
    ``[h B, m, d]``, one matmul batched over the heads."""
    h, b, m, c = a.shape
    return torch.bmm(a.view(h, b * m, c), w.transpose(-1, -2).expand(h, -1, -1)).view(h * b, m, -1)


def window_sums(t: Tensor, size: int, dim: int) -> Tensor:
    """Sums of consecutive windows of ``size`` along ``dim`` (zero-padded: the last is ragged)."""
    t = pad_to_multiple(t, size, dim=dim)
    return t.unflatten(dim, (-1, size)).sum(dim + 1)


class AdaMRAAttention(Mixer):
    spec = Spec(
        grid=Grid({"rates": ((0.5, 0.125, 0.03125), (1.0,), (0.6, 0.35), (0.25, 1.0, 0.5), (0.1,)),
                   "feature_map": ("relu", "elu", "softmax"), "router": ("learned", "random"),
                   "head_proj": (True, False), "eps": (1e-6, 0.5)},
                  size="rates", unit=lambda r: cap(max(max(1, round(1 / c)) for c in r["rates"]), most=8),
                  extra={"path": ("mixer", "shell")}),       # forward on q, k, v or the fused shell path
        ranges={"rates": Range("rates", 0.0, 1.0, low_open=True, draw=(0.02, 1.0), rejects=([0.0], [1.5], [])),
                "eps": Range("float", 0.0, low_open=True, draw=(1e-9, 1.0))},
        # the budget: every head's compression rate c_h times the factor (capped at 1 = full resolution)
        knobs=(Knob("rates x", (0.25, 0.5, 1.0, 2.0, 4.0), default=1.0,
                    to_overrides=lambda f, cfg: {"rates": [min(1.0, float(r) * f) for r in cfg["rates"]]}),),
        draws=lambda s: s["router"] == "random", small={}, representative="adamra_random_router",
        precision={"flips": 0.03},   # argmax router: flipped rows measured 0.9% (adamra), 0.5% (elu, softmax)
        configs={"adamra_random_router": {"precision": {"tol": (3e-2, 0.1)}},   # segment means + ReLU: grad of k 6.9e-2
                 "adamra_t2a": {"precision": {}}, "adamra_t2b": {"precision": {}}},
        documented=lambda m, o, heads, max_len: [
            ("rates", m.rates, [float(r) for r in o["rates"]]),
            ("segment_sizes", m.segment_sizes, [max(1, round(1 / r)) for r in o["rates"]]),
            *((k, getattr(m, k), o[k]) for k in ("feature_map", "router", "eps")),
            ("learned router", m.route is not None, o["router"] == "learned"),
            ("head_proj", m.head_weight is not None, o["head_proj"])])
    fuses_projections = True  # see forward_input
    tile = 64  # query slots per tile of the grouped read (_tiles); tests set a smaller one on an instance

    def __init__(
        self,
        n_heads: int,
        head_dim: int,
        max_len: int,
        layer_idx: int = 0,
        rates: Sequence[float] = (0.5, 0.125, 0.03125),
        feature_map: str = "relu",
        router: str = "learned",
        head_proj: bool = True,
        eps: float = 1e-6,
    ) -> None:
        super().__init__(n_heads, head_dim, max_len, layer_idx)
        rates = [float(r) for r in rates]
        if not rates or any(not 0.0 < r <= 1.0 for r in rates):
            raise ValueError(f"adamra rates={rates} must be a non-empty list of compression rates in (0, 1]")
        if feature_map not in FEATURE_MAPS:
            raise ValueError(f"adamra feature_map={feature_map!r}; valid: {', '.join(FEATURE_MAPS)}")
        if router not in ROUTERS:
            raise ValueError(f"adamra router={router!r}; valid: {', '.join(ROUTERS)}")
        require_positive(eps=eps, hint="the floor of eq. 7's normaliser: 0 gives NaN rows")
        self.rates = rates
        self.segment_sizes = [max(1, round(1.0 / r)) for r in rates]
        self.n_routed = len(rates)
        self.feature_map = feature_map
        self.router = router
        self.eps = eps
        d = n_heads * head_dim
        self.route = nn.Linear(d, self.n_routed, bias=False) if router == "learned" else None
        if head_proj:
            eye = torch.eye(d).expand(self.n_routed, 3, d, d).clone()
            self.head_weight = nn.Parameter(eye)  # [H, (q, k, v), d_in, d_out], identity at init
        else:
            self.register_parameter("head_weight", None)

    def random_heads(self, mask: Tensor) -> Tensor:
        """The random router's head per query ``[B, N]`` (:meth:`Mixer.randint`): fresh per token in
        training; in eval one draw per position (one table of ``max(N, max_len)`` draws from the
        eval seed), the same for every row, so a sequence's eval output does not depend on the rest
        of the batch. Draws are position-major over ``max(N, max_len)`` positions and cut to ``N``,
        so a longer padding only appends draws and never changes a real token's."""
        b, n = mask.shape
        rows = b if self.training else 1
        table = self.randint(self.n_routed, (max(n, self.max_len), rows), mask.device)
        return table[:n].T.expand(b, n)

    def _phi(self, t: Tensor) -> Tensor:
        return F.relu(t) if self.feature_map == "relu" else F.elu(t) + 1.0

    def forward(self, q: Tensor, k: Tensor, v: Tensor, pad: Padding, x: Tensor) -> Tensor:
        b, s, n, dh = q.shape
        d = s * dh
        t = torch.cat([u.transpose(1, 2).reshape(b, n, d) for u in (q, k, v)], -1)   # [B, N, 3 d]
        # the shell's maps: the identity on the three thirds of [q, k, v], no bias
        maps = torch.eye(3 * d, 3 * d + 1, dtype=q.dtype, device=q.device).view(3, d, 3 * d + 1)
        return self._attend(t, pad, maps)

    def forward_input(self, x: Tensor, pad: Padding, q_proj: nn.Linear, k_proj: nn.Linear, v_proj: nn.Linear) -> Tensor:
        """``forward`` on the shell's projections, with every linear map applied where it is cheapest.

        AdaMRA only ever uses linear images of the shell's ``Q, K, V``: router logits ``Q W``,
        queries ``Q W^Q_h``, segment means of ``K`` and ``V`` times ``W^{K,V}_h``. So it never
        projects every token: ``X`` is compressed once and the composed maps ``W^K W^K_h`` (with
        ``b^K W^K_h``) act on the means, and the queries and the router read ``X`` through the
        composed ``W^Q W^Q_h`` and ``W^Q W``. Same function and parameters as ``forward`` (tests
        check values and gradients); it saves the three ``n d^2`` projections of the shell."""
        projs = (q_proj, k_proj, v_proj)
        maps = torch.stack([p.weight for p in projs])                             # [3, d, d_in]
        if q_proj.bias is None:
            maps = F.pad(maps, (0, 1))
        else:
            maps = torch.cat([maps, torch.stack([p.bias for p in projs]).unsqueeze(-1)], -1)
        return self._attend(x, pad, maps)

    def _compressed(self, t: Tensor, mask: Tensor, padded: bool) -> list[Tensor]:
        """Per AdaMRA head ``[B, m_h, D + 1]``: masked segment sums of ``t [B, N, D]`` and, in the
        last column, the number of real tokens of the window. Coarse windows are summed from finer
        ones when the sizes nest (1/2, 1/8, 1/32 do), so each extra head is cheap. ``padded =
        False`` skips masking ``t``."""
        w = mask.to(t.dtype)[..., None]
        levels = {1: torch.cat([t * w if padded else t, w], -1)}        # sums and counts together
        for size in sorted(set(self.segment_sizes)):
            base = max(p for p in levels if size % p == 0)
            levels[size] = window_sums(levels[base], size // base, 1)
        return [levels[z] for z in self.segment_sizes]

    def _tiles(self, choice: Tensor, n: int) -> tuple[Tensor, Tensor, Tensor]:
        """The queries of each group ``g = h B + row`` (a routed head and a batch row) in consecutive
        tiles of ``tile`` slots, in a static number of tiles ``B N // tile + H B`` (a group's last
        tile is partly empty). Returns the token of each slot ``[tiles, tile]`` (an empty slot holds
        token 0; its result is never read), each tile's group ``[tiles]`` and each token's slot
        ``[B N]``. Integer operators on the device: two sorts, a ``scatter_add``, no host read."""
        bn, groups, size, dev = choice.shape[0], choice.shape[0] // n * self.n_routed, self.tile, choice.device
        i = torch.arange(bn, device=dev)
        group = choice * (bn // n) + i.div(n, rounding_mode="floor")
        order = torch.argsort(group, stable=True)
        count = group.new_zeros(groups).scatter_add_(0, group, torch.ones_like(group))
        # a token's slot: its rank in the sorted order plus the empty slots of the groups before its own
        empty = torch.remainder(-count, size)                                # of each group's last tile
        slot = (empty.cumsum(0) - empty)[group] + torch.argsort(order)
        token = i.new_zeros((bn // size + groups) * size).scatter_(0, slot, i).view(-1, size)
        return token, group[token[:, 0]], slot     # a tile's first slot is its group's (unused tiles: token 0's)

    def _attend(self, t: Tensor, pad: Padding, maps: Tensor) -> Tensor:
        """Eqs. 6-9 for every query of ``t [B, N, D]``, whose queries, keys and values are the shell's
        affine maps of ``t`` before eq. 9, ``maps [3 (q, k, v), d, D + 1]`` (``nn.Linear``'s weight
        with the bias as its last column). Returns ``[B, S, N, Dh]`` (see the module's Computation)."""
        mask = pad.mask
        b, n = mask.shape
        hs, s, dh = self.n_routed, self.n_heads, self.head_dim
        rows = F.pad(t.flatten(0, 1), (0, 1), value=1.0)                   # [B N, D + 1]: the maps' inputs
        # eq. 9 composed with the shell's maps, one matmul per role: [3 (q, k, v), H or 1, d, D + 1]
        if self.head_weight is None:
            heads = maps[:, None]
        else:
            w = self.head_weight.permute(1, 0, 3, 2).reshape(3, hs * s * dh, s * dh)
            heads = torch.bmm(w, maps).view(3, hs, s * dh, -1)
        if self.route is not None:                                          # eq. 6
            p_sel, choice = torch.softmax(torch.mm(rows, (self.route.weight @ maps[0]).t()), -1).max(-1)
        else:
            choice, p_sel = self.random_heads(mask).reshape(-1), None
        token, tile_group, slot = self._tiles(choice, n)
        tile_head = tile_group // b if self.head_weight is not None else torch.zeros_like(tile_group)
        # each tile's queries in its head's subspaces, one batched matmul: [tiles, tile, d]
        queries = torch.bmm(rows[token], heads[0].transpose(-1, -2)[tile_head])
        # landmarks per head [B, m_h, D + 1]; on an accelerator zero-padded to the finest head's count
        # and stacked, [H, B, m_1, D + 1] (one matmul per step for all heads); on CPU at their sizes
        lm, wk, wv = self._compressed(t, mask, pad.any), heads[1], heads[2]   # maps [H or 1, d, D + 1]
        per_head = self.on_cpu and self.feature_map != "softmax"
        if not per_head:
            m = max(a.shape[1] for a in lm)
            lm, wks = [torch.stack([a if a.shape[1] == m else F.pad(a, (0, 0, 0, m - a.shape[1])) for a in lm])], [wk]
        else:
            lm, wks = [a[None] for a in lm], wk.expand(hs, -1, -1).split(1)
        lm = [a / a[..., -1:].detach().clamp_min(1.0) for a in lm]   # means; count column: 1 landmark, 0 none
        if self.feature_map == "softmax":
            keys, values = (landmark_maps(lm[0], w)[tile_group] for w in (wk, wv))
            out = self._softmax_read(queries, keys, values, lm[0][..., -1].flatten(0, 1)[tile_group] > 0)
        else:
            wide = self._wide(rows)
            with torch.autocast(rows.device.type, enabled=False) if wide else contextlib.nullcontext():
                if wide:
                    queries, wv = queries.float(), wv.float()
                    lm, wks = [a.float() for a in lm], [w.float() for w in wks]
                # phi(K~)^T [M~ | 1] of every (head, row): [H B, d, D + 1]
                kvz = torch.cat([torch.bmm(self._phi(landmark_maps(a, w)).transpose(1, 2), a.flatten(0, 1))
                                 for a, w in zip(lm, wks)])
                # value maps of every subhead, each with a unit row for the normaliser: [H or 1, S (Dh + 1), D + 1]
                wv = wv.unflatten(-2, (s, dh))
                unit = F.pad(wv.new_ones(1, 1), (wv.shape[-1] - 1, 0))     # [0 ... 0 1]: picks the count
                wv = torch.cat([wv, unit.expand(*wv.shape[:-2], 1, -1)], -2).flatten(1, 2)
                # eq. 7's memory of every (head, row) and subhead, block-diagonal over the subheads so
                # that one matmul reads all of a query's subheads: [H B, d, S (Dh + 1)]
                state = torch.bmm(kvz.view(hs, -1, kvz.shape[-1]), wv.transpose(-1, -2).expand(hs, -1, -1))
                blocks = torch.eye(s, dtype=state.dtype, device=state.device).view(s, 1, s, 1)
                state = (state.view(-1, s, dh, s, dh + 1) * blocks).view(-1, s * dh, s * (dh + 1))
                # each tile's queries read their group's state: [tiles, tile, S (Dh + 1)]
                out = torch.bmm(self._phi(queries), state[tile_group])
        out = out.flatten(0, 1)[slot].view(b, n, s, -1)                     # back to tokens: [B, N, S, width]
        out = self._normalise(out, None if p_sel is None else p_sel.view(b, n, 1, 1))
        if pad.any:                                                         # a padded query: output 0, no gradient
            out = out * mask.view(b, n, 1, 1).to(out.dtype)
        out = out.transpose(1, 2)
        return out.to(t.dtype) if out.dtype != t.dtype else out

    def _softmax_read(self, queries: Tensor, keys: Tensor, values: Tensor, valid: Tensor) -> Tensor:
        """Table 5's softmax ablation: exact softmax over the valid landmarks of each tile's head,
        with ``1/sqrt(d_k)``. ``queries [tiles, tile, d]``, ``keys``/``values [tiles, m_1, d]``,
        ``valid [tiles, m_1]``; returns ``[tiles, tile, S Dh]``."""
        split = lambda t: t.unflatten(-1, (self.n_heads, self.head_dim)).transpose(1, 2)  # noqa: E731
        bias = key_bias(valid, queries.dtype)
        scores = split(queries) @ split(keys).transpose(-1, -2) / math.sqrt(self.head_dim) + bias
        return (torch.softmax(scores, -1) @ split(values)).transpose(1, 2).flatten(2)

    def _wide(self, rows: Tensor) -> bool:
        """Whether the kernel read and its normalisation run in float32: in float16
        (``trainer.precision=16-mixed`` or a half model) ``1 / eps`` exceeds the range, so the
        gradient that the clamp sends to the numerator of a query with a zero normaliser would be
        infinite (and NaN once multiplied by its zero features). A padded query (it reads no head)
        has a zero normaliser under either map, a ReLU query that misses every landmark also."""
        dev = rows.device.type
        return self.feature_map != "softmax" and torch.float16 in (
            rows.dtype, torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else None)

    def _normalise(self, out: Tensor, p_sel: Tensor | None) -> Tensor:
        """Eq. 7's normaliser (the last column of a kernel read) and the router gradient,
        straight-through: the routed head's output times ``P_{i,h*} / stopgrad(P_{i,h*})``, which is
        exactly 1 in value (so the oracle tests of eq. 7 hold exactly). It multiplies the per-query
        factor 1 / normaliser, not the output. ``p_sel`` broadcasts against ``out`` (None: the
        random router, no gradient). A padded query read nothing (numerator and normaliser 0), so
        the clamp gives it a zero output and no gradient.

        The backward pass gives the router ``(G_i . out_i) * grad log P_{i,h*}`` (``G_i`` the output
        gradient): the Switch/MoE gate gradient of ``P_{i,h*} * out_i``, ``(G_i . out_i) * grad
        P_{i,h*}``, divided by ``P_{i,h*}`` (a factor between 1 and ``H``, since the routed head has
        the largest probability). ``dL/dW`` pushes up the probability of the chosen head when
        scaling its output up would lower the loss and down when it would raise it. Scaling the
        forward output by ``P`` as Switch does would shrink every output by up to ``1/H`` and break
        the equivalence with eq. 7; the paper gives no formula to follow."""
        scale = None
        if p_sel is not None:
            scale = p_sel / p_sel.detach()
        if self.feature_map != "softmax":
            out, den = out.split([self.head_dim, 1], dim=-1)
            scale = (1.0 if scale is None else scale) / den.clamp_min(self.eps)
        return out if scale is None else out * scale
