"""Memformer (Wu et al.): segment recurrence through a fixed set of memory slots (section 2.2.3),
trained optionally with Memory Replay Back-Propagation (section 2.4, Algorithm 1).

The sequence is cut into ``T`` segments ``s_t`` of ``segment_len`` tokens, processed in order
through the *whole* encoder (the segment loop sits outside the layers, in
:class:`models.memory_encoder.MemformerEncoder`; the network builds it when a mixer says
``segment_recurrent``). The memory ``M_t in R^{m x d}`` (``M_0`` learned) carries the past.

``memory: unified`` (default, the paper's design: one memory for the model, Eq. 5
``M_t = Encoder(s_t, M_{t-1})``):

* every layer: segment-local self-attention (this mixer), then a **memory cross-attention**
  sublayer (Fig. 2b; :class:`MemoryCrossAttention`, its own ``W_Q^c, W_K^c, W_V^c, W_O^c`` per
  layer), then the FFN, each a pre-LN residual branch::

      x <- x + W_O^c concat_h softmax((LN(x) W_Q^c)(M_t W_K^c)^T / sqrt(d_h)) (M_t W_V^c)

* after the last layer, the **memory slot attention** (Fig. 2c; :class:`SlotWriter`) writes the
  next memory from ``M_t`` and the encoder's final hidden states ``H_t`` (after the final
  LayerNorm). Slot ``j`` attends over its own key and the segment's real tokens' keys, never over
  another slot::

      a_j = softmax([q_j . k_j, q_j . K_H^T] / sqrt(d_h)),  q_j, k_j, v_j = M_t,j W_Q^w, W_K^w, W_V^w
      M_{t+1} = LayerNorm(M_t + W_O^w concat_h (a_j,0 v_j + a_j,1: V_H)),  K_H, V_H = H_t W_K^w, H_t W_V^w

``memory: per_layer`` (the paper's Fig. 1b "each layer has its own individual memory", kept as an
option): layer ``l`` owns ``M^l_t``, read with the self-attention queries in the same mixer
(outputs summed, one ``W^O``) and written by the slot attention above from the layer's own
keys/values ``k_t, v_t`` (no extra projections)::

      out_t = softmax(Q_t K_t^T / sqrt(d_h)) V_t + softmax(Q_t (M^l_t W_K^r)^T / sqrt(d_h)) M^l_t W_V^r
      M^l_{t+1} = LayerNorm(M^l_t + W_O^w concat_h slot_attention(M^l_t; k_t, v_t))

  Standalone (e.g. the attention contract tests) this mixer runs that recurrence over the whole
  sequence itself; inside the network the encoder drives it one segment at a time through
  :attr:`MemformerAttention.carry`. Both give the same outputs (a test checks it).

**Classification** (the paper is a language model; open choice): mean pooling averages the
outputs of every segment. CLS pooling processes the summary token *last*, as a segment of its
own after the final segment: it attends to itself and reads the final memory ``M_T`` in every
layer, so the logits depend on every real token (with a prepended CLS in segment 0 and memory
flowing forward only, tokens after the first segment would not reach them).

**MRBP** (``mrbp: true``, training only): the forward pass keeps only the memories between
segments; the backward pass recomputes one segment at a time (all layers, read and write) from
``M_t`` and back-propagates the output gradient together with ``dL/dM_{t+1}`` (Algorithm 1 lines
8-12). Here the memory's critical path ``M_t -> M_{t+1}`` runs through every layer of the
segment (the write reads the final hidden states), so MRBP coincides with checkpointing each
segment at the memory boundary; gradients equal full BPTT.

Choices the paper leaves open, written down:

* **Positions.** The paper's simplified relative position encoding (section 2.1, Eqs. 2-4) is not
  implemented: all variants share the backbone's learned absolute positions, so each token keeps
  its global position across segments. The bias terms ``b_q, b_k`` of Eq. 2 are the shell's
  projection biases.
* **Horizon.** The paper truncates BPTT (horizon 4 in Table 3, 1-32 in Fig. 3b) because its LM
  loss sits in every segment. A classifier's loss sits after the last segment, so truncation would
  cut the loss off the early segments' memory path: gradients flow through all ``T`` segments
  (no detaching schedule).
* **Slot-attention projections.** Memory and token keys/values share ``W_K^w, W_V^w`` (one sparse
  attention over ``[M_t; H_t]``, Fig. 2c); residual + LayerNorm keep the memory's scale fixed over
  many segments (4K tokens is 128 steps); ``M_0 ~ N(0, 1)``, the scale of the normalised memories.
* **Padding.** Sequences are padded to a multiple of ``segment_len`` and cut back. Padded tokens
  are never attended to nor written; a segment with no real token leaves the memory unchanged, so
  outputs never depend on how much padding a batch has.
* **Defaults**: 32 slots (the paper's memory size) and 32-token segments (the paper uses 64; 32
  makes every sequence longer than 32 tokens exercise the write). No attention dropout, so the
  replayed segments equal the forward's; MRBP replays under the forward's RNG and autocast state.
* **Dropout.** Every residual branch of a layer gets the block's dropout: self-attention, the
  memory cross-attention read (unified memory) and the FFN. The slot write has none (it is
  normalised, and a dropped write would persist through every later segment).
* **Weight decay.** ``M_0`` (and each ``M^l_0``) is a 2-D parameter, so the optimiser's rule
  (``models/module.py``: no decay for 1-D tensors, norms and embeddings) decays it like a weight
  matrix when ``optim.weight_decay > 0`` (the lra2020 protocol's 0.1; xiong2021 uses 0). Kept as
  is: it only shrinks the first memory, which every write renormalises.
* **A slot that attends only to itself is still rewritten**: ``LN(M_j + W_O^w W_V^w M_j)``, not
  ``M_j``. The paper's text argues that attending to itself lets a slot keep its content; with
  Fig. 2c's residual + LayerNorm that holds only approximately. Kept: the LayerNorm is what holds
  the memory's scale over 128 segments.
* **MRBP under autocast** replays each segment under the forward's autocast state and RNG, and its
  gradients equal BPTT's bit for bit in bfloat16 and float16 too (CPU autocast and emulated CUDA
  autocast; ``tests/attention/test_attention_cuda_autocast.py``). The reentrant checkpoint used
  before agreed only to low-precision rounding (4.5e-4 at gradients of 0.25 in bfloat16).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention.base import Mixer, require_positive
from attention.masking import key_bias, pad_to_multiple, zero_padded
from attention.padding import Padding
from attention.spec import Grid, Spec, cap, int_range

MEMORY_MODES = ("unified", "per_layer")


def split_heads(t: Tensor, n_heads: int) -> Tensor:
    """``[..., m, d] -> [..., H, m, d/H]``."""
    return t.unflatten(-1, (n_heads, -1)).transpose(-2, -3)


def merge_heads(t: Tensor) -> Tensor:
    """``[..., H, m, Dh] -> [..., m, H*Dh]``."""
    return t.transpose(-2, -3).flatten(-2)


class SlotWriter(nn.Module):
    """Memory slot attention (Fig. 2c): ``M_{t+1}`` from ``M_t`` and one segment's token keys/values."""

    def __init__(self, d: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.scale = 1.0 / math.sqrt(d // n_heads)
        self.qkv = nn.Linear(d, 3 * d)     # W_Q^w, W_K^w, W_V^w
        self.out = nn.Linear(d, d)         # W_O^w
        self.norm = nn.LayerNorm(d)

    def token_keys_values(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """``H_t [B, L, d]`` -> keys, values ``[B, H, L, Dh]`` through ``W_K^w, W_V^w`` (unified memory)."""
        d = h.shape[-1]
        k, v = F.linear(h, self.qkv.weight[d:], self.qkv.bias[d:]).chunk(2, dim=-1)
        return split_heads(k, self.n_heads), split_heads(v, self.n_heads)

    def forward(self, mem: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        """``M_t [B, m, d]``, token keys/values ``[B, H, L, Dh]``, mask ``[B, L]`` -> ``M_{t+1}``."""
        qs, ks, vs = (split_heads(t, self.n_heads) for t in self.qkv(mem).chunk(3, dim=-1))  # [B, H, m, Dh]
        tok = qs @ k.transpose(-1, -2) * self.scale + key_bias(mask, qs.dtype)             # [B, H, m, L]
        own = (qs * ks).sum(-1, keepdim=True) * self.scale                                 # [B, H, m, 1]
        w = torch.softmax(torch.cat([own, tok], dim=-1), dim=-1)
        slots = w[..., :1] * vs + w[..., 1:] @ v
        new = self.norm(mem + self.out(merge_heads(slots)))
        return torch.where(mask.any(1)[:, None, None], new, mem)


class MemoryCrossAttention(nn.Module):
    """Memory cross-attention sublayer of one layer (Fig. 2b): the branch ``Read(LN(x), M_t)`` that
    the encoder adds to ``x`` through the block's residual dropout (pre-LN)."""

    def __init__(self, d: int, n_heads: int) -> None:
        super().__init__()
        self.n_heads = n_heads
        self.norm = nn.LayerNorm(d)
        self.q = nn.Linear(d, d)           # W_Q^c
        self.kv = nn.Linear(d, 2 * d)      # W_K^c, W_V^c
        self.out = nn.Linear(d, d)         # W_O^c

    def forward(self, x: Tensor, mem: Tensor) -> Tensor:
        q = split_heads(self.q(self.norm(x)), self.n_heads)
        k, v = (split_heads(t, self.n_heads) for t in self.kv(mem).chunk(2, dim=-1))
        return self.out(merge_heads(F.scaled_dot_product_attention(q, k, v)))


class UnifiedMemory(nn.Module):
    """The model's one memory: ``M_0``, every layer's reader and the writer."""

    def __init__(self, d: int, n_heads: int, n_layers: int, slots: int) -> None:
        super().__init__()
        self.initial = nn.Parameter(torch.randn(slots, d))   # M_0
        self.readers = nn.ModuleList(MemoryCrossAttention(d, n_heads) for _ in range(n_layers))
        self.writer = SlotWriter(d, n_heads)

    def write(self, mem: Tensor, h: Tensor, mask: Tensor) -> Tensor:
        """``M_{t+1}`` from ``M_t`` and the encoder's final hidden states ``H_t [B, L, d]``."""
        return self.writer(mem, *self.writer.token_keys_values(h), mask)


class MemformerAttention(Mixer):
    """Segment-local self-attention; in ``per_layer`` mode also this layer's memory read and write.
    ``mrbp`` and the unified memory are read by :class:`models.memory_encoder.MemformerEncoder`."""
    spec = Spec(
        grid=Grid({"memory_slots": (32, 1, 3), "segment_len": (32, 1, 4, 5), "memory": ("unified", "per_layer"),
                   "mrbp": (False, True)}, size="segment_len", unit=lambda r: cap(r["segment_len"], most=6),
                  extra={"layers": (1, 2, 3), "pool": ("mean", "cls")}, shape=("heads", "n", "rows", "mode")),
        ranges={"memory_slots": int_range(1, 4), "segment_len": int_range(1, 6)},
        knobs=(), excluded="no token mixer on (q, k, v): a segment-recurrent memory carried across the whole encoder",
        draws=False, small={"segment_len": 8, "memory_slots": 8},
        documented=("memory_slots", "segment_len", "memory", "mrbp"))

    segment_recurrent = True   # the network runs the segment loop (models.memory_encoder)

    def __init__(
        self,
        n_heads: int,
        head_dim: int,
        max_len: int,
        layer_idx: int = 0,
        memory_slots: int = 32,
        segment_len: int = 32,
        memory: str = "unified",
        mrbp: bool = False,
    ) -> None:
        super().__init__(n_heads, head_dim, max_len, layer_idx)
        require_positive(memory_slots=memory_slots, segment_len=segment_len)
        if memory not in MEMORY_MODES:
            raise ValueError(f"attention.memory={memory!r} is not valid; use one of {', '.join(MEMORY_MODES)} "
                             "in conf/attention/memformer.yaml or on the command line")
        d = n_heads * head_dim
        self.memory_slots = memory_slots
        self.segment_len = segment_len
        self.memory = memory
        self.mrbp = mrbp
        # M^l_t while the encoder drives this layer one segment at a time (per_layer mode); the
        # layer replaces it with M^l_{t+1}. None: standalone, the mixer runs the recurrence itself.
        self.carry: Tensor | None = None
        if memory == "per_layer":
            self.memory_init = nn.Parameter(torch.randn(memory_slots, d))   # M^l_0
            self.read_kv = nn.Linear(d, 2 * d)                               # W_K^r, W_V^r
            self.writer = SlotWriter(d, n_heads)

    def read(self, q: Tensor, mems: Tensor) -> Tensor:
        """Per-layer read, segments batched: ``q [B, H, T, L, Dh]``, memories ``[B, T, m, d]``."""
        km, vm = (split_heads(x, self.n_heads).transpose(1, 2) for x in self.read_kv(mems).chunk(2, dim=-1))
        return F.scaled_dot_product_attention(q, km, vm)

    def memories(self, m0: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        """``M_0 .. M_{T-1}`` stacked ``[B, T, m, d]`` from segment keys/values ``[B, H, T, L, Dh]``."""
        mems = [m0]
        # unbind once: indexing k[:, :, t] in the loop would cost O(T^2) in the backward pass
        for kt, vt, mt in list(zip(k.unbind(2), v.unbind(2), mask.unbind(1)))[:-1]:
            mems.append(self.writer(mems[-1], kt, vt, mt))
        return torch.stack(mems, 1)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, pad: Padding, x: Tensor) -> Tensor:
        mask = pad.mask
        b, _, n, _ = q.shape
        seg = lambda t: pad_to_multiple(t, self.segment_len, dim=2).unflatten(2, (-1, self.segment_len))  # noqa: E731
        qs, ks, vs = seg(q), seg(k), seg(v)                                               # [B, H, T, L, Dh]
        ms = pad_to_multiple(mask, self.segment_len, dim=1, value=False).unflatten(1, (-1, self.segment_len))
        bias = key_bias(ms.flatten(0, 1), q.dtype).view(b, 1, ms.shape[1], 1, self.segment_len)
        out = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=bias)                 # within each segment
        if self.memory == "per_layer":
            if self.carry is not None:       # one segment, M^l_t given by the encoder
                if ms.shape[1] != 1:
                    raise ValueError(f"a memformer layer driven by the encoder takes one segment "
                                     f"(<= {self.segment_len} tokens), got {n}")
                out = out + self.read(qs, self.carry[:, None])
                self.carry = self.writer(self.carry, k, v, mask)
            else:
                m0 = self.memory_init.expand(b, -1, -1)
                out = out + self.read(qs, self.memories(m0, ks, vs, ms))
        return zero_padded(out.flatten(2, 3)[:, :, :n], pad)
