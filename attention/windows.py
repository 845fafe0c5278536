"""Softmax attention of blocks of queries over a sliding window of neighbouring key blocks, read
through an overlapping view (reformer's look-back chunks, local attention's block window).

The key (value) blocks of every sequence are laid out one after another in a ``[T + W - 1, m, D]``
buffer, so query block t reads buffer blocks ``t .. t + W - 1`` (``[T, W m, D]``) as a strided
view: no gathered copy per window position, and the backward folds the window gradients back with
W GEMMs into the buffer. A window that reaches past its own sequence (into the previous or next
one, or the buffer's end blocks) is masked by the caller's bias; its keys get weight exactly 0.

One autograd node keeps the queries, the two buffers and the weights. The log-partition ``z`` of
every row comes out too (reformer combines hash rounds with it); its gradient is ``w`` itself, so
``ds = w (dw - dO . O + dz)`` with ``sum_j w_j dw_j = dO . O`` (no score-sized product).
"""
from __future__ import annotations

import torch
from torch import Tensor

from attention.base import autocast_as, autocast_state


def windows(buf: Tensor, width: int) -> Tensor:
    """``[T + W - 1, m, D]`` -> ``[T, W m, D]``: block t reads buffer blocks ``t .. t + W - 1``."""
    t_all, m, d = buf.shape
    return buf.as_strided((t_all - width + 1, width * m, d), (m * d, d, 1))


def fold(p: Tensor, x: Tensor, width: int, scale: float = 1.0) -> Tensor:
    """``scale p^T x`` for the windows of :func:`windows` (``p [T, m, W m]``, ``x [T, m, D]``), summed back
    into the ``[T + W - 1, m, D]`` buffer (each block is in W windows), without a ``[T, W m, D]``
    temporary."""
    t, m = x.shape[:2]
    p, out = p.to(x.dtype), x.new_zeros(t + width - 1, m, x.shape[-1])     # (dtypes differ under autocast only)
    for j in range(width):
        out[j:j + t].baddbmm_(p[..., j * m:(j + 1) * m].transpose(1, 2), x, alpha=scale)
    return out


class _BlockBuffer(torch.autograd.Function):
    """``[B, H, N, D]`` -> ``[pad + B H nb + pad, m, D]``: each sequence cut into ``nb`` blocks of m
    (its tail block zero-filled), the sequences one after another, ``pad`` zero blocks at both ends.
    One strided copy; the backward is a view of the buffer's gradient.

    Kept against ``F.pad`` + ``reshape`` + ``F.pad`` under autograd because it wins, in local
    attention's use (block 64, window 1, B 4, H 2, d 64, forward + backward with
    :class:`WindowAttention`, one CPU thread, 9 interleaved rounds): the plain ops take 1.13x the
    time at N 1024 and 1.14x at 4096, the same peak memory. Compiles (``fullgraph``, no break)."""

    @staticmethod
    def forward(ctx, x: Tensor, m: int, pad: int) -> Tensor:
        b, h, n, d = x.shape
        nb = -(-n // m)
        ctx.shape, ctx.pad = (b, h, n, d, nb * m), pad
        buf = x.new_zeros(b * h * nb + 2 * pad, m, d) if n % m or pad else x.new_empty(b * h * nb, m, d)
        buf[pad:pad + b * h * nb].view(b, h, nb * m, d)[:, :, :n].copy_(x)
        return buf

    @staticmethod
    def backward(ctx, grad: Tensor):
        b, h, n, d, np_ = ctx.shape
        pad = ctx.pad
        return grad[pad:grad.shape[0] - pad].view(b, h, np_, d)[:, :, :n], None, None


def block_buffer(x: Tensor, m: int, pad: int = 0) -> Tensor:
    """See :class:`_BlockBuffer`."""
    return _BlockBuffer.apply(x, m, pad)


class WindowAttention(torch.autograd.Function):
    """``(softmax(s) V_win, logsumexp(s))`` with ``s = scale q K_win^T + bias`` for queries
    ``q [T, m, D]``, buffers ``kbuf``/``vbuf [T + W - 1, m, D]`` and ``bias`` broadcastable to
    ``[T, m, W m]``. A full-size ``bias`` is overwritten with the logits (the caller hands it over).

    Kept against the same formula in plain autograd ops because it wins (local attention's use:
    block 64, window 1, B 4, H 2, d 64, forward + backward, one CPU thread, 5 interleaved rounds):
    the windows gathered by concatenation take 2.55x the time at N 1024 and 3.26x at 4096, read
    through the strided view 1.67x and 3.04x, both 1.55x the peak memory. Compiles
    (``fullgraph``, no break)."""

    @staticmethod
    def forward(ctx, q: Tensor, kbuf: Tensor, vbuf: Tensor, bias: Tensor, width: int,
                scale: float = 1.0) -> tuple[Tensor, Tensor]:
        ctx.amp = autocast_state(q)                                 # backward as forward
        ctx.width, ctx.scale = width, scale
        keys = windows(kbuf, width).transpose(1, 2)
        in_place = not ctx.amp[1] and bias.shape == (q.shape[0], q.shape[1], keys.shape[-1])
        s = bias.baddbmm_(q, keys, alpha=scale) if in_place else torch.baddbmm(bias, q, keys, alpha=scale)
        # Log-partition from the softmax: lse = max s - log(max w) (both at the same key). Exact, and it
        # avoids exp() of the masked logits, which takes a slow path on CPU (~10x a softmax).
        top = s.amax(dim=-1)
        w = torch.softmax(s, dim=-1)
        del s
        lse = top - w.amax(dim=-1).log()
        out = torch.bmm(w, windows(vbuf, width))
        ctx.save_for_backward(q, kbuf, vbuf, w, out)
        return out, lse

    @staticmethod
    def backward(ctx, d_out: Tensor, d_lse: Tensor):
        q, kbuf, vbuf, w, out = ctx.saved_tensors
        width, scale = ctx.width, ctx.scale
        with autocast_as(ctx.amp):
            dw = torch.bmm(d_out, windows(vbuf, width).transpose(1, 2))
            dvbuf = fold(w, d_out, width)
            ds = dw.sub_((d_out * out).sum(-1, keepdim=True) - d_lse[..., None]).mul_(w)   # d/d(logits)
            dq = torch.bmm(ds, windows(kbuf, width))
            if scale != 1.0:
                dq.mul_(scale)
            dkbuf = fold(ds, q, width, scale)
        return dq.to(q.dtype), dkbuf.to(kbuf.dtype), dvbuf.to(vbuf.dtype), None, None, None
