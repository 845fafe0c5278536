"""bfloat16 for every variant: under autocast (``torch.autocast(device, bfloat16)``, float32
parameters, as ``trainer.precision=bf16-mixed`` runs) and with the mixer and its inputs cast
(``.to(torch.bfloat16)``), outputs and gradients are finite and within a stated tolerance of float32;
a cast mixer returns bfloat16 (a float32 result would double the activation memory downstream and
fail the bf16 output projection). And ``trainer.precision=bf16-mixed`` trains through run.py.

The tolerances (``TOL_OUT``, ``TOL_GRAD``, and each spec's ``precision`` allowances) and the comparison are
:mod:`lra.checks.precision`'s, which ``python run.py mode=check`` runs on one variant; its module
docstring says where each bound comes from.

Variants run at small structure sizes (each spec's ``small``, and ``precision["small"]``) so that 37 tokens
span several blocks, clusters and segments, and the plans (random blocks, sorting, windows, segments,
k-means) are exercised in bfloat16.
"""
from __future__ import annotations

import json

import pytest
import torch

from lra.checks.precision import low_precision
from tests.attention_harness import DEVICE
from tests.conftest import TINY_LISTOPS
from tests.known_failures import variant_cases


def bf16_case(name: str, how: str, mode: str, low: torch.dtype = torch.bfloat16) -> None:
    """``name`` in ``mode`` under autocast to ``low`` or cast to it, against float32
    (:func:`lra.checks.precision.low_precision`); the message names the dtype and the setting."""
    problem = low_precision(name, how, mode, low, DEVICE)
    assert problem is None, f"{name}: {problem}"


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("name", variant_cases("bf16_autocast"))
def test_autocast_bf16_matches_float32(name, mode):
    bf16_case(name, "autocast", mode)


@pytest.mark.parametrize("mode", ["eval", "train"])
@pytest.mark.parametrize("name", variant_cases("bf16_cast"))
def test_cast_bf16_matches_float32(name, mode):
    bf16_case(name, "cast", mode)


@pytest.mark.slow  # one run through run.py (startup dominates: 44 s measured on the loaded shared 2-core machine)
def test_bf16_mixed_trains_through_the_cli(cli):
    """performer returns float32 under autocast (its feature map runs in float32), so this run also
    carries mixed dtypes through the shell and the heads; the loss must stay finite (the module raises
    on a non-finite loss) and the run must finish its steps and its test."""
    cli("attention=performer", *TINY_LISTOPS, "trainer.precision=bf16-mixed", "trainer.max_steps=3",
        "task.val_every=3", "trainer.enable_progress_bar=false")
    (path,) = (cli.cwd / "results" / "runs").glob("*.json")
    rec = json.loads(path.read_text())
    assert rec["status"] == "finished" and rec["config"]["trainer"]["precision"] == "bf16-mixed"
    assert rec["metrics"]["train_steps"] == 3 and 0.0 <= rec["metrics"]["test_acc"] <= 1.0
