"""The contract of attention/base.py, checked for EVERY variant in conf/attention/ (new YAML files
are covered automatically): shapes, padding invariance (eval and train), invariance to how far a
sequence is padded, independence from the rest of the batch, fully padded rows, gradients,
determinism. Known failures are listed once, in tests/known_failures.py.

The properties are :mod:`lra.checks.contract`'s, the ones ``python run.py mode=check attention=<name>``
runs on one variant: each answers None or a sentence naming the tensor, the magnitude and the usual
cause, which is the assertion message here. The padding, padded-length and batch checks run at
SMALL_STRUCTURE, so that 37 tokens span several blocks, clusters and segments; the fuzz test covers
the defaults. Stochastic variants draw in training; a train-mode comparison gives both calls the same
draws by building each mixer from the same seed (fresh generator streams, fresh buffers) under the
same ambient RNG state."""
from __future__ import annotations

import pytest
import torch
from torch import Tensor

from attention.registry import variant_names
from lra.checks import contract
from tests.attention_harness import B, DEVICE, DH, H, N, lengths_mask, make_mixer, qkvx
from tests.contract_sizes import SMALL_STRUCTURE
from tests.known_failures import variant_cases

VARIANTS = variant_names()


def on_device(*tensors: Tensor) -> list[Tensor]:
    return contract.on_device(DEVICE, *tensors)


def holds(name: str, problem: str | None) -> None:
    assert problem is None, f"{name}: {problem}"


@pytest.mark.parametrize("name", VARIANTS)
def test_shape_and_finite(name):
    mixer = make_mixer(name).to(DEVICE).eval()
    q, k, v, x = on_device(*qkvx())
    mask = lengths_mask([N, 20, 1]).to(DEVICE)
    out = mixer(q, k, v, mask, x)
    assert out.shape == (B, H, N, DH)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("name", VARIANTS)
def test_padding_invariance(name, mode):
    """Changing what sits at padded positions changes nothing at real positions, and in training
    neither the aux loss nor any state update (buffers such as routing centroids) sees it."""
    holds(name, contract.padding_invariance(name, mode, DEVICE, **SMALL_STRUCTURE.get(name, {})))


@pytest.mark.parametrize("name", variant_cases("padded_length_eval"))
def test_padded_length_invariance_eval(name):
    """The same sequences padded to N and to 2N give the same outputs at their real positions."""
    holds(name, contract.padded_length_invariance(name, "eval", DEVICE, **SMALL_STRUCTURE.get(name, {})))


@pytest.mark.parametrize("name", variant_cases("padded_length_train"))
def test_padded_length_invariance_train(name):
    """As above in training, with the same draws (see contract.TRAIN_NOISE_OFF)."""
    holds(name, contract.padded_length_invariance(name, "train", DEVICE, **SMALL_STRUCTURE.get(name, {})))


@pytest.mark.parametrize("name", variant_cases("batch_independence"))
def test_batch_independence(name):
    """A row's eval output is the same alone (batch of one) and inside a batch of other rows."""
    holds(name, contract.batch_independence(name, DEVICE, **SMALL_STRUCTURE.get(name, {})))


@pytest.mark.parametrize("name", VARIANTS)
def test_fully_padded_row_is_zero_and_finite(name):
    holds(name, contract.fully_padded_row(name, DEVICE))


@pytest.mark.parametrize("name", VARIANTS)
def test_gradients_reach_inputs_and_parameters(name):
    holds(name, contract.gradients(name, DEVICE))


@pytest.mark.parametrize("name", VARIANTS)
def test_deterministic_for_a_seed(name):
    holds(name, contract.determinism(name, DEVICE))


@pytest.mark.parametrize("name, setting, value", [
    ("abc_mlp", "memory_size", 0), ("linear", "eps", 0.0), ("linformer", "k", 0), ("longformer", "window", -1),
    ("memformer", "segment_len", 0), ("nystromformer", "pinv_iterations", 0), ("performer", "nb_features", 0),
    ("performer", "redraw_interval", -1), ("routing", "window", 0), ("sinkhorn", "temperature", 0.0),
    ("synthesizer_random", "rank", 0), ("clustered", "topk", 0), ("clustered", "iterations", -1),
])
def test_bad_numeric_setting_is_named(name, setting, value):
    with pytest.raises(ValueError, match=rf"attention\.{setting}={value} must be .*conf/attention"):
        make_mixer(name, **{setting: value})
