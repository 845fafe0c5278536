"""Float64 reference of the Memformer encoder, written from the paper's equations (Wu et al.,
section 2.2.3, Fig. 2; Eq. 5 ``M_t = Encoder(s_t, M_{t-1})``) with explicit loops: one sequence at a
time, only its real tokens, one segment at a time, one slot at a time in the write.

It reads the parameters of a :class:`models.memory_encoder.MemformerEncoder` (so gradients w.r.t.
them can be compared) but shares none of its code: no padding, no masks, no batched segments.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor


def linear(x: Tensor, layer) -> Tensor:
    return x @ layer.weight.T + layer.bias


def layer_norm(x: Tensor, norm) -> Tensor:
    mean = x.mean(-1, keepdim=True)
    var = ((x - mean) ** 2).mean(-1, keepdim=True)
    return (x - mean) / torch.sqrt(var + norm.eps) * norm.weight + norm.bias


def gelu(x: Tensor) -> Tensor:
    return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))


def attention(q: Tensor, k: Tensor, v: Tensor, n_heads: int) -> Tensor:
    """Multi-head softmax attention of ``q [n, d]`` over ``k, v [m, d]`` (heads concatenated)."""
    dh = q.shape[-1] // n_heads
    outs = []
    for h in range(n_heads):
        c = slice(h * dh, (h + 1) * dh)
        w = torch.softmax(q[:, c] @ k[:, c].T / math.sqrt(dh), dim=-1)
        outs.append(w @ v[:, c])
    return torch.cat(outs, dim=-1)


def slot_write(writer, mem: Tensor, tok_k: Tensor, tok_v: Tensor, n_heads: int) -> Tensor:
    """Fig. 2c: slot ``j`` attends over its own key and the segment's token keys only; residual +
    LayerNorm. ``tok_k, tok_v [L, d]`` (real tokens only); no token: the memory is unchanged."""
    if tok_k.shape[0] == 0:
        return mem
    d = mem.shape[-1]
    dh = d // n_heads
    qkv = linear(mem, writer.qkv)
    q, k, v = qkv[:, :d], qkv[:, d:2 * d], qkv[:, 2 * d:]
    slots = []
    for j in range(mem.shape[0]):
        heads = []
        for h in range(n_heads):
            c = slice(h * dh, (h + 1) * dh)
            keys = torch.cat([k[j:j + 1, c], tok_k[:, c]])        # itself, then the tokens
            values = torch.cat([v[j:j + 1, c], tok_v[:, c]])
            a = torch.softmax(keys @ q[j, c] / math.sqrt(dh), dim=0)
            heads.append(a @ values)
        slots.append(torch.cat(heads))
    return layer_norm(mem + linear(torch.stack(slots), writer.out), writer.norm)


def self_attention(block, x: Tensor, n_heads: int, memory: Tensor | None, mixer) -> Tensor:
    """The block's attention branch on one segment ``x [L, d]`` (real tokens only): segment-local
    softmax, plus (per-layer memory) the read of ``memory`` with the same queries, one ``W^O``."""
    attn = block.attn
    q, k, v = linear(x, attn.q_proj), linear(x, attn.k_proj), linear(x, attn.v_proj)
    out = attention(q, k, v, n_heads)
    if memory is not None:
        kv = linear(memory, mixer.read_kv)
        d = x.shape[-1]
        out = out + attention(q, kv[:, :d], kv[:, d:], n_heads)
    return linear(out, attn.out_proj), k, v


def segment(enc, x: Tensor, state: list[Tensor]) -> tuple[Tensor, list[Tensor]]:
    """One segment ``x [L, d]`` through every layer with memories ``state``: ``(H_t, next state)``."""
    blocks = enc.encoder.blocks
    n_heads = blocks[0].attn.n_heads
    nxt = []
    for layer, block in enumerate(blocks):
        mixer = block.attn.mixer
        per_layer = None if enc.unified else state[layer]
        a, k, v = self_attention(block, layer_norm(x, block.norm1), n_heads, per_layer, mixer)
        x = x + a
        if per_layer is not None:
            nxt.append(slot_write(mixer.writer, per_layer, k, v, n_heads))
        else:   # unified: the memory cross-attention sublayer of this layer (Fig. 2b)
            reader = enc.memory.readers[layer]
            kv = linear(state[0], reader.kv)
            d = x.shape[-1]
            x = x + linear(attention(linear(layer_norm(x, reader.norm), reader.q), kv[:, :d], kv[:, d:], n_heads),
                           reader.out)
        hidden = gelu(linear(layer_norm(x, block.norm2), block.ffn[0]))
        x = x + linear(hidden, block.ffn[3])
    h = layer_norm(x, enc.encoder.norm)
    if enc.unified:   # written from the encoder's final hidden states, through W_K^w, W_V^w
        w = enc.memory.writer
        d = h.shape[-1]
        kv = h @ w.qkv.weight[d:].T + w.qkv.bias[d:]
        nxt = [slot_write(w, state[0], kv[:, :d], kv[:, d:], n_heads)]
    return h, nxt


def encode(enc, x: Tensor, summary: Tensor | None = None) -> tuple[Tensor, Tensor | None, list[list[Tensor]]]:
    """One sequence's real tokens ``x [n, d]`` -> outputs ``[n, d]``, the summary token's output
    (processed last, alone, reading the final memory) and the memories after every segment."""
    state = [enc.memory.initial] if enc.unified else [m.memory_init for m in enc.mixers]
    states = [state]
    outs = []
    for start in range(0, x.shape[0], enc.segment_len):
        h, state = segment(enc, x[start:start + enc.segment_len], state)
        outs.append(h)
        states.append(state)
    out = torch.cat(outs) if outs else x[:0]
    pooled = segment(enc, summary[None], state)[0][0] if summary is not None else None
    return out, pooled, states
