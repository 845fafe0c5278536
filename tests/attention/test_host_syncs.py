"""Host syncs of a training step, per variant, on the branches an accelerator takes.

Counted by :mod:`tests.host_syncs` (a dispatch-level spy: ``.item()``/``bool()``, ``.tolist()``,
``nonzero``, ``unique``, ``bincount``, tensors built from host data, ...) on a 2-layer network, with
the mixers on their accelerator choices (:func:`attention.base.emulate_accelerator`) and the
padding known on the host, as
``LRAModule`` knows it. Every remaining sync is named and justified in its variant's docstring.
Before this was pinned (issue 26) the same count on a padded batch gave 2 (most variants), 4 (softmax, linformer,
sinkhorn, routing, clustered), 6 (adamra, abc_rd), 28 (bigbird) and 16 / 32 (memformer / MRBP).
"""
from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest
import torch

from attention.padding import Padding
from attention.registry import build_mixer, variant_names
from models.module import LRAModule
from tests.attention_harness import float64_inputs
from tests.contract_sizes import SMALL_STRUCTURE
from tests.host_syncs import HostSyncError, count_host_syncs, forbid_host_syncs, step_syncs
from tests.tiny_network import step_batch, tiny_network

# (padded batch, unpadded batch) per training step; 0 unless listed (issue 62: every variant has none)
EXPECTED: dict[str, tuple[int, int]] = {}
CASES = [pytest.param(name, {}, id=name) for name in variant_names()]
CASES += [pytest.param("memformer", {"mrbp": True}, id="memformer-mrbp"),
          pytest.param("memformer", {"memory": "per_layer", "mrbp": True}, id="memformer-per_layer-mrbp")]


@pytest.mark.slow
@pytest.mark.parametrize(("name", "overrides"), CASES)
def test_host_syncs_per_training_step(name, overrides):
    counts = []
    for padded in (True, False):
        spy = step_syncs(name, padded, **overrides)
        counts.append(spy.syncs)
        expected = EXPECTED.get(name, (0, 0))[0 if padded else 1]
        assert spy.syncs == expected, (f"{name} {overrides}, {'padded' if padded else 'unpadded'} batch: "
                                       f"{spy.syncs} host syncs, expected {expected}: {dict(spy.by_site())}")
    if any(counts):
        mixer = type(build_mixer(name, **SMALL_STRUCTURE.get(name, {}))(n_heads=2, head_dim=8, max_len=64))
        doc = importlib.import_module(mixer.__module__).__doc__
        assert "host sync" in doc.lower(), f"{mixer.__module__}: say which host syncs remain and why"


@pytest.mark.parametrize(("name", "overrides", "expected"), [
    ("softmax", {}, 1), ("linear", {}, 1), ("memformer", {"mrbp": True}, 1), ("bigbird", {}, 1)])
def test_without_a_host_hint_the_padding_is_read_once_per_step(name, overrides, expected):
    """Called as ``network(ids, mask)``, the network reads the padding from the device once
    (:meth:`attention.padding.Padding.of`), for every layer, segment and MRBP replay."""
    assert step_syncs(name, True, host_padding=False, **overrides).syncs == expected


def test_the_spy_sees_each_kind_of_sync():
    x = torch.arange(6.0)
    with count_host_syncs() as spy:
        bool(x.all()), x.tolist(), x.nonzero(), torch.unique(x), torch.tensor([1, 2])
        torch.bincount(x.long()), x[x > 2], x.sum().item()
    kinds = [e.kind for e in spy.events]
    assert kinds == ["item", "tolist", "nonzero", "unique", "tensor from host data", "bincount", "boolean index",
                     "item"], kinds
    assert spy.syncs == 9   # bincount reads its min and max
    with pytest.raises(HostSyncError, match=r"item\) at"), forbid_host_syncs():
        bool(x.any())


def test_padding_is_read_once_when_unstated_and_believed_when_stated():
    mask = torch.tensor([[True, False]])
    with count_host_syncs() as spy:
        assert Padding.of(mask).any                          # read: one host sync
        assert not Padding.of(mask, False).any               # stated: believed, not read
        assert Padding.of(torch.ones(1, 2, dtype=torch.bool), True).any   # "padded" is always correct
    assert spy.syncs == 1


@pytest.mark.parametrize("name", ["i_clustered", "routing"])
def test_the_cpu_choices_give_the_accelerator_results_without_a_host_sync(name):
    """The choices these variants make from ``Mixer.on_cpu`` (i_clustered's exact part in 2 MiB
    slices, routing's local heads and fallback as two block attentions) compute the accelerator
    path's outputs and gradients (float64); neither reads anything on the host."""
    from attention.base import emulate_accelerator

    results = []
    for accelerator in (False, True):
        torch.manual_seed(0)
        mixer = build_mixer(name, **SMALL_STRUCTURE[name])(n_heads=2, head_dim=8, max_len=64).double().train()
        if name == "i_clustered":
            mixer.cpu_slice_bytes = 2600       # slices of 5 chunks on the CPU path, the last one short
        if accelerator:
            emulate_accelerator(mixer)
        inputs, mask = float64_inputs([37, 23, 9])
        pad = Padding.of(mask, True)
        with forbid_host_syncs():
            out = mixer(inputs["q"], inputs["k"], inputs["v"], pad, inputs["x"])
            (out * torch.linspace(-1, 1, out.numel(), dtype=out.dtype).view_as(out)).sum().backward()
        results.append([out] + [inputs[k].grad for k in "qkv"])
    for cpu, accel in zip(*results):
        torch.testing.assert_close(accel, cpu, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("padded", [True, False])
def test_the_module_reads_the_padding_on_the_host_and_the_network_believes_it(padded):
    """``LRAModule`` states the padding before the batch transfer (the mask is still on the host);
    the logits equal the network's own reading of the mask, and the step reads nothing more."""
    module = LRAModule(tiny_network("softmax").eval(), num_classes=3)
    ids, mask, label = step_batch(padded)
    batch = module.on_before_batch_transfer({"ids": ids, "mask": mask, "label": label}, 0)
    assert batch["padded"] is padded
    with count_host_syncs() as spy, torch.no_grad():
        stated = module(batch["ids"], batch["mask"], batch["padded"])
    assert spy.syncs == 0
    with torch.no_grad():
        torch.testing.assert_close(stated, module.network(ids, mask), rtol=0, atol=0)


# The device branches outside Mixer.on_cpu, each with why it may not read the flag.
DEVICE_BRANCHES_ALLOWED = {
    "attention/base.py": "Mixer.on_cpu itself: the device choice made when a mixer is made or moved, never per call",
    "attention/synthesizer.py": "which device's free memory to ask (no host read of tensor data)",
    "models/module.py": "reads the padding only while the batch is still on the host",
}


def test_every_device_branch_goes_through_the_switch():
    """So that emulate_accelerator() really takes every choice an accelerator takes."""
    root = Path(__file__).resolve().parents[2]
    branch = re.compile(r"device\.type\s*[!=]=|\.is_cuda\b")
    found = {str(p.relative_to(root)) for d in ("attention", "models") for p in (root / d).glob("*.py")
             if any(branch.search(line.split("#")[0]) for line in p.read_text().splitlines())}
    assert found <= DEVICE_BRANCHES_ALLOWED.keys(), (f"device branches outside Mixer.on_cpu: "
                                                     f"{sorted(found - DEVICE_BRANCHES_ALLOWED.keys())}")
