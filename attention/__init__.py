"""Attention variants for the LRA suite.

Every variant is a :class:`attention.base.Mixer` (per-head token mixing of q, k, v under a
padding mask) wrapped by the shared :class:`attention.shell.MultiHeadAttention`. A variant's
public name is the name of its YAML file under ``conf/attention/``; see :mod:`attention.registry`.
"""
from attention.base import Mixer
from attention.masking import zero_padded
from attention.padding import Padding
from attention.shell import MultiHeadAttention

__all__ = ["Mixer", "MultiHeadAttention", "Padding", "zero_padded"]
