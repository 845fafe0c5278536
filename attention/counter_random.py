"""Counter-based random numbers: draws that are a pure function of (key, counter, position).

Why: a ``torch.Generator`` is an opaque object to ``torch.compile`` (a graph break at every draw
that names one) and a stateful one at that. Every variant (:meth:`attention.base.Mixer.rand`)
draws instead from an integer hash of the mixer's key, a step counter kept in a device buffer and each
element's position: a few integer tensor ops that compile into the graph, give the same values in
eager and compiled code, on every device, and resume exactly from the counter.

The hash is Wellons' ``lowbias32`` construction (xorshift-multiply rounds) applied twice, computed
in int64 with multipliers below 2**31 so no product overflows; 23 bits of it make a float32
uniform in (0, 1) (never 0 or 1: ``log`` of it is finite). Normals use Box-Muller on two
uniforms. These are not cryptographic and not a ``torch.Generator``'s streams: runs recorded
before issue 62 drew random variants from generator streams eagerly, so a new run of one draws
different (equally distributed) values.
"""
from __future__ import annotations

import math

import torch
from torch import Tensor

_MASK32 = 0xFFFFFFFF


def _mix32(x: Tensor) -> Tensor:
    """A 32-bit avalanche hash of non-negative int64 values below 2**32."""
    x = x ^ (x >> 16)
    x = (x * 0x7FEB352D) & _MASK32
    x = x ^ (x >> 15)
    x = (x * 0x4C8E9CF5) & _MASK32
    return x ^ (x >> 16)


def key32(seed: int) -> int:
    """A 32-bit key from a 62-bit seed (both halves count)."""
    return (seed ^ ((seed >> 32) * 0x9E3779B1)) & _MASK32


def uniform(shape: tuple[int, ...] | torch.Size, key: int, counter: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Uniform draws in (0, 1) of ``shape`` for ``(key, counter)``; ``counter`` is an int64 scalar
    tensor (its device is the draws' device)."""
    n = math.prod(shape)
    stream = _mix32((counter & _MASK32) ^ key)
    bits = _mix32(_mix32(torch.arange(n, device=counter.device, dtype=torch.int64) ^ stream) ^ key)
    return unit_interval(bits, dtype).reshape(shape)


def unit_interval(bits: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """32-bit hashes -> floats strictly inside (0, 1): the top 23 bits plus one half, so the largest
    value is 1 - 2**-24 (representable in float32; 24 bits would round up to 1.0)."""
    u = ((bits >> 9).to(torch.float64 if dtype == torch.float64 else torch.float32) + 0.5) * 2.0 ** -23
    return u.to(dtype)


def normal(shape: tuple[int, ...] | torch.Size, key: int, counter: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """Standard normal draws of ``shape`` (Box-Muller on two uniform draws per element)."""
    n = math.prod(shape)
    u = uniform((2, n), key, counter, torch.float32 if dtype != torch.float64 else dtype)
    z = torch.sqrt(-2.0 * torch.log(u[0])) * torch.cos(2.0 * math.pi * u[1])
    return z.to(dtype).reshape(shape)
