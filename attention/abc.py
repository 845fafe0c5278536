"""Attention with Bounded-memory Control (ABC; Peng et al.), eqs. 3-4 and 12.

``N`` tokens are written into ``n`` memory slots by control vectors ``phi_i in R^n`` (eq. 3)::

    K~ = sum_i phi_i (x) k_i,   V~ = sum_i phi_i (x) v_i,   out = V~^T softmax(K~ q / sqrt(d))   (eq. 4)

The control strategy is pluggable (``control``):

* ``mlp`` (ABC_MLP, eq. 12): ``alpha_i = exp(W_phi x_i)``, ``phi_i = alpha_i / sum_j alpha_j`` over
  the real tokens of the sequence (padded tokens get exactly zero). ``x`` is the block input.
* ``random`` (ABC_RD, Table 1): ``phi_t = e_{i_t}``, ``i_t ~ unif{1..n}`` from the mixer's generator
  (fresh per token every training step). Eval draws one slot per (head, position) from the eval
  seed, shared by the rows, so a sequence's eval output does not depend on the rest of the batch.
* ``linformer`` (section 3.1): ``phi_i = W^LF[:, i]``, a learned control vector per position up to
  ``max_len`` (a sequence of ``N`` tokens uses the first ``N`` columns).
* ``segment`` (compressive, Table 1): ``phi_t = e_floor(n t / N)`` with ``N`` the sequence's real
  length and ``t`` the rank of the token among the real ones.

Choices the paper leaves open, written down:

* **Multi-head.** The paper applies "its multihead variant": here ``mlp`` and ``random`` control
  each head separately (``W_phi: d -> H * n``; independent draws per head), ``linformer`` and
  ``segment`` use one control for all heads (Linformer's head-wise sharing; segments are
  positional). Keys and values share the control, as eq. 3 writes.
* **Scale.** Eq. 4 has no ``1/sqrt(d)``; we keep the transformer's scaling so that ``phi_i = e_i``
  is exactly softmax attention (footnote 2), the oracle the tests check.
* **Empty slots.** A slot that no real token writes to (total control 0: an unused random slot,
  a segment slot of a sequence shorter than ``n``, a Linformer column past the length) stores
  nothing and is excluded from the softmax; eq. 4 would otherwise give weight to a zero key.
* **Normalising one-hot controls** (``normalize``, default true): ``random`` and ``segment`` divide
  each slot by the number of tokens written to it, i.e. slots hold means (the compressive
  transformer's mean-pool compression; the normalisation of the clustering instance, eq. 7-8) so
  their scale does not grow with ``N`` -- the same reason section 4 gives for normalising
  ABC_MLP. ``normalize=false`` gives Table 1's literal sums. ``linformer`` is never normalised.
* **W_phi** has no bias (a per-slot bias cancels in the normalisation over the sequence) and the
  default ``nn.Linear`` initialisation. The paper ties it across layers (section 4): pass a
  :class:`ControlTie` as ``tie`` (the ``abc_mlp`` preset does, as a nested Hydra object). Hydra
  builds that object once per instantiated attention config, so it is shared by the layers of the
  model built from it; layer 0 always starts a new ``W_phi``, so a second model built from the
  same partial never shares weights with the first, and nothing lives at module level.
  ``tie: null`` gives every layer its own ``W_phi``.
* **Linformer init**: Xavier normal on ``[n, max_len]`` (Linformer's projection initialisation).
* **Slot draws**: ``random`` draws its slots with :meth:`Mixer.randint`, ``floor(n u_t)`` of
  counter-based uniforms, in a position-major table (so eval is batch- and padding-independent as
  well). Every step has static shapes and reads nothing on the host.
"""
from __future__ import annotations

import math
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention.base import Mixer, require_positive
from attention.masking import key_bias, zero_padded
from attention.padding import Padding
from attention.spec import Grid, Knob, Spec, cap, int_range

CONTROLS = ("mlp", "random", "linformer", "segment")


class ControlTie:
    """Holds the ``W_phi`` shared by the layers of one model (built once per Hydra partial).

    Layer 0 starts a new group, later layers reuse the current module; a plain object (not a
    Module), so each mixer registers the shared Linear itself and parameters deduplicate.
    """

    def __init__(self) -> None:
        self.current: nn.Module | None = None
        self.key: tuple | None = None

    def get(self, layer_idx: int, key: tuple, factory: Callable[[], nn.Module]) -> nn.Module:
        """The group's module; layer 0 (a new model) or a different shape ``key`` starts a new one."""
        if layer_idx == 0 or self.current is None or key != self.key:
            self.current, self.key = factory(), key
        return self.current


class ABCAttention(Mixer):
    spec = Spec(
        grid=Grid({"memory_size": (64, 1, 3, 8), "control": ("mlp", "random", "linformer", "segment"),
                   "normalize": (True, False), "tie": ({"_target_": "attention.abc.ControlTie"}, None)},
                  size="memory_size", unit=lambda r: cap(r["memory_size"]),
                  extra={"layers": (1, 2)}),                                 # tie: W_phi shared by the layers
        ranges={"memory_size": int_range(1, 12)}, knobs=(Knob("memory_size", (16, 32, 64, 128, 256)),),
        draws=lambda s: s["control"] == "random", small={"memory_size": 8},
        documented=("memory_size", "control", "normalize"), representative="abc_rd")

    def __init__(
        self,
        n_heads: int,
        head_dim: int,
        max_len: int,
        layer_idx: int = 0,
        memory_size: int = 64,
        control: str = "mlp",
        normalize: bool = True,
        tie: ControlTie | None = None,
    ) -> None:
        super().__init__(n_heads, head_dim, max_len, layer_idx)
        if control not in CONTROLS:
            raise ValueError(f"abc control={control!r}; valid: {', '.join(CONTROLS)}")
        require_positive(memory_size=memory_size)
        self.memory_size = memory_size
        self.control = control
        self.normalize = normalize
        d = n_heads * head_dim
        if control == "mlp":
            factory = lambda: nn.Linear(d, n_heads * memory_size, bias=False)  # noqa: E731
            self.w_phi = tie.get(layer_idx, (d, n_heads, memory_size), factory) if tie is not None else factory()
        elif control == "linformer":
            self.w_lf = nn.Parameter(nn.init.xavier_normal_(torch.empty(memory_size, max_len)))

    def control_vectors(self, mask: Tensor, x: Tensor) -> Tensor:
        """``phi [B, H or 1, N, n]`` (eq. 3); zero at padded tokens."""
        b, n = mask.shape
        real = mask[:, None, :, None].to(x.dtype)
        if self.control == "mlp":  # eq. 12, normalised over the real tokens of the sequence
            logits = self.w_phi(x).view(b, n, self.n_heads, self.memory_size).transpose(1, 2)
            logits = logits + key_bias(mask, logits.dtype).view(b, 1, n, 1)
            return torch.softmax(logits, dim=2) * real
        if self.control == "linformer":
            if n > self.max_len:
                raise ValueError(f"abc linformer control has {self.max_len} positions; got a sequence of {n}")
            return self.w_lf[:, :n].t()[None, None] * real
        if self.control == "random":
            slot = self.random_slots(b, n, x.device)
        else:  # segment: e_floor(n t / N), t = rank among the real tokens, N = real length
            rank = mask.cumsum(1) - 1
            length = mask.sum(1, keepdim=True).clamp_min(1)
            slot = torch.div(rank.clamp_min(0) * self.memory_size, length, rounding_mode="floor")[:, None]
        # scatter, not F.one_hot: one_hot's CPU kernel reads the slots' min and max on the host
        phi = torch.zeros(*slot.shape, self.memory_size, dtype=x.dtype, device=x.device)
        phi = phi.scatter_(-1, slot[..., None], 1.0) * real
        if self.normalize:
            phi = phi / phi.sum(2, keepdim=True).clamp_min(1.0)
        return phi

    def random_slots(self, b: int, n: int, device: torch.device) -> Tensor:
        """ABC_RD's slot per token ``[B, H, N]``: fresh per token in training; in eval one draw per
        (head, position), the same for every row. Draws are position-major over ``max(N, max_len)``
        positions and cut to ``N``, so a longer padding only appends draws."""
        rows = b if self.training else 1
        table = self.randint(self.memory_size, (max(n, self.max_len), rows, self.n_heads), device)
        return table[:n].permute(1, 2, 0).expand(b, self.n_heads, n)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, pad: Padding, x: Tensor) -> Tensor:
        mask = pad.mask
        phi = self.control_vectors(mask, x)
        k_mem = phi.transpose(-1, -2) @ k                                 # eq. 3: [B, H, n, Dh]
        v_mem = phi.transpose(-1, -2) @ v
        used = (phi != 0).any(2)                                          # [B, H|1, n]
        bias = key_bias(used.flatten(0, 1), q.dtype).view(*used.shape[:2], 1, self.memory_size)
        out = F.scaled_dot_product_attention(q, k_mem, v_mem, attn_mask=bias, scale=1.0 / math.sqrt(self.head_dim))
        return zero_padded(out, pad)
