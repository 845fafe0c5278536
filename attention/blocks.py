"""Block helpers for the fixed-pattern sparse variants (local, longformer, bigbird, sparse).

A sequence ``[B, H, N, D]`` is padded to whole blocks and viewed as ``[B, H, nb, bs, D]``. A
*table* ``[nq, S]`` (or ``[H, nq, S]`` per head) lists, for each query block, the ``S`` key blocks it
reads; gathering them gives ``[B, H, nq, S*bs, D]``, so attention costs ``O(N * S * bs)`` and never
builds ``N x N``. Masked logits get a large *finite* negative (as :func:`attention.masking.key_bias`),
so a row with no allowed key stays finite; callers zero padded query rows afterwards. Every real
query in these patterns reads at least itself, so a finite fill never leaks padded values into a
real row (their weight underflows to exactly zero).
"""
from __future__ import annotations

import torch
from torch import Tensor

from attention.masking import neg_fill, pad_to_multiple


def to_blocks(t: Tensor, bs: int) -> Tensor:
    """``[B, H, N, D]`` -> ``[B, H, nb, bs, D]``, zero-padding N up to whole blocks."""
    t = pad_to_multiple(t, bs, dim=2)
    b, h, n, d = t.shape
    return t.view(b, h, n // bs, bs, d)


def mask_blocks(mask: Tensor, bs: int) -> Tensor:
    """``[B, N]`` -> ``[B, nb, bs]``; the padding added to reach whole blocks is masked (False)."""
    m = pad_to_multiple(mask, bs, dim=1, value=False)
    return m.view(m.shape[0], -1, bs)


def from_blocks(t: Tensor, n: int) -> Tensor:
    """``[B, H, nb, bs, D]`` -> ``[B, H, n, D]`` (the block padding cut back)."""
    b, h, nb, bs, d = t.shape
    return t.reshape(b, h, nb * bs, d)[:, :, :n]


def window_table(nb: int, w: int, device: torch.device) -> tuple[Tensor, Tensor]:
    """Sliding window of blocks: query block a reads blocks ``a-w .. a+w``.

    Returns ``idx [nb, 2w+1]`` (clamped into range) and ``valid [nb, 2w+1]`` (False where the
    window runs off either end, so no block is read twice).
    """
    a = torch.arange(nb, device=device)[:, None]
    off = torch.arange(-w, w + 1, device=device)[None, :]
    raw = a + off
    valid = (raw >= 0) & (raw < nb)
    return raw.clamp(0, nb - 1), valid


def gather_blocks(t_blk: Tensor, idx: Tensor) -> Tensor:
    """Key/value blocks read by each query block.

    ``t_blk [B, H, nb, bs, D]``, ``idx [nq, S]`` (all heads) or ``[H, nq, S]`` (per head)
    -> ``[B, H, nq, S*bs, D]``. Uses ``index_select`` on whole blocks (contiguous copies), several
    times faster on CPU than advanced indexing at 4K tokens.
    """
    b, h, nb, bs, d = t_blk.shape
    nq, s = idx.shape[-2:]
    if idx.dim() == 2:
        g = t_blk.index_select(2, idx.reshape(-1))                            # [B, H, nq*S, bs, D]
    else:
        flat = idx + nb * torch.arange(idx.shape[0], device=idx.device)[:, None, None]
        g = t_blk.reshape(b, h * nb, bs, d).index_select(1, flat.reshape(-1))  # [B, H*nq*S, bs, D]
    return g.view(b, h, nq, s * bs, d)


def gather_key_mask(mask_blk: Tensor, idx: Tensor) -> Tensor:
    """Key padding of the gathered blocks: ``[B, nb, bs]`` -> ``[B, H or 1, nq, 1, S*bs]``."""
    g = mask_blk[:, idx]                                       # [B, (H,) nq, S, bs]
    if idx.dim() == 2:
        g = g.unsqueeze(1)
    b, h, nq, s, bs = g.shape
    return g.reshape(b, h, nq, 1, s * bs)


def slot_allow(valid: Tensor, bs: int) -> Tensor:
    """Slot validity ``[..., nq, S]`` spread over the keys of each slot: ``[..., nq, 1, S*bs]``."""
    return valid.repeat_interleave(bs, dim=-1).unsqueeze(-2)


def joint_softmax(scores: list[Tensor], allowed: list[Tensor]) -> list[Tensor]:
    """One softmax over several groups of keys of the same queries (concatenated on the last dim).

    Lets a pattern combine key sets with different layouts (a gathered window and shared global
    columns, say) under a single normaliser, as the union pattern requires. The score tensors are
    biased IN PLACE (callers pass fresh matmul outputs, which autograd does not need back).
    """
    neg = neg_fill(scores[0].dtype)
    # Additive bias rather than masked_fill: the bias is as small as the (broadcast) mask, and
    # the backward of an in-place add is the identity (masked_fill's backward copies the grads).
    parts = [s.add_(torch.zeros(a.shape, dtype=s.dtype, device=s.device).masked_fill_(~a, neg))
             for s, a in zip(scores, allowed)]
    sizes = [p.shape[-1] for p in parts]
    if len(parts) == 1:
        return [torch.softmax(parts[0], dim=-1)]
    shape = torch.broadcast_shapes(*(p.shape[:-1] for p in parts))
    cat = torch.cat([p.expand(*shape, p.shape[-1]) for p in parts], dim=-1)
    return list(torch.softmax(cat, dim=-1).split(sizes, dim=-1))


# Score elements per piece of :func:`block_sparse_attention` on CPU (16 MB in fp32). Bounding the
# piece keeps the working set and every allocation small; measured on CPU (batch 8, 4K tokens,
# BigBird), one unbounded pass was 1.6x slower than four quarter-size passes (allocations above
# glibc's mmap threshold are page-faulted afresh on every step), which made the cost grow faster
# than N. A GPU's caching allocator has no such cost: there the split only adds dispatches.
SCORE_PIECE = 1 << 22


def block_sparse_attention(
    q_blk: Tensor,
    k_blk: Tensor,
    v_blk: Tensor,
    mask_blk: Tensor,
    idx: Tensor,
    allow: Tensor,
    extra: tuple[Tensor, Tensor, Tensor] | None = None,
    split: bool = False,
) -> Tensor:
    """Attention of query blocks over the key blocks listed in ``idx`` (plus optional shared keys).

    ``q_blk [B, H, nq, bs, D]`` must already carry the 1/sqrt(d) scale; ``k_blk``/``v_blk``
    ``[B, H, nb, bs, D]``; ``mask_blk [B, nb, bs]``; ``idx`` as in :func:`gather_blocks`;
    ``allow`` the structural mask, broadcastable to ``[B, H, nq, bs, S*bs]`` with its query-block
    dim (-3) of size nq or 1. ``extra`` = ``(k_e [B, H, E, D], v_e [B, H, E, D], allow_e)`` adds E
    keys every query block may read (global tokens), ``allow_e`` broadcastable to
    ``[B, H, 1, bs, E]``; they share the softmax. Returns ``[B, H, nq, bs, D]``.

    With ``split`` (a CPU choice: callers pass their ``on_cpu``, made at construction) query blocks
    are processed in pieces of at most :data:`SCORE_PIECE` logits, a loop whose length grows with
    the batch and N; without it (an accelerator) one pass, so the dispatch count is flat in N.
    """
    b, h, nq, bs, _ = q_blk.shape
    step = max(1, SCORE_PIECE // (b * h * bs * idx.shape[-1] * bs)) if split else nq
    if step >= nq:
        return _block_piece(q_blk, k_blk, v_blk, mask_blk, idx, allow, extra)

    def rows(t: Tensor, i: int) -> Tensor:
        return t.narrow(-3, i, min(step, nq - i)) if t.shape[-3] == nq else t

    pieces = [_block_piece(q_blk[:, :, i:i + step], k_blk, v_blk, mask_blk, idx[..., i:i + step, :], rows(allow, i),
                           extra) for i in range(0, nq, step)]
    return torch.cat(pieces, dim=2)


def _block_piece(q_blk: Tensor, k_blk: Tensor, v_blk: Tensor, mask_blk: Tensor, idx: Tensor, allow: Tensor,
                 extra: tuple[Tensor, Tensor, Tensor] | None) -> Tensor:
    kg = gather_blocks(k_blk, idx)
    vg = gather_blocks(v_blk, idx)
    scores = [q_blk @ kg.transpose(-1, -2)]
    allowed = [gather_key_mask(mask_blk, idx) & allow]
    if extra is not None:
        k_e, v_e, allow_e = extra
        scores.append(q_blk @ k_e.unsqueeze(2).transpose(-1, -2))
        allowed.append(allow_e)
    w = joint_softmax(scores, allowed)
    out = w[0] @ vg
    if extra is not None:
        out = out + w[1] @ extra[1].unsqueeze(2)
    return out


def dense_rows(q_rows: Tensor, k: Tensor, v: Tensor, mask: Tensor) -> Tensor:
    """Full attention of a few (global) query rows over every key.

    ``q_rows [B, H, R, D]`` (already scaled), ``k``/``v`` ``[B, H, N, D]``, ``mask [B, N]``.
    """
    w = joint_softmax([q_rows @ k.transpose(-1, -2)], [mask[:, None, None, :]])[0]
    return w @ v
