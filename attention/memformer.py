"""Memformer (Wu et al.): segment recurrence through a fixed set of memory slots, section 2.2.3,
trained optionally with Memory Replay Back-Propagation (section 2.4, Algorithm 1).

The sequence is cut into ``T`` segments of ``segment_len`` tokens, processed in order. Each layer
owns ``memory_slots`` slots ``M_t in R^{m x d}`` (``M_0`` learned). For segment ``t``:

* **read** (memory cross attention, Fig. 2b): tokens attend within their segment (softmax
  self-attention, padded keys masked) and, separately, to the memory projected into keys/values::

      out_t = softmax(Q_t K_t^T / sqrt(d_k)) V_t + softmax(Q_t (M_t W_K^r)^T / sqrt(d_k)) M_t W_V^r

* **write** (memory slot attention, Fig. 2c): slot ``j``'s query ``M_t,j W_Q^w`` attends over its
  own key ``M_t,j W_K^w`` and the segment's real tokens' keys only -- never over other slots::

      M_{t+1} = LayerNorm(M_t + W_O^w concat_heads(slot attention))

So a token of segment ``t`` sees every earlier segment through ``M_t``; the classifier pools the
outputs of all segments.

**Memory Replay Back-Propagation** (``mrbp: true``, training only): the forward pass runs
without a graph, computes every segment's output (``REPLAY_CHUNK`` segments at a time, so its
working set does not grow with ``T``) and keeps only the memories ``M_0 .. M_{T-1}`` (the replay
buffer); the backward pass walks the segments from last to first, recomputes segment
``t`` (read and write) from ``M_t`` with a graph, and back-propagates both the output gradient and
the gradient arriving at ``M_{t+1}`` (Algorithm 1 lines 8-12). The gradients are those of full
back-propagation through time; only one segment's activations are alive at a time.

Choices the paper leaves open, written down:

* **One mixer, one branch.** The paper's encoder layer has separate self-attention and memory
  cross-attention sublayers; inside the shell's single attention sublayer the two run in
  parallel and their outputs are summed (one residual branch, one ``W^O``). Hence with one
  segment the layer is *exactly* softmax attention over the whole sequence plus a read of ``M_0``
  (a plain softmax layer when that read is zero, e.g. ``M_0 = 0`` with zero read biases), the
  oracle the tests check.
* **What the write sees.** The paper writes from "the encoder's final hidden states"; inside one
  mixer the segment's tokens enter the slot attention through the shell's keys/values of the
  block input (no extra projections), so the memory recurrence depends on memories and keys/values
  only and every segment's read can be batched once the memories are known.
* **Write residual + LayerNorm** keep the memory's scale fixed over many segments (4K tokens is
  128 recurrent steps at the default); the paper gives no normalisation. ``M_0 ~ N(0, 1)``, the
  scale of the normalised memories that follow it.
* **Padding.** Sequences are padded inside to a multiple of ``segment_len`` and cut back. A
  segment with no real token leaves the memory unchanged, so outputs never depend on how much
  padding a batch has, nor on what it holds.
* **Defaults**: 32 slots (the paper's memory size) and 32-token segments (the paper uses 64;
  32 makes every sequence longer than 32 tokens exercise the write; a single-segment input never
  writes, so the write parameters get no gradient from it). No attention dropout, so the replayed
  segments are exactly the ones of the forward pass; the replay runs under the forward's autocast
  state.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention.base import Mixer, require_positive
from attention.masking import key_bias, pad_to_multiple, zero_padded


class MemformerAttention(Mixer):
    def __init__(
        self,
        n_heads: int,
        head_dim: int,
        max_len: int,
        layer_idx: int = 0,
        memory_slots: int = 32,
        segment_len: int = 32,
        mrbp: bool = False,
    ) -> None:
        super().__init__(n_heads, head_dim, max_len, layer_idx)
        require_positive(memory_slots=memory_slots, segment_len=segment_len)
        d = n_heads * head_dim
        self.memory_slots = memory_slots
        self.segment_len = segment_len
        self.mrbp = mrbp
        self.scale = 1.0 / math.sqrt(head_dim)
        self.memory_init = nn.Parameter(torch.randn(memory_slots, d))   # M_0
        self.read_kv = nn.Linear(d, 2 * d)                               # W_K^r, W_V^r
        self.write_qkv = nn.Linear(d, 3 * d)                             # W_Q^w, W_K^w, W_V^w
        self.write_out = nn.Linear(d, d)                                 # W_O^w
        self.write_norm = nn.LayerNorm(d)

    def replay_parameters(self) -> tuple[Tensor, ...]:
        """Trainable parameters MRBP differentiates explicitly (``M_0`` arrives as an input)."""
        return tuple(p for p in self.parameters() if p.requires_grad and p is not self.memory_init)

    # -- heads: [..., m, d] <-> [..., H, m, Dh] ------------------------------------------------
    def _split(self, t: Tensor) -> Tensor:
        return t.unflatten(-1, (self.n_heads, self.head_dim)).transpose(-2, -3)

    def _merge(self, t: Tensor) -> Tensor:
        return t.transpose(-2, -3).flatten(-2)

    def write(self, mem: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        """Slot attention: ``M_t [B, m, d]``, segment keys/values ``[B, H, L, Dh]``, mask ``[B, L]``
        -> ``M_{t+1}``. Each slot sees itself and the segment's real tokens, no other slot."""
        qs, ks, vs = (self._split(t) for t in self.write_qkv(mem).chunk(3, dim=-1))   # [B, H, m, Dh]
        tok = qs @ k.transpose(-1, -2) * self.scale + key_bias(mask, qs.dtype)         # [B, H, m, L]
        own = (qs * ks).sum(-1, keepdim=True) * self.scale                             # [B, H, m, 1]
        w = torch.softmax(torch.cat([own, tok], dim=-1), dim=-1)
        slots = w[..., :1] * vs + w[..., 1:] @ v
        new = self.write_norm(mem + self.write_out(self._merge(slots)))
        return torch.where(mask.any(1)[:, None, None], new, mem)

    def read(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, mems: Tensor) -> Tensor:
        """Outputs of segments batched: ``q, k, v [B, H, T, L, Dh]``, ``mask [B, T, L]``, memories
        ``[B, T, m, d]`` (``M_t`` for segment ``t``). Self-attention in the segment + memory read."""
        b, _, t, length, _ = q.shape
        bias = key_bias(mask.flatten(0, 1), q.dtype).view(b, 1, t, 1, length)
        local = F.scaled_dot_product_attention(q, k, v, attn_mask=bias)
        km, vm = (self._split(x).transpose(1, 2) for x in self.read_kv(mems).chunk(2, dim=-1))  # [B, H, T, m, Dh]
        return local + F.scaled_dot_product_attention(q, km, vm)

    def memories(self, m0: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
        """``M_0 .. M_{T-1}`` stacked ``[B, T, m, d]``: the sequential part (one step per segment)."""
        mems = [m0]
        # unbind once: indexing k[:, :, t] in the loop would cost O(T^2) in the backward pass
        for kt, vt, mt in list(zip(k.unbind(2), v.unbind(2), mask.unbind(1)))[:-1]:
            mems.append(self.write(mems[-1], kt, vt, mt))
        return torch.stack(mems, 1)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, x: Tensor) -> Tensor:
        b, h, n, dh = q.shape
        seg = lambda t: pad_to_multiple(t, self.segment_len, dim=2).unflatten(2, (-1, self.segment_len))  # noqa: E731
        qs, ks, vs = seg(q), seg(k), seg(v)                                               # [B, H, T, L, Dh]
        ms = pad_to_multiple(mask, self.segment_len, dim=1, value=False).unflatten(1, (-1, self.segment_len))
        m0 = self.memory_init.expand(b, -1, -1)
        if self.mrbp and self.training and torch.is_grad_enabled():
            out = MemoryReplay.apply(self, qs, ks, vs, ms, m0, *self.replay_parameters())
        else:
            out = self.read(qs, ks, vs, ms, self.memories(m0, ks, vs, ms))
        return zero_padded(out.flatten(2, 3)[:, :, :n], mask)


REPLAY_CHUNK = 8  # segments whose outputs the MRBP forward pass computes together


class MemoryReplay(torch.autograd.Function):
    """Algorithm 1: forward keeps only the memories; backward replays one segment at a time."""

    @staticmethod
    def forward(ctx, layer: MemformerAttention, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, m0: Tensor,
                *params: Tensor) -> Tensor:
        mems = layer.memories(m0, k, v, mask)   # grad mode is off inside Function.forward
        out = None
        for i in range(0, q.shape[2], REPLAY_CHUNK):  # bounded working set: a few segments at a time
            c = slice(i, i + REPLAY_CHUNK)
            part = layer.read(q[:, :, c], k[:, :, c], v[:, :, c], mask[:, c], mems[:, c])
            out = q.new_empty(q.shape, dtype=part.dtype) if out is None else out
            out[:, :, c] = part
        ctx.layer = layer
        dev = q.device.type  # the replay recomputes under the forward's autocast state
        ctx.autocast = (dev, torch.is_autocast_enabled(dev), torch.get_autocast_dtype(dev))
        ctx.save_for_backward(q, k, v, mask, mems)
        return out

    @staticmethod
    def backward(ctx, g_out: Tensor):
        q, k, v, mask, mems = ctx.saved_tensors
        layer: MemformerAttention = ctx.layer
        params = layer.replay_parameters()
        dev, amp, amp_dtype = ctx.autocast
        gq, gk, gv = torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v)
        gparams = [torch.zeros_like(p) for p in params]
        g_mem = None                                      # dL/dM_{t+1}; none past the last segment
        for t in reversed(range(q.shape[2])):
            with torch.enable_grad(), torch.autocast(dev, dtype=amp_dtype, enabled=amp):
                m_t = mems[:, t].detach().requires_grad_(True)
                qt, kt, vt = (z[:, :, t:t + 1].detach().requires_grad_(True) for z in (q, k, v))
                outs = [layer.read(qt, kt, vt, mask[:, t:t + 1], m_t[:, None])]
                grads_out = [g_out[:, :, t:t + 1]]
                if g_mem is not None:
                    outs.append(layer.write(m_t, kt[:, :, 0], vt[:, :, 0], mask[:, t]))
                    grads_out.append(g_mem)
                grads = torch.autograd.grad(outs, (m_t, qt, kt, vt, *params), grads_out, allow_unused=True)
            g_mem = grads[0]
            for full, part in zip((gq, gk, gv), grads[1:4]):
                if part is not None:
                    full[:, :, t:t + 1] = part
            for acc, part in zip(gparams, grads[4:]):
                if part is not None:
                    acc += part
        return (None, gq, gk, gv, None, g_mem, *gparams)
