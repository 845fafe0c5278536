"""What ``torch.compile`` and a GPU need of a training step, measured on CPU per variant.

* :func:`compiled_step`: the loss and gradients of ``torch.compile(fullgraph=True)`` of the network
  against the same step run eagerly. ``fullgraph=True`` makes any graph break an
  error naming its line, so a compile that succeeds has none.
* :func:`aten_ops`: the operators Inductor lowers for a compiled training step.
* :func:`step_under_forbidden_syncs`: a training forward and backward that raises at the first
  host sync (:func:`tests.host_syncs.forbid_host_syncs`).
* :func:`graph_breaks`: ``torch._dynamo.explain`` of the training forward: every break and its
  reason, where a compile stops at the first (the diagnostic below; tests compile instead).

    python -m tests.graph_safe                  # breaks per config, padded and unpadded
"""
from __future__ import annotations

import argparse
import sys
import warnings
from typing import Callable

import torch

from attention.base import emulate_accelerator
from lra.checks.contract import compiled_step  # noqa: F401 - the variant check's compiled step, one copy
from tests.tiny_network import step_batch, tiny_network, training_loss

# The suite's Inductor tests compile to scalar C++ (``torch._inductor.config.patch(SCALAR_CPP)``,
# or :func:`scalar_cpp` in a forked run), not to Inductor's SIMD (at::vec) kernels: that every
# operator kind lowers and the compiled step matches eager is settled before the C++ backend picks
# an instruction set, and a GPU gets Triton instead. The SIMD headers are most of g++'s time:
# memformer and routing on an empty cache took 81 s of CPU scalar against 123 s vectorised
# (2026-11-30, side by side beside two training runs).
SCALAR_CPP = {"cpp.vec_isa_ok": False}


def scalar_cpp() -> None:
    """A run-server hook (``hook="tests.graph_safe:scalar_cpp"``): this forked run compiles scalar C++."""
    import torch._inductor.config

    torch._inductor.config.load_config(SCALAR_CPP)


def graph_breaks(name: str, padded: bool, **overrides) -> tuple[int, list[str]]:
    """Graph breaks of a training forward of ``name`` (2 layers), with their distinct reasons, on
    the accelerator's choices, the padding stated as ``LRAModule`` states it."""
    net = emulate_accelerator(tiny_network(name, **overrides).train())
    ids, mask, label = step_batch(padded)
    torch._dynamo.reset()

    def loss(ids: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        return training_loss(net, ids, mask, label, padded=padded)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        explained = torch._dynamo.explain(loss)(ids, mask)
    reasons = sorted({str(b.reason).strip().splitlines()[0] for b in explained.break_reasons})
    return explained.graph_break_count, reasons


def aten_ops(name: str, padded: bool, part: str = "network", **overrides) -> set[str]:
    """The operators (ATen and prims) of one compiled training step of ``name``, forward and
    backward, after the decompositions Inductor applies: what Inductor has to lower."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd
    from torch._inductor.decomposition import select_decomp_table

    ops: set[str] = set()

    def record(gm: torch.fx.GraphModule, inputs: list) -> object:
        ops.update(str(node.target) for node in gm.graph.nodes if node.op == "call_function")
        return make_boxed_func(gm.forward)

    backend = aot_autograd(fw_compiler=record, bw_compiler=record, decompositions=select_decomp_table())
    compiled_step(name, padded, steps=1, backend=backend, part=part, **overrides)
    return ops


def step_under_forbidden_syncs(name: str, padded: bool, **overrides) -> torch.Tensor:
    """A training forward and backward of ``name``, its padding stated; raises at the first host sync."""
    from tests.host_syncs import forbid_host_syncs

    net = tiny_network(name, **overrides).train()
    ids, mask, label = step_batch(padded)
    with forbid_host_syncs():
        loss = training_loss(net, ids, mask, label, padded=padded)
        loss.backward()
    return loss.detach()


def main(argv: list[str] | None = None) -> int:
    from attention.registry import variant_names

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", default=None, help="variants (default: every config)")
    ap.add_argument("--reasons", action="store_true", help="list the reasons of every break")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    print("graph breaks of a training forward (2 layers; torch._dynamo.explain)")
    print("| variant | padded | unpadded |\n|---|---|---|")
    for name in args.only or variant_names():
        cells = []
        for padded in (True, False):
            try:
                cells.append(graph_breaks(name, padded))
            except Exception as e:  # noqa: BLE001 - a table cell, not a test
                cells.append(("error", [f"{type(e).__name__}: {str(e).strip().splitlines()[0]}"]))
        print(f"| {name} | " + " | ".join(str(n) for n, _ in cells) + " |", flush=True)
        if args.reasons:
            for reason in sorted({r for _, rs in cells for r in rs}):
                print(f"    {reason}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
