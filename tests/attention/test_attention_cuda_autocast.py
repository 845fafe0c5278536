"""Mixed-precision training as CUDA runs it, on CPU: every variant under CUDA autocast's dtype policy
(:mod:`lra.checks.cuda_autocast`), in bfloat16 and float16.

CPU autocast keeps reductions, softmax, exp and LayerNorm in the low dtype; CUDA autocast runs them
in float32. A custom autograd Function whose backward re-enters the forward's autocast therefore
meets float32 values next to low-precision buffers only on CUDA: i_clustered's backward crashed
there (``index_add_(): self (BFloat16) and source (Float) must have the same scalar type``) while
every CPU test passed. Here each variant's training forward and backward runs under the emulated
CUDA policy and is held to the bf16 contract test's tolerances against float32
(:func:`tests.attention.test_attention_bf16.bf16_case`); and a 2-layer network of every config
(Memformer with MRBP included) trains a step with finite, correctly typed results.
"""
from __future__ import annotations

import contextlib

import pytest
import torch

from attention.registry import variant_names
from tests.attention.test_attention_bf16 import bf16_case
from tests.cuda_autocast import SKIPPED, cuda_autocast_policy
from tests.tiny_network import step_batch, tiny_network

LOW = [pytest.param(torch.bfloat16, id="bf16"), pytest.param(torch.float16, id="fp16")]


@pytest.fixture
def cuda_autocast():
    """CPU autocast casting as CUDA autocast does, for the test's duration."""
    with cuda_autocast_policy():
        yield


def test_the_emulation_casts_as_cuda(cuda_autocast):
    """CUDA's float32 list (reductions, softmax, exp, LayerNorm) in forward and in a backward that
    re-enters autocast; no promotion of index_copy (CPU's list has it, CUDA's not)."""
    assert all("name" in name.lower() for name in SKIPPED), f"op overloads missing from this torch: {SKIPPED}"  # named-tensor ones only
    x = torch.randn(4, 8, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = torch.nn.functional.linear(x, torch.randn(8, 8))
        assert y.dtype == torch.bfloat16
        for out in (y.sum(1), y.softmax(-1), y.exp(), torch.nn.functional.layer_norm(y, (8,)), y.norm(dim=-1)):
            assert out.dtype == torch.float32
        assert y.sum(1, dtype=torch.bfloat16).dtype == torch.bfloat16   # an explicit dtype is kept
        with pytest.raises(RuntimeError, match="same dtype"):
            torch.zeros(4, 8, dtype=torch.bfloat16).index_copy(0, torch.arange(4), y.float())

    class Reenters(torch.autograd.Function):
        @staticmethod
        def forward(ctx, t):
            return t.clone()

        @staticmethod
        def backward(ctx, g):
            with torch.autocast("cpu", dtype=torch.bfloat16):
                assert g.sum(0).dtype == torch.float32
            return g

    Reenters.apply(x).sum().backward()


def test_the_emulation_ends_with_its_block():
    with cuda_autocast_policy(), torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.randn(3, dtype=torch.bfloat16).sum().dtype == torch.float32
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.randn(3, dtype=torch.bfloat16).sum().dtype == torch.bfloat16


# q, k, v as the shell gives them under autocast (low dtype), in both dtypes; and float32 q, k, v
# in bfloat16 (the bf16 contract test's setting; float16 cannot hold float32's mask fills).
SETTINGS = [pytest.param("autocast-shell", torch.bfloat16, id="bf16"),
            pytest.param("autocast-shell", torch.float16, id="fp16"),
            pytest.param("autocast", torch.bfloat16, id="bf16-fp32-inputs")]


@pytest.mark.slow
@pytest.mark.parametrize(("how", "low"), SETTINGS)
@pytest.mark.parametrize("name", variant_names())
def test_training_under_cuda_autocast_matches_float32(cuda_autocast, name, how, low):
    bf16_case(name, how, "train", low)


NETWORKS = [pytest.param(n, {}, id=n) for n in variant_names()]
NETWORKS += [pytest.param("memformer", {"mrbp": True}, id="memformer-mrbp"),
             pytest.param("memformer", {"memory": "per_layer", "mrbp": True}, id="memformer-per_layer-mrbp")]


@pytest.mark.slow
@pytest.mark.parametrize("low", LOW)
@pytest.mark.parametrize(("name", "overrides"), NETWORKS)
def test_network_trains_a_step_under_cuda_autocast(cuda_autocast, name, overrides, low):
    """The whole model (shell, encoder or Memformer's segment loop, pooling, head, loss) on a padded
    batch: logits in float32 or the low dtype, a finite loss, a finite float32 gradient for every
    parameter that gets one in float32."""
    ids, mask, label = step_batch(padded=True)
    grads = {}
    for amp in (False, True):
        net = tiny_network(name, **overrides).train()
        with torch.autocast("cpu", dtype=low, enabled=amp):
            logits = net(ids, mask)
            loss = torch.nn.functional.cross_entropy(logits, label)
            aux = net.pop_aux_loss()
        (loss if aux is None else loss + aux).backward()
        grads[amp] = {k: p.grad for k, p in net.named_parameters() if p.grad is not None}
    assert logits.dtype in (low, torch.float32) and torch.isfinite(loss)
    assert grads[True].keys() == grads[False].keys()
    for k, g in grads[True].items():
        assert g.dtype == torch.float32 and torch.isfinite(g).all(), f"gradient of {k}: {g.dtype}, finite: {torch.isfinite(g).all()}"


@pytest.mark.slow
@pytest.mark.parametrize("policy", ["cuda", "cpu"])
@pytest.mark.parametrize("low", LOW)
@pytest.mark.parametrize("memory", ["unified", "per_layer"])
def test_mrbp_equals_bptt_under_autocast(memory, low, policy):
    """MRBP replays each segment under the forward's autocast state: its gradients are BPTT's, bit
    for bit (the reentrant checkpoint differed by bfloat16 rounding under CPU autocast)."""
    ids, mask, label = step_batch(padded=True)
    grads = []
    for mrbp in (False, True):
        net = tiny_network("memformer", memory=memory, mrbp=mrbp).train()
        with cuda_autocast_policy() if policy == "cuda" else contextlib.nullcontext():
            with torch.autocast("cpu", dtype=low):
                loss = torch.nn.functional.cross_entropy(net(ids, mask), label)
            loss.backward()
        grads.append({k: p.grad for k, p in net.named_parameters()})
    for k, g in grads[0].items():
        torch.testing.assert_close(grads[1][k], g, rtol=0, atol=0, msg=f"gradient of {k}")
