"""Graph-safe forwards whose padding the host did not state (issue 38).

Graph-safe mode never reads a mask: :func:`attention.graph_safe.has_padding` answers the host's
statement (:func:`attention.graph_safe.batch_padding`) or, unstated, "padded" (the masked path,
right for any mask). A graph-safe ``has_padding`` that answered "not padded" for an unstated mask
would give padded keys weight wherever the network derives a mask and nobody restates it. The
network derives three: CLS pooling's prepended token, Memformer's segments, retrieval's two
documents flattened into one batch. So, for every config, a network called as the bench calls it
(``network(ids, mask)``: padding unstated) in graph-safe mode must give, at every real position of
the encoder's output (its own derived mask), what the masked forward gives:

* the eager forward (it reads the mask: padded), for configs whose evaluation draws nothing;
* the graph-safe forward with the padding stated, for configs whose evaluation draws (eval draws
  differ between the modes by design; the stated masked path is the same draws);

and must not change when the padded tokens change. Two layouts per config: mean pooling of one
document, and CLS pooling of two documents (dual). Float64, evaluation mode.
"""
from __future__ import annotations

import pytest
import torch
from torch import Tensor

from attention.registry import build_mixer, variant_names
from models.network import LRAClassifier
from tests.contract_sizes import SMALL_STRUCTURE

SEQ = 48
LENGTHS = [[48, 21], [30, 48], [37, 3], [6, 13]]   # per row: document 1, document 2 (dual)
# configs whose evaluation forward draws (other values in each mode): compared with the stated path
EVAL_DRAWS = {"abc_rd", "adamra_random_router", "clustered", "i_clustered", "reformer"}
LAYOUTS = [pytest.param("mean", False, id="mean"), pytest.param("cls", True, id="cls-dual")]


def network(name: str, pool: str, dual: bool) -> LRAClassifier:
    torch.manual_seed(0)
    mixer = build_mixer(name, **SMALL_STRUCTURE.get(name, {}))
    net = LRAClassifier(mixer, vocab_size=16, num_classes=3, max_len=SEQ, d_model=16, n_layers=2, n_heads=2,
                        d_ffn=32, dropout=0.0, pool=pool, dual=dual)
    return net.double().eval()


def batch(dual: bool, pad_seed: int) -> tuple[Tensor, Tensor]:
    """Padded ``ids, mask`` (``[B, 2, N]`` when dual); padded ids are random, seeded by ``pad_seed``."""
    lengths = torch.tensor(LENGTHS if dual else [row[0] for row in LENGTHS])
    mask = torch.arange(SEQ) < lengths[..., None]
    ids = torch.randint(1, 16, mask.shape, generator=torch.Generator().manual_seed(1))
    junk = torch.randint(1, 16, mask.shape, generator=torch.Generator().manual_seed(pad_seed))
    return torch.where(mask, ids, junk), mask


def encoded(net: LRAClassifier, ids: Tensor, mask: Tensor, graph_safe: bool,
            padded: bool | None) -> tuple[Tensor, Tensor]:
    """The encoder's output and its own (derived) mask, from a forward with ``padded`` stated."""
    seen: list[tuple[Tensor, Tensor]] = []
    hook = net.encoder.register_forward_hook(lambda mod, args, out: seen.append((out, args[1])))
    net.graph_safe = graph_safe
    try:
        with torch.no_grad():
            net(ids, mask, padded=padded)
    finally:
        hook.remove()
        net.graph_safe = False
    (out, derived), = seen
    return out, derived


@pytest.mark.parametrize("pool,dual", LAYOUTS)
@pytest.mark.parametrize("name", variant_names())
def test_unstated_padding_gives_the_masked_forward(name: str, pool: str, dual: bool) -> None:
    net = network(name, pool, dual)
    ids, mask = batch(dual, pad_seed=2)
    out, derived = encoded(net, ids, mask, graph_safe=True, padded=None)
    assert not derived.all() and derived.shape[1] == SEQ + (pool == "cls")
    if name in EVAL_DRAWS:
        want, want_mask = encoded(net, ids, mask, graph_safe=True, padded=True)
    else:
        want, want_mask = encoded(net, ids, mask, graph_safe=False, padded=None)
    assert torch.equal(want_mask, derived)
    real = derived[..., None].expand_as(out)
    torch.testing.assert_close(out[real], want[real], rtol=1e-6, atol=1e-8,
                               msg=lambda m: f"{name}: unstated graph-safe forward differs from the masked one: {m}")
    other, _ = encoded(net, *batch(dual, pad_seed=3), graph_safe=True, padded=None)
    torch.testing.assert_close(other[real], out[real], rtol=1e-6, atol=1e-8,
                               msg=lambda m: f"{name}: real positions depend on the padded tokens: {m}")
