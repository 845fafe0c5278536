"""``python run.py mode=check attention=<name>``: the attention contract on one variant, in seconds.

The first command after writing a variant: it runs the properties of :mod:`lra.checks.contract` and
:mod:`lra.checks.precision` (the ones the contract tests hold every config to) on the variant the
config composes, with the command line's settings, at small sizes, and prints one row per property:
its name, ``pass`` or ``FAIL``, and for a failure one sentence with the tensor, the magnitude and what
usually causes it. Exit status 1 if any property fails (in a sweep, ``-m attention=a,b``, that job
fails and the others go on).

A registered variant runs at its spec's ``small`` (:data:`lra.checks.contract.SMALL_STRUCTURE`) for every setting the
command line leaves at its config's value, so that 37 tokens span several blocks, segments and
clusters (at a block size of 64 they would take the exact path, where structural bugs cannot show);
a new variant with blocks should be given small ones on the command line
(``attention.block_size=8``). ``check.compile=false`` skips the compiled step (its compile dominates
the check's time on CPU), ``check.device=cuda`` runs on a GPU.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
from omegaconf import DictConfig, OmegaConf

from lra.checks import contract
from lra.checks.config import PropertiesFailed
from lra.checks.contract import NamedFactory
from lra.checks.precision import low_precision

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Outcome:
    """One row of the table: ``problem`` is None when the property holds."""

    prop: str
    problem: str | None
    seconds: float


def _network_reach(variant: NamedFactory, device: torch.device) -> str | None:
    for pool in ("mean", "cls"):
        for mode in ("train", "eval"):
            net = contract.reach_network(variant.at_own_sizes(), pool, device).train(mode == "train")
            g = torch.Generator().manual_seed(3)
            ids, mask = contract.reach_batch(g, device)
            problem = contract.token_reach(net, ids, mask, g, f"{pool} pooling, {mode}")
            if problem:
                return problem
    return None


def _network_batch(variant: NamedFactory, device: torch.device) -> str | None:
    for pool in ("mean", "cls"):
        ids, mask = contract.reach_batch(torch.Generator().manual_seed(3), device)
        problem = contract.logits_batch_independence(contract.reach_network(variant.at_own_sizes(), pool, device),
                                                     ids, mask, f"{pool} pooling")
        if problem:
            return problem
    return None


def _both_modes(check: Callable[[str], str | None]) -> str | None:
    return check("eval") or check("train")


def _float16(variant: NamedFactory, device: torch.device) -> str | None:
    """A training step under float16 autocast (``trainer.precision=16-mixed``, a GPU precision). On a
    CPU it runs under CUDA's autocast policy (:mod:`lra.checks.cuda_autocast`): CPU autocast keeps
    ``exp``, ``softmax`` and the reductions in float16, where CUDA runs them in float32, so plain CPU
    float16 fails variants that are fine on a GPU (performer, routing, adamra_elu)."""
    import contextlib

    from lra.checks.cuda_autocast import cuda_autocast_policy

    with cuda_autocast_policy() if device.type == "cpu" else contextlib.nullcontext():
        return low_precision(variant, "autocast-shell", "train", torch.float16, device)


def properties(variant: NamedFactory, device: torch.device, compile: bool = True) -> list[tuple[str, Callable[[], str | None]]]:
    """(name, property) in the order the table prints them; each property returns None or a sentence."""
    props: list[tuple[str, Callable[[], str | None]]] = [
        ("padding invariance (eval)", lambda: contract.padding_invariance(variant, "eval", device)),
        ("padding invariance (train)", lambda: contract.padding_invariance(variant, "train", device)),
        ("padded length (eval, train)", lambda: _both_modes(lambda m: contract.padded_length_invariance(variant, m, device))),
        ("fully padded rows", lambda: contract.fully_padded_row(variant, device)),
        ("every token reaches the logits", lambda: _network_reach(variant, device)),
        ("batch independence", lambda: contract.batch_independence(variant, device)
         or _network_batch(variant, device)),
        ("determinism", lambda: contract.determinism(variant, device)),
        ("gradients reach q, k, v, x", lambda: contract.gradients(variant, device)),
        ("bfloat16 autocast", lambda: _both_modes(lambda m: low_precision(variant, "autocast", m, torch.bfloat16, device))),
        ("float16 autocast", lambda: _float16(variant, device)),
    ]
    if compile:
        props.append(("compiled step matches eager",
                      lambda: contract.compiled_matches_eager(variant, True, backend="aot_eager_decomp_partition")))
    return props


def run_properties(variant: NamedFactory, device: torch.device = torch.device("cpu"), compile: bool = True) -> list[Outcome]:
    """Every property of ``variant``; an exception inside one is that property's failure (a variant that
    crashes on a fully padded row fails that row, and the others still run)."""
    outcomes = []
    for prop, check in properties(variant, device, compile):
        start = time.perf_counter()
        try:
            problem = check()
        except Exception as e:  # noqa: BLE001 - the variant's own error is the finding
            first = str(e).strip().splitlines()[0] if str(e).strip() else ""
            problem = f"raised {type(e).__name__}: {first[:240]}"
        outcomes.append(Outcome(prop, problem, time.perf_counter() - start))
    return outcomes


def table(name: str, outcomes: list[Outcome], skipped: list[tuple[str, str]] = ()) -> str:
    """The table ``mode=check`` prints: property, pass/FAIL, seconds, and a failure's sentence;
    ``skipped``: (property, the setting that skipped it)."""
    width = max(len(p) for p in [o.prop for o in outcomes] + [p for p, _ in skipped])
    lines = [f"variant check of attention={name}", f"{'property':<{width}}  result  time"]
    for o in outcomes:
        lines.append(f"{o.prop:<{width}}  {'pass' if o.problem is None else 'FAIL':<6}  {o.seconds:4.1f}s")
        if o.problem is not None:
            lines.append(f"{'':<{width}}    {o.problem}")
    lines += [f"{prop:<{width}}  skip          ({why})" for prop, why in skipped]
    failed = sum(o.problem is not None for o in outcomes)
    lines.append(f"{len(outcomes) - failed} of {len(outcomes)} properties hold"
                 + (f"; {failed} failed" if failed else "") + f" ({sum(o.seconds for o in outcomes):.1f} s)")
    return "\n".join(lines)


def variant_of(cfg: DictConfig) -> NamedFactory:
    """The variant the config composes (``cfg.attention`` with the command line's settings), as a
    factory; a registered one at :data:`~lra.checks.contract.SMALL_STRUCTURE` for each setting left
    at its config's value."""
    from hydra.utils import instantiate

    from attention.registry import CONF_DIR

    name = str(OmegaConf.select(cfg, "attention_name", throw_on_resolution_failure=False) or "variant")
    node = OmegaConf.to_container(cfg.attention, resolve=True)
    path = CONF_DIR / "attention" / f"{name}.yaml"
    defaults = OmegaConf.to_container(OmegaConf.load(path)) if path.is_file() else {}
    if node.get("_target_") != defaults.get("_target_"):  # attention._target_=my.module.Class: another variant
        name, defaults = str(node.get("_target_")), {}
    small = {k: v for k, v in contract.SMALL_STRUCTURE.get(name, {}).items()
             if k not in node or node.get(k) == defaults.get(k)}
    def maker(base: dict[str, Any]) -> Callable[..., Callable[..., Any]]:
        return lambda **settings: instantiate(OmegaConf.create({**base, **settings}))

    return NamedFactory(name, maker({**node, **small}), maker(node))


def run_check(cfg: DictConfig) -> dict:
    """``mode=check``: print the table (at ``threads``, as a run); :class:`PropertiesFailed` when a
    property fails."""
    from lra.training.threads import apply_threads

    settings = cfg.get("check") or {}
    device = torch.device(str(settings.get("device", "cpu")))
    compile = bool(settings.get("compile", True))
    variant = variant_of(cfg)
    before = torch.get_num_threads()
    apply_threads(cfg.get("threads"))
    try:
        outcomes = run_properties(variant, device, compile)
    finally:
        torch.set_num_threads(before)
    print(table(variant.name, outcomes, [] if compile else [("compiled step matches eager", "check.compile=false")]),
          flush=True)
    failed = [o.prop for o in outcomes if o.problem is not None]
    if failed:
        raise PropertiesFailed(f"attention={variant.name} fails {len(failed)} of {len(outcomes)} properties: {', '.join(failed)}")
    return {"variant": variant.name, "passed": [o.prop for o in outcomes]}
