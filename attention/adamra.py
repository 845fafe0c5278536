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

Computation: every step is exact (tests compare it with the plain formulas in float64). Through
the shell AdaMRA runs :meth:`AdaMRAAttention.forward_input` (the shell's projections composed with
eq. 9's and applied where cheapest); :meth:`AdaMRAAttention.forward` on given ``q, k, v`` is the
reference. Queries are dispatched to their heads by :meth:`AdaMRAAttention._attend` (ragged groups,
one host sync) or, graph-safe, :meth:`AdaMRAAttention._attend_dense` (static shapes, every head
read). Cost: ``O(n d^2)`` for the query projections (each query once), ``O(n d_k^2)`` for the kernel
part, ``O(m_h d^2)`` per head for the compressed keys and values, ``O(n d)`` for the compression.
"""
from __future__ import annotations

import contextlib
import math
from typing import Callable, NamedTuple, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention.base import Mixer, require_positive
from attention.graph_safe import graph_safe_active
from attention.masking import key_bias, pad_to_multiple
from attention.padding import Padding
from attention.spec import Grid, Knob, Range, Spec, cap

FEATURE_MAPS = ("relu", "elu", "softmax")
ROUTERS = ("learned", "random")


def window_sums(t: Tensor, size: int, dim: int) -> Tensor:
    """Sums of consecutive windows of ``size`` along ``dim`` (zero-padded: the last is ragged)."""
    t = pad_to_multiple(t, size, dim=dim)
    return t.unflatten(dim, (-1, size)).sum(dim + 1)


class Routing(NamedTuple):
    order: Tensor | None          # [B * N] flat query indices grouped by (head, row), padded last
    counts: list[int] | None      # group sizes, H * B + 1 (the last: padded queries)
    p_sel: Tensor | None          # [B * N] router probability of the chosen head (learned router)
    choice: Tensor | None = None  # graph-safe mode (order, counts None): the head per query [B, N]
    maybe_padded: bool = True     # graph-safe mode: Padding.any

    @property
    def padded(self) -> bool:
        return self.counts[-1] > 0 if self.counts is not None else self.maybe_padded


class Memory(NamedTuple):
    """One AdaMRA head's compressed memory: projected landmark keys ``[B, m_h, d]``, the landmark
    means ``[B, m_h, d_in]`` that the affine ``value_weight [d_in, d]``, ``value_bias [d]``
    (eq. 9's ``W^V_h``, composed with the shell's ``W^V`` on the fused path) maps to the values,
    and landmark validity ``[B, m_h]``."""

    keys: Tensor
    value_means: Tensor
    value_weight: Tensor
    value_bias: Tensor | None
    valid: Tensor

    def float(self) -> "Memory":
        """The same memory in float32."""
        return Memory(*(t.float() if t is not None and t.is_floating_point() else t for t in self))

    def values(self) -> Tensor:
        v = self.value_means @ self.value_weight
        return v if self.value_bias is None else v + self.value_bias

    def kernel_state(self, phi: Callable[[Tensor], Tensor], s: int) -> Tensor:
        """Eq. 7's memory per subhead, ``[B, S, Dh, Dh + 1]``: ``sum_j phi(k~_j) [v~_j^T, 1]``.

        The value map is applied after the sum over landmarks, ``sum_j phi(k~_j) (m_j W + b)^T =
        (sum_j phi(k~_j) m_j^T) W + (sum_j phi(k~_j)) b^T``: the same numbers without building the
        ``[B, m_h, d]`` values, and without the ``m_h d Dh`` product that reading them would cost."""
        fk = phi(self.keys) * self.valid[..., None].to(self.keys.dtype)      # [B, m_h, d]
        b, _, d = fk.shape
        dh = d // s
        z = fk.sum(1).view(b, s, dh, 1)                                       # sum_j phi(k~_j)
        kv = (fk.transpose(1, 2) @ self.value_means).view(b, s, dh, -1)      # [B, S, Dh, d_in]
        kv = kv @ self.value_weight.view(-1, s, dh).transpose(0, 1)          # [B, S, Dh, Dh]
        if self.value_bias is not None:
            kv = kv + z * self.value_bias.view(s, 1, dh)
        return torch.cat([kv, z], dim=-1)


def _affine(t: Tensor, w: Tensor | None, bias: Tensor | None) -> Tensor:
    """``t w + bias`` of rows ``t [M, d_in]`` (a query map of :meth:`AdaMRAAttention._head_map`);
    ``w = None`` is the identity."""
    if w is None:
        return t
    return t @ w if bias is None else torch.addmm(bias, t, w)


def _float32_matmul(a: Tensor, b: Tensor) -> Tensor:
    """``a @ b`` of float32 tensors, in float32 whatever autocast is on."""
    with torch.autocast(a.device.type, enabled=False):
        return a @ b


class Permute(torch.autograd.Function):
    """``t[perm]`` along dim 0 for a permutation, whose backward is the inverse permutation (a
    gather, instead of the zero-fill and scatter-add of indexing's backward)."""

    @staticmethod
    def forward(ctx, t: Tensor, perm: Tensor, inverse: Tensor) -> Tensor:  # noqa: ANN001
        ctx.save_for_backward(inverse)
        return t.index_select(0, perm)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None, None]:  # noqa: ANN001
        (inverse,) = ctx.saved_tensors
        return grad.index_select(0, inverse), None, None


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
        """The random router's head per query ``[B, N]`` (:meth:`Mixer.randint`; graph-safe:
        ``floor(H u)`` of counter-based uniforms): fresh per token in training; in eval one draw per
        position (one table of ``max(N, max_len)`` draws from the eval seed), the same for every
        row, so a sequence's eval output does not depend on the rest of the batch. Draws are
        position-major over ``max(N, max_len)`` positions and cut to ``N``, so a longer padding only
        appends draws and never changes a real token's."""
        b, n = mask.shape
        rows = b if self.training else 1
        table = self.randint(self.n_routed, (max(n, self.max_len), rows), mask.device)
        return table[:n].T.expand(b, n)

    def _phi(self, t: Tensor) -> Tensor:
        return F.relu(t) if self.feature_map == "relu" else F.elu(t) + 1.0

    def _route(self, logits: Tensor | None, pad: Padding) -> Routing:
        """Eq. 6 and the grouping of real queries by (head, batch row); padded queries go last, to
        no head. ``logits``: ``F(Q) = QW`` transposed, ``[H, B * N]``, or None for the random router.

        ``order`` lists flat query indices by group (stable, so positions stay ascending); the group
        sizes come to the host (``H * B + 1`` ints: one ``.tolist()`` per call, the variant's only
        host sync, needed because the per-head shapes are ragged). They are counted on the device
        with ``scatter_add``: ``bincount`` would add two syncs of its own. Graph-safe mode groups
        nothing (:meth:`_attend_dense`); padding is then ``pad.any``."""
        mask = pad.mask
        b, n = mask.shape
        if logits is None:
            choice, p_sel = self.random_heads(mask), None
        else:  # heads on dim 0: the softmax and max over H run vectorised along the tokens
            p_sel, choice = torch.softmax(logits, dim=0).max(0)              # eq. 6
            choice = choice.view(b, n)
        if graph_safe_active():   # no grouping: _attend_dense selects each query's head in place
            return Routing(None, None, p_sel, choice, pad.any)
        groups = self.n_routed * b
        row = torch.arange(b, device=mask.device)[:, None]
        key = torch.where(mask, choice * b + row, groups).reshape(-1)
        order = torch.argsort(key, stable=True)
        counts = torch.zeros(groups + 1, dtype=torch.long, device=key.device).scatter_add_(0, key, torch.ones_like(key))
        return Routing(order, counts.tolist(), p_sel)                        # the one host sync

    def _compressed(self, t: Tensor, mask: Tensor, padded: bool) -> list[tuple[Tensor, Tensor]]:
        """Per AdaMRA head: masked segment means of ``t`` (``[B, N, D] -> [B, m_h, D]``) and landmark
        validity ``[B, m_h]``. Coarse windows are summed from finer ones when the sizes nest (1/2,
        1/8, 1/32 do), so each extra head is cheap. ``padded = False`` skips masking ``t``."""
        w = mask.to(t.dtype)
        levels = {1: (t * w[..., None] if padded else t, w)}
        for size in sorted(set(self.segment_sizes)):
            base = max(p for p in levels if size % p == 0)
            sums, cnt = levels[base]
            levels[size] = (window_sums(sums, size // base, 1), window_sums(cnt, size // base, 1))
        return [(levels[z][0] / levels[z][1].clamp_min(1.0)[..., None], levels[z][1] > 0) for z in self.segment_sizes]

    def _head_map(self, w: Tensor | None, bias: Tensor | None, h: int, role: int) -> tuple[Tensor | None, Tensor | None]:
        """The affine map ``t -> t w + bias`` followed by head ``h``'s eq. 9 projection of ``role``
        (0 q, 1 k, 2 v), as one map; ``w = None`` is the identity."""
        if self.head_weight is None:
            return w, bias
        hw = self.head_weight[h, role]
        return (hw if w is None else w @ hw), (None if bias is None else bias @ hw)

    def _split(self, t: Tensor) -> Tensor:
        """``[B, M, S * Dh] -> [B, S, M, Dh]`` (a view)."""
        return t.unflatten(-1, (self.n_heads, self.head_dim)).transpose(1, 2)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, pad: Padding, x: Tensor) -> Tensor:
        mask = pad.mask
        b, s, n, dh = q.shape
        # [B, S, N, Dh] -> [B, N, S * Dh]: a free view for the shell's tensors (they are head splits)
        full = lambda t: t.transpose(1, 2).reshape(b, n, s * dh)  # noqa: E731
        q_full = full(q)
        q_flat = q_full.reshape(b * n, s * dh)
        routing = self._route(None if self.route is None else self.route.weight @ q_flat.t(), pad)
        mems = []
        for h, (kv, valid) in enumerate(self._compressed(torch.cat([full(k), full(v)], -1), mask, routing.padded)):
            (wk, _), (wv, _) = self._head_map(None, None, h, 1), self._head_map(None, None, h, 2)
            kbar, vbar = kv.chunk(2, dim=-1)   # compress first: means and linear maps commute
            eye = torch.eye(s * dh, dtype=kbar.dtype, device=kbar.device)
            mems.append(Memory(kbar if wk is None else kbar @ wk, vbar, eye if wv is None else wv, None, valid))
        q_maps = [self._head_map(None, None, h, 0) for h in range(self.n_routed)]
        return self._attend(q_flat, q_maps, mems, routing, mask)

    def forward_input(self, x: Tensor, pad: Padding, q_proj: nn.Linear, k_proj: nn.Linear, v_proj: nn.Linear) -> Tensor:
        """``forward`` on the shell's projections, with every linear map applied where it is cheapest.

        AdaMRA only ever uses linear images of the shell's ``Q, K, V``: router logits ``Q W``,
        routed queries ``Q W^Q_h``, segment means of ``K`` and ``V`` times ``W^{K,V}_h``. So it never
        projects every token: ``X`` is compressed once and the composed maps ``W^K W^K_h`` (with
        ``b^K W^K_h``) act on the ``m_h`` means, each query is projected by ``W^Q W^Q_h`` in its
        routed head only, and the router reads ``X (W^Q W)``. Same function and parameters as
        ``forward`` (tests check values and gradients); it saves the three ``n d^2`` projections."""
        mask = pad.mask
        b, n, _ = x.shape
        rows, bq = x.reshape(b * n, -1), q_proj.bias
        logits = None
        if self.route is not None:
            w = self.route.weight @ q_proj.weight
            logits = w @ rows.t() if bq is None else torch.addmm((self.route.weight @ bq)[:, None], w, rows.t())
        routing = self._route(logits, pad)
        mems = []
        for h, (xbar, valid) in enumerate(self._compressed(x, mask, routing.padded)):
            wk, bk = self._head_map(k_proj.weight.t(), k_proj.bias, h, 1)
            wv, bv = self._head_map(v_proj.weight.t(), v_proj.bias, h, 2)
            keys = (xbar @ wk if bk is None else torch.addmm(bk, xbar.flatten(0, 1), wk).view(b, -1, wk.shape[-1]))
            mems.append(Memory(keys, xbar, wv, bv, valid))
        q_maps = [self._head_map(q_proj.weight.t(), bq, h, 0) for h in range(self.n_routed)]
        return self._attend(rows, q_maps, mems, routing, mask)

    def _attend(
        self, rows: Tensor, q_maps: list[tuple[Tensor | None, Tensor | None]],
        mems: list[Memory], routing: Routing, mask: Tensor,
    ) -> Tensor:
        """Eq. 7 for every routed query. ``rows``: ``[B * N, d_in]`` that ``q_maps[h]`` (affine,
        None = identity) maps to head ``h``'s queries; ``mems[h]`` is head ``h``'s compressed memory.
        Returns ``[B, S, N, Dh]``.

        One stable sort (:meth:`_route`) groups the real queries by (head, batch row); padded
        queries join no head and output zero. The rows are permuted once into those groups; each
        group is one contiguous slice, projected by its head's ``q_maps[h]`` (each query once, in
        its routed head), that reads its row's memory ``[phi(K~)^T V~ | phi(K~)^T 1]`` (numerator
        and normaliser, :meth:`_head_read`) with one batched (over subheads) product, with no
        padding and no scatter; one inverse permutation restores sequence order. Both
        permutations are gathers (:class:`Permute`). The loop runs over the ``H * B`` groups
        (never over tokens). The router's straight-through factor multiplies the per-query
        ``1 / normaliser``, not the output (:meth:`_normalise`)."""
        if routing.counts is None:
            return self._attend_dense(rows, q_maps, mems, routing, mask)
        b, n = mask.shape
        s, dh = self.n_heads, self.head_dim
        order, counts = routing.order, routing.counts
        inverse = torch.empty_like(order).scatter_(0, order, torch.arange(b * n, device=mask.device))
        per_head = [sum(counts[h * b:(h + 1) * b]) for h in range(self.n_routed)] + [counts[-1]]
        grouped = Permute.apply(rows, order, inverse).split(per_head)         # rows by (head, row)
        width = dh if self.feature_map == "softmax" else dh + 1              # + 1: eq. 7's normaliser
        wide = self._wide(rows)
        outs = []
        for h, (mem, (wq, bq)) in enumerate(zip(mems, q_maps)):
            if per_head[h] == 0:
                continue
            qg = _affine(grouped[h], wq, bq)                                 # routed queries only, eq. 9
            qg, read = self._head_read(qg.view(-1, s, dh).transpose(0, 1), mem, wide)   # [S, c_h, Dh]
            for i, q_row in enumerate(qg.split(counts[h * b:(h + 1) * b], dim=1)):
                if q_row.shape[1]:
                    outs.append(read(q_row, i).transpose(0, 1))              # [c_(h,i), S, width]
        outs.append(rows.new_zeros(counts[-1], s, width))                    # padded queries
        out = torch.cat(outs)                                                # [B * N, S, width], grouped
        p_sel = None if routing.p_sel is None else routing.p_sel.index_select(0, order)[:, None, None]
        out = self._normalise(out, p_sel)
        if wide:
            out = out.to(rows.dtype)             # a weighted mean of values: float16 holds it
        out = Permute.apply(out, inverse, order)
        return out.view(b, n, s, dh).transpose(1, 2)                          # [B, S, N, Dh] view

    def _head_read(self, q: Tensor, mem: Memory, wide: bool) -> tuple[Tensor, Callable[[Tensor, int | slice], Tensor]]:
        """One head's read of its memory, shared by both dispatches: eq. 7's kernel read
        ``phi(q)^T [phi(K~)^T V~ | phi(K~)^T 1]`` (numerator and normaliser, ``width = Dh + 1``), or
        Table 5's softmax ablation, exact softmax over the valid landmarks with ``1/sqrt(d_k)``
        (``width = Dh``). The memory's state and the query features are built once per head.

        Returns the queries as the read takes them (``phi(q)`` for a kernel map) and ``read(part,
        i)``: queries ``part [..., S, M, Dh]`` against batch row ``i`` of the memory, ``[..., S, M,
        width]``; ``i = slice(None)`` reads every row ``[B, S, N, Dh]`` against its own. ``wide``
        (:meth:`_wide`): the kernel state, the features and the read in float32."""
        dh = self.head_dim
        if self.feature_map == "softmax":
            kc, vc, bias = self._split(mem.keys), self._split(mem.values()), key_bias(mem.valid, q.dtype)
            return q, lambda part, i: torch.softmax(part @ kc[i].transpose(-1, -2) / math.sqrt(dh) + bias[i], -1) @ vc[i]
        with torch.autocast(q.device.type, enabled=False) if wide else contextlib.nullcontext():
            kvz = (mem.float() if wide else mem).kernel_state(self._phi, self.n_heads)   # [B, S, Dh, Dh + 1]
            fq = self._phi(q.float() if wide else q)
        return fq, lambda part, i: part @ kvz[i] if not wide else _float32_matmul(part, kvz[i])

    def _wide(self, rows: Tensor) -> bool:
        """Whether the ReLU read and its normalisation run in float32: in float16
        (``trainer.precision=16-mixed`` or a half model) ``1 / eps`` exceeds the range, so the
        gradient that the clamp sends to the numerator of a query with a zero normaliser would be
        infinite (and NaN once multiplied by its zero features)."""
        dev = rows.device.type
        return self.feature_map == "relu" and torch.float16 in (
            rows.dtype, torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else None)

    def _normalise(self, out: Tensor, p_sel: Tensor | None) -> Tensor:
        """Eq. 7's normaliser (the last column of a kernel read) and the router gradient,
        straight-through: the routed head's output times ``P_{i,h*} / stopgrad(P_{i,h*})``, which is
        exactly 1 in value (so the oracle tests of eq. 7 hold exactly). It multiplies the per-query
        factor 1 / normaliser, not the output. ``p_sel`` broadcasts against ``out`` (None: the
        random router, no gradient).

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

    def _attend_dense(
        self, rows: Tensor, q_maps: list[tuple[Tensor | None, Tensor | None]],
        mems: list[Memory], routing: Routing, mask: Tensor,
    ) -> Tensor:
        """:meth:`_attend` with static shapes (graph-safe mode: ``torch.compile``, no host read),
        which cannot have the dispatch's ragged group sizes, so it uses their static bound: every
        head's capacity is all ``B * N`` queries. Each query is projected into every head and reads
        every head's memory of its row (``[B, S, N, Dh (+1)]`` per head, no permutation), and
        ``torch.where`` on ``choice == h`` (and the mask: padded queries join no head and output
        zero) keeps the routed head's read; the straight-through scale and the normaliser then act
        as in :meth:`_attend`. The values (and gradients: a non-routed read gets zero gradient) are
        the dispatched ones up to float rounding; the cost is ``H`` times the query projections and
        kernel reads (``O(H n d^2)``)."""
        b, n = mask.shape
        wide = self._wide(rows)
        routed = routing.choice                                              # [B, N]
        out = None
        for h, (mem, (wq, bq)) in enumerate(zip(mems, q_maps)):
            qh = self._split(_affine(rows, wq, bq).view(b, n, -1))           # eq. 9: [B, S, N, Dh]
            qh, read = self._head_read(qh, mem, wide)
            here = ((routed == h) & mask)[:, None, :, None]
            out = torch.where(here, read(qh, slice(None)), 0.0 if out is None else out)   # [B, S, N, width]
        out = self._normalise(out, None if routing.p_sel is None else routing.p_sel.view(b, 1, n, 1))
        if wide:
            out = out.to(rows.dtype)
        return out
