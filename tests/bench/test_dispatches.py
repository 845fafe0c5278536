"""The dispatch benchmark counts what a GPU step would launch (lra/bench/dispatches.py): a fixed
count per variant, the accelerator path's (foreach AdamW, no CPU-only shortcut), side by side with
linear attention's."""
from __future__ import annotations

import pytest
import torch

from lra.bench import dispatches
from lra.bench.harness import build_step, count_dispatches


def tiny(variant: str, n: int = 32) -> dict:
    (spec,) = dispatches.specs_for(variant, [n], 2, compiled=False)
    spec["model"].update(d_model=16, d_ffn=32, n_layers=1, d_head=16)
    return spec


def test_a_count_is_the_same_every_time_and_tells_variants_apart():
    one, two = dispatches.count_one(tiny("adamra_t2a")), dispatches.count_one(tiny("adamra_t2a"))
    assert one["outermost_aten_ops"] == two["outermost_aten_ops"] > dispatches.count_one(tiny("linear"))["outermost_aten_ops"]
    assert "foreach AdamW" in one["counted"] and "batch 2," in one["counted"]


def test_the_count_takes_the_accelerator_path():
    """Counted on the mixers' accelerator choices (undone afterwards) and with a foreach AdamW: the
    per-parameter loop CPU's default AdamW runs would count one update per parameter."""
    from attention.base import Mixer

    spec = tiny("linear")
    step, model, counted = build_step(spec, torch.device("cpu"))
    seen = []
    mixer = next(m for m in model.modules() if isinstance(m, Mixer))
    mixer.register_forward_pre_hook(lambda m, args: seen.append(m.on_cpu))
    foreach = count_dispatches(counted(), torch.device("cpu"), 2, model)["outermost_aten_ops"]
    looped = count_dispatches(step, torch.device("cpu"), 2, model)["outermost_aten_ops"]
    assert seen and not any(seen) and mixer.on_cpu
    assert looped > foreach + len(list(model.parameters()))


def test_the_table_puts_each_count_beside_linear_and_its_target():
    counts = {("linear", 1024): {"outermost_aten_ops": 500}, ("adamra_t2a", 1024): {"outermost_aten_ops": 600},
              ("clustered", 1024): {"outermost_aten_ops": 1500}}
    text = dispatches.table(counts, ["linear", "adamra_t2a", "clustered"], [1024])
    assert "| adamra_t2a | 600 (1.20x) | <= 1.3x met |" in text
    assert "| clustered | 1500 (3.00x) | <= 2.0x not met |" in text


@pytest.mark.slow   # compiles a tiny model (about 10 s)
def test_compiled_counts_stand_beside_the_eager_count_of_the_same_model():
    """``--compile`` counts the eager step first and then the same model compiled: the eager column
    must stay eager (it once showed the compiled step's operators under the eager heading)."""
    spec = tiny("linear", 16) | {"compile": True}
    out = dispatches.count_one(spec)
    eager = dispatches.count_one(tiny("linear", 16))["outermost_aten_ops"]
    assert out["outermost_aten_ops"] == eager
    assert out["compiled"]["kernels"] > 0 and 0 < out["compiled"]["outermost_aten_ops"] < eager
    assert "Inductor" in out["compiled"]["counted"] and "cpu backend" in out["compiled"]["counted"]
    text = dispatches.table({("linear", 16): out, ("x", 16): {"outermost_aten_ops": 2 * eager,
                             "compiled": {"kernels": 3 * out["compiled"]["kernels"], "outermost_aten_ops": 7}}},
                            ["linear", "x"], [16])
    assert f"| x | {2 * eager} (2.00x) | {3 * out['compiled']['kernels']} (3.00x) + 7 |" in text
