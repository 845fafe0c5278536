"""The same seed gives identical training for every variant (randomised ones included); a
different seed gives a different one."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from attention.registry import build_mixer, variant_names
from models.network import LRAClassifier


def losses(name: str, seed: int, steps: int = 3) -> list[float]:
    torch.manual_seed(seed)
    net = LRAClassifier(build_mixer(name), vocab_size=11, num_classes=3, max_len=40, d_model=16,
                        n_layers=1, n_heads=2, d_ffn=32, d_head=16, dropout=0.1)
    opt = torch.optim.AdamW(net.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(0)  # the data is the same for every seed
    ids = torch.randint(1, 11, (4, 40), generator=g)
    mask = torch.arange(40)[None] < torch.tensor([40, 33, 20, 7])[:, None]
    y = torch.tensor([0, 1, 2, 1])
    out = []
    for _ in range(steps):
        loss = F.cross_entropy(net(ids.masked_fill(~mask, 0), mask), y)
        aux = net.pop_aux_loss()
        (loss + (aux if aux is not None else 0)).backward()
        opt.step()
        opt.zero_grad()
        out.append(loss.item())
    net.eval()
    with torch.no_grad():
        out.extend(net(ids, mask).flatten().tolist())
    return out


@pytest.mark.parametrize("name", variant_names())
def test_same_seed_same_run_different_seed_different_run(name):
    a, b, c = losses(name, 0), losses(name, 0), losses(name, 1)
    assert a == b, f"{name}: two runs with seed 0 differ"
    assert a != c, f"{name}: seeds 0 and 1 give identical runs"
