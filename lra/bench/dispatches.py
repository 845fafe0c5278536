"""What each variant's training step would launch on a GPU, beside linear attention's: a benchmark
(counts, not times), run on any machine.

    python -m lra.bench --protocol dispatches                       # every Table 2 variant, N 1024 and 4096
    python -m lra.bench --protocol dispatches --variants adamra_t2a,bigbird --lengths 1024 --compile

At LRA sizes an eager GPU step costs what its operator calls cost (the H200 Table 2 records fit
``ms = 1.6 + 0.029 x operators``), so the count of a step's outermost aten operators on the
accelerator path (:func:`lra.bench.harness.count_dispatches`) is the device-independent figure of
its overhead. Each row is one AdamW training step at AdaMRA Table 2's shapes (the text task, batch 16,
the Xiong backbone), counted after one warm-up step; ``x linear`` is the ratio to linear attention's
count at the same N (linear attention does the same arithmetic as AdaMRA). ``--compile`` then
compiles each counted model (fullgraph, static shapes) and counts again, so the eager and compiled
figures of one model stand side by side: the kernels Inductor generated for it and the operators its
compiled step still dispatches (the optimiser's, and extern kernels such as matmuls). On CPU those
kernels are Inductor's C++ loops, not a GPU's Triton kernels: the same captured graphs under another
backend, whose fusion rules are largely but not wholly shared, so a proxy for the GPU's count until
one is measured (``tests/gpu_check.sh``). Targets are issue 62's, for N = 1024; a count that grows
with N (BigBird must not) shows in the two columns.
"""
from __future__ import annotations

import argparse
from typing import Any

import torch

from lra import CONF_DIR
from lra.bench.harness import _inductor_kernels, build_step, count_dispatches, plan

TABLE2 = ["softmax", "linear", "performer_32", "linformer", "nystromformer", "reformer", "bigbird", "adamra_t2a",
          "adamra_t2b", "routing", "clustered", "i_clustered", "abc_mlp", "memformer"]
TARGETS = {"adamra_t2a": 1.3, "adamra_t2b": 1.3, "nystromformer": 1.5, "routing": 1.5, "clustered": 2.0, "i_clustered": 2.5}


def count_one(spec: dict[str, Any]) -> dict[str, Any]:
    """Outermost operators of one eager training step; with ``spec['compile']`` the same model is
    then compiled (fullgraph, static shapes) and counted again: ``compiled`` holds the kernels
    Inductor generated for its graphs and the operators the compiled step still dispatches."""
    torch.manual_seed(spec.get("seed", 0))
    device = torch.device(spec["device"])
    _, model, counted = build_step(spec | {"compile": False}, device)   # eager first, compiled here below
    out = count_dispatches(counted(), device, spec["batch_size"], model)
    if spec.get("compile"):
        torch._dynamo.reset()   # every model recompiles the same forward: past 8 models fullgraph's limit fails
        model.compile(fullgraph=True, dynamic=False)
        before = _inductor_kernels()
        again = count_dispatches(counted(), device, spec["batch_size"], model)
        out["compiled"] = {"kernels": _inductor_kernels() - before, "outermost_aten_ops": again["outermost_aten_ops"],
                           "counted": COMPILED.format(device=device.type)}
    return out


COMPILED = ("kernels Inductor generated for the compiled forward and backward graphs ({device} backend: on "
            "CPU C++ loops, on CUDA Triton kernels; matmuls stay extern calls) and the outermost aten "
            "operators the compiled step still dispatches (the eager optimiser's, the extern matmuls)")


def specs_for(variant: str, lengths: list[int], batch: int, compiled: bool) -> list[dict[str, Any]]:
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=[f"attention={variant}", "bench.protocol=table2", "model=xiong",
                                           f"bench.lengths=[{','.join(map(str, lengths))}]", f"bench.batch_size={batch}",
                                           f"bench.compile={str(compiled).lower()}", "bench.device=cpu"])
    return plan(cfg, variant)[1]


def table(counts: dict[tuple[str, int], dict[str, Any]], variants: list[str], lengths: list[int]) -> str:
    """Markdown: eager operators per N with the ratio to linear and, when counted, the compiled
    step's kernels (with the ratio to linear's) and remaining operators; the target."""
    compiled = any("compiled" in c for c in counts.values())
    head = ["variant"] + [f"eager ops N={n} (x linear)" for n in lengths]
    head += [f"compiled N={n}: kernels (x linear) + ops" for n in lengths] if compiled else []
    head += ["target at 1024 (x linear)"]
    lines = ["| " + " | ".join(head) + " |", "|---" * len(head) + "|"]

    def ratio(v: str, n: int, *keys: str) -> str:
        get = lambda c: c.get(keys[0], {}).get(keys[1]) if len(keys) == 2 else c.get(keys[0])  # noqa: E731
        got, ref = get(counts.get((v, n), {})), get(counts.get(("linear", n), {}))
        return "-" if got is None else f"{got}" + (f" ({got / ref:.2f}x)" if ref else "")

    for v in variants:
        cells = [v] + [ratio(v, n, "outermost_aten_ops") for n in lengths]
        if compiled:
            cells += ["-" if "compiled" not in counts.get((v, n), {}) else
                      f"{ratio(v, n, 'compiled', 'kernels')} + {counts[(v, n)]['compiled']['outermost_aten_ops']}"
                      for n in lengths]
        target = TARGETS.get(v)
        got = counts.get((v, 1024), {}).get("outermost_aten_ops")
        ref = counts.get(("linear", 1024), {}).get("outermost_aten_ops")
        verdict = "" if target is None or not (got and ref) else (" met" if got / ref <= target else " not met")
        cells.append(f"<= {target}x{verdict}" if target else "")
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lra.bench --protocol dispatches", description=__doc__.split("\n\n")[0])
    p.add_argument("--protocol", default="dispatches", choices=["dispatches"])
    p.add_argument("--variants", default=",".join(TABLE2), help="comma-separated conf/attention names (linear is added)")
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--compile", action="store_true", help="also count the compiled step's kernels (slow on CPU)")
    args = p.parse_args(argv)
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    variants = (["linear"] if "linear" not in variants else []) + variants
    unknown = [v for v in variants if not (CONF_DIR / "attention" / f"{v}.yaml").is_file()]
    if unknown:
        p.error(f"--variants: no conf/attention/{unknown[0]}.yaml")
    torch.set_num_threads(1)
    counts: dict[tuple[str, int], dict[str, Any]] = {}
    for v in variants:
        for spec in specs_for(v, args.lengths, args.batch_size, args.compile):
            try:
                counts[(v, spec["length"])] = count_one(spec)
            except Exception as e:  # noqa: BLE001 - one variant failing must not hide the others
                print(f"{v} N={spec['length']}: {type(e).__name__}: {e}"[:300], flush=True)
            else:
                print(f"{v} N={spec['length']}: {counts[(v, spec['length'])]['outermost_aten_ops']} operators", flush=True)
    first = counts[next(iter(counts))] if counts else {}
    print("".join(f"\n{c}\n" for c in (first.get("counted"), first.get("compiled", {}).get("counted")) if c))
    print(table(counts, variants, args.lengths))
    return 0
