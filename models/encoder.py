"""Pre-LN transformer encoder: x + Attn(LN(x)), x + FFN(LN(x)), final LayerNorm."""
from __future__ import annotations

from typing import Callable

from torch import Tensor, nn

from attention.base import Mixer
from attention.padding import Padding
from attention.shell import MultiHeadAttention


class EncoderBlock(nn.Module):
    def __init__(
        self, d_model: int, n_heads: int, d_ffn: int, dropout: float,
        mixer: Callable[..., Mixer], max_len: int, layer_idx: int,
    ) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(d_model)
        self.attn = MultiHeadAttention(d_model, n_heads, mixer, max_len=max_len, layer_idx=layer_idx)
        self.norm2 = nn.LayerNorm(d_model)
        self.ffn = nn.Sequential(
            nn.Linear(d_model, d_ffn), nn.GELU(), nn.Dropout(dropout), nn.Linear(d_ffn, d_model)
        )
        self.dropout = nn.Dropout(dropout)

    def attend(self, x: Tensor, pad: Padding) -> Tensor:
        return x + self.dropout(self.attn(self.norm1(x), pad))

    def feed_forward(self, x: Tensor) -> Tensor:
        return x + self.dropout(self.ffn(self.norm2(x)))

    def forward(self, x: Tensor, pad: Padding) -> Tensor:
        return self.feed_forward(self.attend(x, pad))


class Encoder(nn.Module):
    def __init__(
        self, d_model: int, n_layers: int, n_heads: int, d_ffn: int, dropout: float,
        mixer: Callable[..., Mixer], max_len: int,
    ) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            EncoderBlock(d_model, n_heads, d_ffn, dropout, mixer, max_len, i) for i in range(n_layers)
        )
        self.norm = nn.LayerNorm(d_model)

    def forward(self, x: Tensor, pad: Padding) -> Tensor:
        for block in self.blocks:
            x = block(x, pad)
        return self.norm(x)
