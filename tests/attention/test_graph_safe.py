"""What ``torch.compile`` and a GPU need of every config (issues 25 and 62), measured on CPU.

For every config in ``conf/attention/`` and a padded and an unpadded batch (tiny network, training
mode, padding stated as ``LRAModule`` states it, :mod:`tests.graph_safe`):

* a training forward and backward makes no host sync (the first one raises, naming its line:
  ``.item()``, ``bool()``, ``.tolist()``, data-dependent shapes, host-built tensors);
* ``torch.compile(fullgraph=True, dynamic=False)`` of the network (as ``trainer.compile`` compiles
  it) has no graph break (``fullgraph=True`` makes the first one an error naming its line) and runs
  two training steps whose loss and gradients match the same network run eagerly (float32
  tolerances of the contract tests). Each (config,
  padding) pair is compiled once: the padded batch of the ``INDUCTOR`` configs with Inductor, the
  backend ``trainer.compile`` uses, which generates C++ on CPU (their attention; see
  ``INDUCTOR_PART``); every other pair with ``aot_eager_decomp_partition`` (the graph capture,
  functionalisation, decompositions and forward/backward partition Inductor gets, run by eager
  kernels; plain ``aot_eager`` hits a PyTorch stride bug in the traced backward of ``elu`` under a
  transpose).

A separate ``torch._dynamo.explain`` per pair (every break with its reason) was dropped in issue 35:
the compile already fails at any break, so it proved nothing more for 196 s of CPU; ``python -m
tests.graph_safe`` still prints it when a compile fails and all the reasons are wanted.
"""
from __future__ import annotations

import pytest
import torch
import torch._inductor.config

from attention.registry import variant_names
from tests.attention_harness import ONE_PER_MODULE
from lra.checks.contract import compiled_matches_eager
from tests.graph_safe import SCALAR_CPP, aten_ops, step_under_forbidden_syncs

CONFIGS = variant_names()
PADDING = [pytest.param(True, id="padded"), pytest.param(False, id="unpadded")]
# Inductor's cost on a fresh machine (an empty kernel cache) is its lowering and a C++ compile per
# kernel: 472 s of CPU for one config of each of the 17 attention modules (2026-11-30, beside two
# training runs), the largest part of the suite. These 9 of them lower, between them, every operator
# kind (after Inductor's decompositions) that any module's training step produces: 96 kinds, found
# by a greedy cover and checked by test_inductor_configs_lower_every_operator_kind. The other 8
# modules (abc, adamra, linformer, longformer, sinkhorn, softmax, sparse, synthesizer) only combine
# operators lowered here; their graphs are still captured, decomposed and partitioned whole by the
# aot_eager test, padded and unpadded.
INDUCTOR = ["bigbird", "i_clustered", "linear", "local", "memformer", "nystromformer", "performer", "reformer",
            "routing"]


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
    torch._dynamo.reset()


@pytest.mark.parametrize("padded", PADDING)
@pytest.mark.parametrize("name", CONFIGS)
def test_no_host_syncs(name: str, padded: bool) -> None:
    loss = step_under_forbidden_syncs(name, padded)
    assert torch.isfinite(loss)


# Memformer's segment loop is unrolled into the graph: two segments of 32 (the second wholly padded
# for one sample, partly for two) trace the first read of the initial memory and a read of a written
# one, at a quarter of the eight segments' compile time (29.5 s against 7.4 s for aot_eager).
COMPILE_SIZES = {"memformer": {"segment_len": 32}}


def _assert_matches(name: str, padded: bool, backend: str, part: str = "network") -> None:
    problem = compiled_matches_eager(name, padded, backend=backend, part=part, **COMPILE_SIZES.get(name, {}))
    assert problem is None, f"{name}: {problem}"


# The padded batch of an INDUCTOR config is compiled by Inductor below (same capture, decompositions
# and partition, then generated code; on CPU no slower once warm), so it is not compiled here again.
AOT_CASES = [pytest.param(n, padded, id=f"{n}-{'padded' if padded else 'unpadded'}")
             for n in CONFIGS for padded in (True, False) if not (padded and n in INDUCTOR)]


@pytest.mark.slow
@pytest.mark.parametrize("name,padded", AOT_CASES)
def test_fullgraph_compile_matches_eager(name: str, padded: bool) -> None:
    _assert_matches(name, padded, "aot_eager_decomp_partition")


# Inductor compiles the attention of each module (projections and mixer, the code that differs
# between configs) with the rest of the network run eagerly; Memformer's whole network, because its
# segment loop and memory writes live in its encoder: that compile also covers, once, the layers
# every network shares (embedding, norms, feed-forward, pooling, loss). A whole network has about
# twice the kernels of its attention (linformer: 23 against 13), and the aot_eager test already
# captures every network whole. On an empty cache, beside two training runs: the other 16 modules'
# attention took 747 s of CPU (2026-11-29); their whole networks 1101 s in a CI run (2026-11-28).
INDUCTOR_PART = {"memformer": "network"}


@pytest.mark.slow
@pytest.mark.xdist_group("inductor")  # one worker pays Inductor's first compile
@pytest.mark.parametrize("name", INDUCTOR)
def test_inductor_compile_matches_eager(name: str) -> None:
    with torch._inductor.config.patch(SCALAR_CPP):
        _assert_matches(name, True, "inductor", part=INDUCTOR_PART.get(name, "attention"))


def test_one_config_per_attention_module() -> None:
    from attention.registry import build_mixer

    modules = [build_mixer(n).func.__module__ for n in ONE_PER_MODULE]
    assert sorted(modules) == sorted({build_mixer(n).func.__module__ for n in CONFIGS}), "a module twice or none"
    assert set(INDUCTOR) <= set(ONE_PER_MODULE)


@pytest.mark.slow
def test_inductor_configs_lower_every_operator_kind() -> None:
    """A module whose step gains an operator no INDUCTOR config has (a new attention, a changed
    one) fails here, naming it: add that config to INDUCTOR."""
    ops = {name: aten_ops(name, True, part=INDUCTOR_PART.get(name, "attention"), **COMPILE_SIZES.get(name, {}))
           for name in ONE_PER_MODULE}
    lowered = set().union(*(ops[name] for name in INDUCTOR))
    missing = {name: sorted(ops[name] - lowered) for name in ONE_PER_MODULE if ops[name] - lowered}
    assert not missing, f"operators no Inductor config lowers, by config: {missing}; add the config to INDUCTOR"
    assert len(lowered) > 50, sorted(lowered)  # the recording saw whole steps, forward and backward


def test_every_config_is_compiled_padded_and_unpadded() -> None:
    """Between them the aot_eager test and the Inductor test compile every (config, padding) pair."""
    pairs = {tuple(p.values) for p in AOT_CASES} | {(n, True) for n in INDUCTOR}
    assert pairs == {(n, padded) for n in CONFIGS for padded in (True, False)}


# -- the counter-based draws --------------------------------------------------------------------------

def test_counter_draws_advance_in_training_and_repeat_in_eval() -> None:
    from attention.registry import build_mixer

    torch.manual_seed(0)
    mixer = build_mixer("softmax")(n_heads=2, head_dim=4, max_len=8)
    first, second = mixer.rand((3,), "cpu"), mixer.rand((3,), "cpu")
    assert not torch.equal(first, second) and int(mixer.draws) == 2
    mixer.eval()
    assert torch.equal(mixer.randn((3,), "cpu"), mixer.randn((3,), "cpu")) and int(mixer.draws) == 2
    state = mixer.get_extra_state()
    assert state == {"seed": mixer.seed, "draws": 2}
    mixer.draws.zero_()
    mixer.set_extra_state({**state, "streams": {}})    # a checkpoint from before the counter-only stream
    assert int(mixer.draws) == 2
