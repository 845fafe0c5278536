"""Nyströmformer attention (Xiong et al. 2021, "Nyströmformer: A Nyström-Based Algorithm for
Approximating Self-Attention").

The Nyström approximation of softmax attention with m landmarks (section 3 of the paper)::

    out = softmax(Q K~^T / sqrt(d)) · pinv(softmax(Q~ K~^T / sqrt(d))) · (softmax(Q~ K^T / sqrt(d)) V)
          [N x m]                     [m x m]                            [m x N]  [N x d]

with landmarks Q~, K~ the segment means of Q and K, and pinv the iterative Moore-Penrose
pseudo-inverse Z_{j+1} = 1/4 Z_j (13 I - A Z_j (15 I - A Z_j (7 I - A Z_j))), started at
Z_0 = A^T / (||A||_1 ||A||_inf) and run for ``pinv_iterations`` (6) steps. An optional depthwise
convolution over the sequence of V (one kernel per head, ``conv_kernel`` 33 as in the paper) is
added as a skip connection.

Choices the paper leaves open, written down:

* Landmarks with padding: segments are formed over each sample's REAL tokens only: the r-th real
  token (r = 0..n_real-1) goes to segment floor(r * m / n_real), and a landmark is the mean of its
  segment. Padded tokens are in no segment (one port averaged them in), so a right-padded sample
  gives exactly what it gives unpadded; when n_real is a multiple of m this is the paper's
  contiguous equal segments, otherwise segment sizes differ by at most one.
* Fewer real tokens than landmarks: each real token is its own landmark and the empty segments are
  masked: they receive no weight in the two left factors and their rows/columns of the m x m
  matrix are replaced by the identity, which keeps the matrix well-posed and its pseudo-inverse
  block-diagonal, so empty landmarks contribute exactly nothing. ``num_landmarks`` is also clamped
  to ``max_len``.
* The pseudo-inverse initialisation uses the norms of each sample's and each head's own matrix
  (one port took a max over the whole batch and all heads, which makes a sample's output depend
  on the rest of the batch).
* The convolution (one kernel per head, shared by the head's channels, no bias, as in the
  authors' code) sees V with padded positions zeroed (zero padding of the sequence at both ends as
  well), so padded tokens contribute nothing to it; its output at padded positions is zeroed.
* Scaling 1/sqrt(d) on every logit matrix, as in softmax attention. A sample with no real token
  gives zeros.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention.base import Mixer, require_positive
from attention.masking import neg_fill, zero_padded


def iterative_pinv(a: Tensor, iterations: int = 6) -> Tensor:
    """Moore-Penrose pseudo-inverse of ``a`` ``[..., m, m]`` by the paper's cubic iteration,
    initialised per matrix (per sample and head), not by a max over the batch."""
    eye = torch.eye(a.shape[-1], dtype=a.dtype, device=a.device)
    norm_1 = a.abs().sum(dim=-2).amax(dim=-1)        # max column sum
    norm_inf = a.abs().sum(dim=-1).amax(dim=-1)      # max row sum
    z = a.transpose(-1, -2) / (norm_1 * norm_inf)[..., None, None]
    for _ in range(iterations):
        az = a @ z
        z = 0.25 * z @ (13 * eye - az @ (15 * eye - az @ (7 * eye - az)))
    return z


def segment_assignment(mask: Tensor, m: int) -> Tensor:
    """``[B, N, m]`` 0/1 matrix: real token -> its landmark segment; padded tokens in none."""
    rank = mask.long().cumsum(dim=-1) - 1
    n_real = mask.long().sum(dim=-1, keepdim=True).clamp_min(1)
    seg = torch.div(rank.clamp_min(0) * m, n_real, rounding_mode="floor")
    return F.one_hot(seg, m) * mask[..., None]


class NystromAttention(Mixer):
    def __init__(
        self,
        n_heads: int,
        head_dim: int,
        max_len: int,
        layer_idx: int = 0,
        num_landmarks: int = 32,
        pinv_iterations: int = 6,
        conv_kernel: int | None = 33,
    ) -> None:
        super().__init__(n_heads, head_dim, max_len, layer_idx)
        require_positive(num_landmarks=num_landmarks, pinv_iterations=pinv_iterations)
        self.num_landmarks = min(num_landmarks, max_len)
        self.pinv_iterations = pinv_iterations
        self.conv_weight = None
        if conv_kernel:
            if conv_kernel % 2 == 0:
                raise ValueError(f"conv_kernel={conv_kernel} must be odd (same-length output)")
            bound = conv_kernel ** -0.5   # nn.Conv default init (fan-in = kernel size)
            self.conv_weight = nn.Parameter(torch.empty(n_heads, conv_kernel).uniform_(-bound, bound))

    def conv_skip(self, v: Tensor) -> Tensor:
        """Depthwise convolution along the sequence, one kernel per head shared by its channels.

        Run as a conv1d over H * d channels (each channel its head's kernel): ~3x faster on CPU than
        the equivalent (kernel x 1) conv2d over H channels."""
        b, h, n, d = v.shape
        kernel = self.conv_weight.shape[-1]
        w = self.conv_weight.to(v.dtype).repeat_interleave(d, dim=0)[:, None, :]   # [H * d, 1, kernel]
        y = F.conv1d(v.transpose(-1, -2).reshape(b, h * d, n), w, padding=kernel // 2, groups=h * d)
        return y.view(b, h, d, n).transpose(-1, -2)

    def forward(self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, x: Tensor) -> Tensor:
        m = self.num_landmarks
        dtype = q.dtype
        neg = neg_fill(dtype)
        scale = self.head_dim ** -0.5
        keep = mask[:, None, :, None].to(dtype)

        seg = segment_assignment(mask, m).to(dtype)                       # [B, N, m]
        counts = seg.sum(dim=1)                                           # [B, m]
        valid = counts > 0                                                # [B, m] non-empty landmarks
        inv = (1.0 / counts.clamp_min(1.0))[:, None, :, None]
        q_land = torch.einsum("bnm,bhnd->bhmd", seg, q) * inv
        k_land = torch.einsum("bnm,bhnd->bhmd", seg, k) * inv

        land_bias = torch.zeros_like(counts).masked_fill(~valid, neg)[:, None, None, :]
        key_bias = torch.zeros(mask.shape, dtype=dtype, device=q.device).masked_fill(~mask, neg)[:, None, None, :]
        kernel_1 = torch.softmax((q * scale) @ k_land.transpose(-1, -2) + land_bias, dim=-1)     # [B,H,N,m]
        kernel_3 = torch.softmax((q_land * scale) @ k.transpose(-1, -2) + key_bias, dim=-1)      # [B,H,m,N]
        kernel_3 = kernel_3 * valid[:, None, :, None].to(dtype)

        # m x m core: empty landmarks become identity rows/columns (block-diagonal, inert).
        kernel_2 = torch.softmax(q_land @ k_land.transpose(-1, -2) * scale + land_bias, dim=-1)
        pair = (valid[:, :, None] & valid[:, None, :])[:, None]
        eye = torch.eye(m, dtype=dtype, device=q.device)
        kernel_2 = torch.where(pair, kernel_2, eye.expand_as(kernel_2))

        core = iterative_pinv(kernel_2, self.pinv_iterations)
        out = kernel_1 @ (core @ (kernel_3 @ (v * keep)))
        if self.conv_weight is not None:
            out = out + self.conv_skip(v * keep)
        return zero_padded(out, mask)
