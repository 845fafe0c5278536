"""Every variant, inside the full network, learns a tiny task: beats chance clearly.

60 steps: at 60 every config reached at least 0.727 (synthesizer_dense; measured 2026-11-28;
0.87-0.99 at 150), against the 0.45 asked, so the margin does not hang on the last steps."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attention.registry import build_mixer, variant_names
from models.network import LRAClassifier

N_TOK, SEQ, CLASSES = 12, 32, 4
STEPS = 60


def batch(g: torch.Generator, b: int = 64):
    """Label = which of tokens 1..4 occurs most often among the real tokens (ties: lowest)."""
    lengths = torch.randint(SEQ // 2, SEQ + 1, (b,), generator=g)
    mask = torch.arange(SEQ)[None] < lengths[:, None]
    ids = torch.randint(1, N_TOK, (b, SEQ), generator=g)
    ids = ids.masked_fill(~mask, 0)
    counts = torch.stack([((ids == c) & mask).sum(1) for c in range(1, CLASSES + 1)], 1)
    return ids, mask, counts.argmax(1)


@pytest.mark.slow
@pytest.mark.parametrize("name", variant_names())
def test_tiny_training_beats_chance(name):
    torch.manual_seed(0)
    net = LRAClassifier(build_mixer(name), vocab_size=N_TOK, num_classes=CLASSES, max_len=SEQ,
                        d_model=32, n_layers=1, n_heads=2, d_ffn=64, d_head=64, dropout=0.0)
    opt = torch.optim.AdamW(net.parameters(), lr=3e-3)
    g = torch.Generator().manual_seed(0)
    net.train()
    for _ in range(STEPS):
        ids, mask, y = batch(g)
        loss = F.cross_entropy(net(ids, mask), y)
        aux = net.pop_aux_loss()
        (loss + (aux if aux is not None else 0.0)).backward()
        opt.step()
        opt.zero_grad()
    net.eval()
    ids, mask, y = batch(torch.Generator().manual_seed(99), 512)
    with torch.no_grad():
        acc = (net(ids, mask).argmax(1) == y).float().mean().item()
    assert acc > 0.45, f"{name}: accuracy {acc:.2f} does not beat chance (0.25) clearly"
