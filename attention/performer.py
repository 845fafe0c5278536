"""Performer attention: FAVOR+ (Choromanski et al. 2021, "Rethinking Attention with Performers").

Softmax kernel by positive random features (Lemma 1 of the paper, section 2.3): with w_1..w_m
the rows of an orthogonal random matrix W (section 2.4) and x already scaled by d^-1/4,

    phi(x) = exp(W x - |x|^2 / 2) / sqrt(m),   so  E[phi(q)^T phi(k)] = exp(q^T k / sqrt(d)),

and attention is computed right-to-left (section 2.2, FAVOR+ bidirectional form)::

    out = D^-1 phi(Q) (phi(K)^T V),   D = diag(phi(Q) (phi(K)^T 1)).

The generalised kernel with f = ReLU (section 2.2, ``kernel: relu``) is
phi(x) = relu(W x) / sqrt(m) + eps; selecting it really switches the feature map (one port
silently kept the softmax one).

Choices the paper leaves open, written down:

* Scaling: q and k are each multiplied by d^-1/4 exactly once, inside the feature map
  (the shell does no scaling), so q^T k is scaled by 1/sqrt(d) as in softmax attention.
* Stabilisation (as in the authors' code): before exp, subtract a max that cancels in D^-1:
  per query row (max over features) and, for keys, ONE max per (sample, head) over real keys and
  features (a per-key shift would not cancel), taken over real keys only, so padded keys cannot
  change the shift. The shifts are detached: they are a numerical device that cancels exactly
  for eps -> 0, and the backward of a max costs ~5 extra passes over the [B, H, N, m] features
  (measured: ~25% of the layer's time at N=4096); the neglected gradient term is O(eps).
  eps = 1e-6 is added to every feature (softmax kernel), 1e-3 for the ReLU kernel (the authors'
  defaults); it is applied on the small side of the products (phi = e + c, so
  phi^T X = e^T X + c 1^T X), which saves two passes over the features.
* Padding: phi(K_j) = 0 at padded keys, so they enter neither phi(K)^T V nor the normaliser
  (zeroing V only, as one port did, would still count them in D). A sample with no real key has
  D = 0 and numerator 0; its normaliser is replaced by 1 so its output is 0, never NaN; so is the
  normaliser of a query whose ReLU features miss every key's (possible only with ``eps: 0``).
* Features: ``nb_features`` (m, default 256; the ``performer_32`` preset is the AdaMRA tables'
  Performer-32) rows in blocks of d exact orthogonal rows (QR of a Gaussian block, with the signs of
  diag(R) folded into Q so the directions are uniform: plain QR output is not), each row rescaled
  by the norm of an independent Gaussian d-vector so its marginal is Gaussian (the authors' default
  ``scaling=0``). One W per layer, shared by its heads (as in the authors' code). ``orthogonal:
  false`` gives i.i.d. Gaussian rows.
* ``scaling`` and ``padded_keys`` (defaults ``once`` and ``excluded``, the paper's model, above)
  switch on the two departures of the Nyströmformer authors' LRA Performer (their ``PerformerAttention``
  wrapper around performer-pytorch's ``FastAttention``, mlpen/Nystromformer), for the ablation
  ``conf/ablation/performer_port.yaml`` that tests whether they explain AdaMRA Table 1's Performer
  row (18.80 on ListOps, where this FAVOR+ learns):
  ``scaling: twice`` divides q and k by d^1/4 before the feature map does it again, so the kernel
  estimates exp(q.k / d) instead of exp(q.k / sqrt(d)); ``padded_keys: zero_keys`` makes padded keys
  zero vectors (the wrapper multiplies K and V by the mask) over the port's fixed width, the power of
  two at or above ``max_len`` (its ``run_tasks.py`` pads every batch to it: 2048 for ListOps), and a
  zero key's features exp(-shift) / sqrt(m) (+ eps) are positive: every one of them enters the
  normaliser and the key stabiliser (its projection, 0, takes part in the max). They are computed as
  one zero key weighted by their number, from the mask, so the output does not depend on the batch's
  own padded width (evaluation batches are cut). The port's other settings are the ablation's:
  256 features, eps 1e-4 (performer-pytorch's default), drawn once and never redrawn.
* Redrawing: W is a persistent buffer drawn from :meth:`Mixer.randn`; whether a training call
  redraws is decided on the device (a ``calls`` buffer and ``torch.where`` over a fresh draw made
  every training call), so one path serves eager and compiled runs with no host read. Only
  training forwards redraw it: on the first training call and then every ``redraw_interval`` training calls
  (``0`` = never redraw after the first draw); eval forwards use the stored W and never advance the
  counter, so eval is deterministic and equals what the last training step saw. The counter is
  checkpointed with the generator streams.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from attention.base import Mixer, require_non_negative, require_positive
from attention.masking import zero_padded
from attention.padding import Padding
from attention.spec import Grid, Knob, Peer, Range, Spec, int_range

KERNELS = ("softmax", "relu")
SCALINGS = ("once", "twice")
PADDED_KEYS = ("excluded", "zero_keys")


def orthogonal_gaussian(m: int, d: int, randn: Callable[[tuple[int, ...], torch.dtype], Tensor],
                        orthogonal: bool = True, dtype: torch.dtype = torch.float32) -> Tensor:
    """``[m, d]`` random features: orthogonal blocks of d rows with chi-distributed row norms.
    ``randn(shape, dtype)`` gives standard normal draws (a mixer's :meth:`Mixer.randn`)."""
    if not orthogonal:
        return randn((m, d), dtype)
    n_blocks = math.ceil(m / d)
    gauss = randn((n_blocks, d, d), torch.float32)
    qmat, r = torch.linalg.qr(gauss)                        # columns orthonormal
    # Sign fix: without it Householder QR biases the directions (e.g. a fixed sign of Q[0, 0]).
    qmat = qmat * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1)).unsqueeze(-2)
    rows = qmat.transpose(-1, -2).reshape(n_blocks * d, d)[:m]
    norms = randn((m, d), torch.float32).norm(dim=-1)
    return (rows * norms[:, None]).to(dtype)


class PerformerAttention(Mixer):
    spec = Spec(
        grid=Grid({"nb_features": (256, 32, 1, 3, 4, 5, 9), "kernel": ("softmax", "relu"),
                   "redraw_interval": (1000, 0, 1, 3), "orthogonal": (True, False), "eps": (None, 0.0, 1e-3)},
                  extra={"calls": (1, 2, 4)}),                                  # training calls before the compared one
        ranges={"nb_features": int_range(1, 12), "redraw_interval": int_range(0, 4),
                "eps": Range("float", 0.0, nullable=True, draw=(0.0, 1e-2))},
        knobs=(Knob("nb_features", (16, 32, 64, 128, 256, 512)),), draws=True, small={"nb_features": 16},
        documented=lambda m, o, heads, max_len: [
            *((k, getattr(m, k), o[k]) for k in ("nb_features", "kernel", "redraw_interval", "orthogonal")),
            ("eps", m.eps, o["eps"] if o["eps"] is not None else (1e-6 if o["kernel"] == "softmax" else 1e-3)),
            ("features", tuple(m.features.shape), (o["nb_features"], m.head_dim))],
        peers=(Peer("performer", "performer-pytorch SelfAttention", "performer-pytorch", "performer_pytorch",
                    "nb_features=256 softmax kernel", "peer_performer", "align_performer",
                    agree_overrides={"eps": 1e-4}),),
        configs={"performer_32": {"knobs": (Knob("nb_features", (16, 32, 64, 128, 256)),), "small": {}}})

    def __init__(
        self,
        n_heads: int,
        head_dim: int,
        max_len: int,
        layer_idx: int = 0,
        nb_features: int = 256,
        kernel: str = "softmax",
        redraw_interval: int = 1000,
        orthogonal: bool = True,
        eps: float | None = None,
        scaling: str = "once",
        padded_keys: str = "excluded",
    ) -> None:
        super().__init__(n_heads, head_dim, max_len, layer_idx)
        for name, value, valid in (("kernel", kernel, KERNELS), ("scaling", scaling, SCALINGS),
                                   ("padded_keys", padded_keys, PADDED_KEYS)):
            if value not in valid:
                raise ValueError(f"performer {name}={value!r}; valid: {', '.join(valid)}")
        self.scaling = scaling
        self.padded_keys = padded_keys
        self.port_width = 1 << (max_len - 1).bit_length()   # the port pads every batch to this width
        require_positive(nb_features=nb_features)
        require_non_negative(redraw_interval=redraw_interval, hint="0 = never redraw")
        self.nb_features = nb_features
        self.kernel = kernel
        self.redraw_interval = redraw_interval
        self.orthogonal = orthogonal
        self.eps = eps if eps is not None else (1e-6 if kernel == "softmax" else 1e-3)
        require_non_negative(eps=self.eps, hint="null = the kernel's default")
        # training forwards so far: the redraw schedule is decided on the device from it
        self.register_buffer("calls", torch.zeros((), dtype=torch.int64), persistent=False)
        # A first draw so an untrained model (or eval before any step) has defined features.
        self.register_buffer("features", self._draw(torch.device("cpu")), persistent=True)

    def _draw(self, device: torch.device) -> Tensor:
        return orthogonal_gaussian(self.nb_features, self.head_dim,
                                   lambda shape, dtype: self.randn(shape, device, dtype), self.orthogonal)

    def _count_and_redraw(self) -> None:
        """A training forward: redraw on the first call and every ``redraw_interval`` calls, decided
        on the device from the ``calls`` buffer: a fresh draw every training call, kept only where a
        redraw is due (``torch.where``), so the graph and its shapes never change and nothing is
        read on the host (one ``[m, d]`` QR per layer and step: about 0.1 ms on one CPU thread)."""
        due = self.calls == 0
        if self.redraw_interval:
            due = due | (self.calls % self.redraw_interval == 0)
        fresh = self._draw(self.features.device).to(self.features.dtype)
        self.features.copy_(torch.where(due, fresh, self.features))
        self.calls.add_(1)

    @property
    def training_calls(self) -> int:
        """Training forwards so far (a host read of the ``calls`` buffer: for checkpoints and tests)."""
        return int(self.calls)

    @training_calls.setter
    def training_calls(self, value: int) -> None:
        self.calls.fill_(value)

    def redraw(self) -> None:
        """Draw fresh random features from the training stream."""
        self.features = self._draw(self.features.device).to(self.features.dtype)

    def _features(self, x: Tensor, is_query: bool, mask: Tensor | None) -> tuple[Tensor, float]:
        """phi(x) = e + c before key masking, as (e, c): ``e`` is ``[B, H, N, m]`` for queries and
        ``[B, H, m, N]`` for keys (the layouts the products consume without copies); the constant c
        (the eps term) is applied on the small side of the products. Constant factors are folded
        into small tensors (x, the per-row offset), so ~3 passes touch the big tensor."""
        ratio = self.nb_features ** -0.5
        w = self.features.to(x.dtype)
        scale = self.head_dim ** -0.25 * (ratio if self.kernel == "relu" else 1.0)
        if self.scaling == "twice":
            scale = scale * self.head_dim ** -0.25
        x = x * scale      # relu kernel: relu(W x) / sqrt(m) = relu(W x / sqrt(m)) (homogeneity)
        proj = x @ w.T if is_query else w @ x.transpose(-1, -2)
        if self.kernel == "relu":
            return F.relu(proj), self.eps
        sq = 0.5 * x.pow(2).sum(-1)                                            # [B, H, N]
        if is_query:
            offset = proj.detach().amax(dim=-1, keepdim=True) + sq[..., None]
        else:
            per_key = proj.detach().amax(dim=-2)                               # [B, H, N]
            if mask is not None:
                per_key = per_key.masked_fill(~mask[:, None, :], float("-inf"))
            shift = per_key.amax(dim=-1)[..., None, None]
            shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
            offset = shift + sq[:, :, None, :]
        return torch.exp(proj + (math.log(ratio) - offset)), ratio * self.eps  # add: no neg in backward

    def feature_map(self, x: Tensor, is_query: bool, mask: Tensor | None = None) -> Tensor:
        """phi(x) ``[B, H, N, m]`` for queries or keys; keys at padded positions (mask False) get 0."""
        e, c = self._features(x, is_query, mask)
        phi = e + c if is_query else e.transpose(-1, -2) + c
        return phi if mask is None or is_query else phi * mask[:, None, :, None].to(phi.dtype)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, pad: Padding, x: Tensor) -> Tensor:
        if self.training:
            self._count_and_redraw()
        dev = q.device.type
        if self.kernel == "softmax" and torch.float16 in (
                q.dtype, torch.get_autocast_dtype(dev) if torch.is_autocast_enabled(dev) else None):
            # float16's range cannot hold exp features and their normaliser (a tiny normaliser
            # overflows 1 / den, inf gradients); bfloat16's can. Same values, computed in float32.
            with torch.autocast(dev, enabled=False):
                return self._attend(q.float(), k.float(), v.float(), pad).to(q.dtype)
        return self._attend(q, k, v, pad)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, pad: Padding) -> Tensor:
        mask = pad.mask
        e_q, c = self._features(q, True, None)                                 # [B, H, N, m]
        keys, weight = mask, mask.to(v.dtype)
        if self.padded_keys == "zero_keys":   # one zero key (v = 0) stands for the port's padded ones
            count = self.port_width - mask.sum(-1)                              # [B]
            k, v = (torch.cat([t, t.new_zeros(*t.shape[:2], 1, t.shape[-1])], dim=2) for t in (k, v))
            keys = torch.cat([mask, (count > 0)[:, None]], dim=1)
            weight = torch.cat([weight, count[:, None].to(v.dtype)], dim=1)
        e_k, _ = self._features(k, False, keys)                                # [B, H, m, N]
        # Key masking on the small side: [V * m, m] gives phi(K)^T V and phi(K)^T 1 over real keys
        # in one product, so padded keys enter neither the numerator nor the normaliser.
        m = weight[:, None, :, None]
        vm = torch.cat([v * m, m.expand(*v.shape[:3], 1)], dim=-1)            # [B, H, N, d + 1]
        kvz = e_k @ vm + c * vm.sum(dim=-2, keepdim=True)                      # (E_k + c)^T [V m, m]
        out = e_q @ kvz + c * kvz.sum(dim=-2, keepdim=True)                    # (E_q + c) kvz
        num, den = out[..., :-1], out[..., -1:]
        den = torch.where(den > 0, den, torch.ones_like(den))             # no real key, or no feature mass
        return zero_padded(num / den, pad)

    def get_extra_state(self) -> dict:
        return {**super().get_extra_state(), "training_calls": int(self.calls)}

    def set_extra_state(self, state: dict) -> None:
        super().set_extra_state(state)
        self.training_calls = int(state.get("training_calls", 0))
