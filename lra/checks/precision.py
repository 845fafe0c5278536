"""Low precision against float32, for one variant: under autocast (``torch.autocast(device, low)``,
float32 parameters, as ``trainer.precision=bf16-mixed`` / ``16-mixed`` run) and with the mixer and
its inputs cast (``.to(low)``), outputs and gradients are finite and within a stated tolerance of
float32; a cast mixer returns ``low``. Used by ``python run.py mode=check`` (:mod:`lra.checks.variant`)
and by the bfloat16 and CUDA-autocast tests (``tests/attention/test_attention_bf16.py``).

Tolerances, relative to the largest float32 magnitude of the compared tensor (floored at 1% of the
largest gradient, so a gradient that is zero in exact arithmetic, like a bias Sinkhorn's
normalisation cancels, is not judged relative to its own rounding noise):

* ``TOL_OUT = 3e-2``, ``TOL_GRAD = 6e-2`` by default. bfloat16 keeps 8 significant bits (unit
  roundoff 2^-8 = 3.9e-3); inputs, weights and every matmul result are rounded, and sums over ~40
  keys and a softmax normalisation compound that to about 1e-2 (measured: 4e-3 to 1e-2 for the exact
  and smooth variants). The default leaves a 3x margin; a dropped mask, a wrong scale or an
  unnormalised row is off by O(1). float16 keeps more bits than bfloat16: the same bounds hold.
Each variant's allowances are its class's ``spec.precision`` (attention/spec.py; measured figures in
the comments there):

* ``tol``: variants whose float32 computation itself amplifies rounding.
* ``flips``: variants that take discrete decisions from rounded values (hash buckets, cluster and
  route membership, argmax routers): a query whose two best choices are within a rounding error of
  each other may pick the other one, and its row then differs by O(1) -- that is the method, not a
  bug. For those, at most the stated fraction of rows (a row = one query position of one head, or
  one token's gradient) may exceed the tolerance, every other row must meet it, and parameter
  gradients (sums over every row) are only required to be finite.
"""
from __future__ import annotations

import torch
from torch import Tensor

from attention.registry import variant_names
from attention.spec import spec_of, spec_problem
from lra.checks.contract import N, SMALL_STRUCTURE, Factory, lengths_mask, make_mixer, qkvx, variant_key

TOL_OUT, TOL_GRAD = 3e-2, 6e-2


def allowance(variant: str, field: str, default):
    """``variant``'s precision allowance ``field`` (its spec's ``precision``: "tol", "flips",
    "cancelled", "small"), else ``default`` (a factory, or a config without a complete spec)."""
    if variant not in variant_names() or spec_problem(variant):
        return default
    return spec_of(variant).precision.get(field, default)


LENGTHS = [N, 23, 9]
HOW = {"fp32": "in float32", "autocast": "under {low} autocast (float32 q, k, v)",
       "autocast-shell": "under {low} autocast ({low} q, k, v as the shell's projections give them)",
       "cast": "cast to {low}"}
CAUSES = ("usually a mask fill or a constant that overflows the low dtype (use attention.masking.neg_fill(dtype)), "
          "a sum or a normaliser accumulated in the low dtype, or an op that returns another dtype than its input")


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def run(variant: str | Factory, how: str, mode: str, low: torch.dtype = torch.bfloat16,
        device: torch.device = torch.device("cpu"), **settings) -> tuple[Tensor, list[tuple[str, Tensor]]]:
    """Output and (name, gradient) of every input and parameter, in float32 (``how="fp32"``),
    under autocast to ``low`` (``"autocast"``: float32 q, k, v; ``"autocast-shell"``: q, k, v in
    ``low`` as the shell's projections give them under autocast, x in float32), or cast to ``low``.
    A registered name is built at its spec's ``small``, with the ``small`` of its ``precision`` over it."""
    small = {**SMALL_STRUCTURE.get(variant, {}), **allowance(variant, "small", {})} if isinstance(variant, str) else {}
    mixer = make_mixer(variant, seed=5, **{**small, **settings}).to(device).train(mode == "train")
    dtype = low if how == "cast" else torch.float32
    if how == "cast":
        mixer = mixer.to(dtype)
    inputs = [t.to(device, dtype).requires_grad_(True) for t in qkvx()]
    mask = lengths_mask(LENGTHS).to(device)
    torch.manual_seed(7)
    with torch.autocast(device.type, dtype=low, enabled=how.startswith("autocast")):
        q, k, v = (t.to(low) if how == "autocast-shell" else t for t in inputs[:3])
        out = mixer(q, k, v, mask, inputs[3])
    weights = torch.randn(out.shape, generator=torch.Generator().manual_seed(9)).to(device)
    (out.float() * weights).sum().backward()
    grads = [(n, t.grad if t.grad is not None else torch.zeros_like(t)) for n, t in zip("qkvx", inputs)]
    grads += [(n, p.grad) for n, p in mixer.named_parameters() if p.grad is not None]
    return out, grads


def row_errors(got: Tensor, ref: Tensor, scale: float) -> Tensor:
    """Relative error of each row (last dim), ``got`` vs the float32 ``ref``."""
    return (got.float() - ref.float()).abs().amax(dim=-1).flatten() / scale


def close_problem(what: str, setting: str, got: Tensor, ref: Tensor, tol: float, scale: float,
                  flips: float) -> str | None:
    """``what`` (computed ``setting``) against float32, in words, or None when it is within ``tol``."""
    if not torch.isfinite(got).all():
        return (f"{what} {setting} has {int((~torch.isfinite(got)).sum())} non-finite entries (held in "
                f"{dtype_name(got.dtype)}); {CAUSES}")
    err = row_errors(got, ref, scale)
    bad = (err > tol).float().mean().item()
    if bad <= flips:
        return None
    return (f"{what} {setting}: {bad:.1%} of rows off float32 by more than {tol:g} (allowed {flips:.0%}); largest "
            f"relative error {err.max():.3g}; {CAUSES}")


def low_precision(variant: str | Factory, how: str, mode: str, low: torch.dtype = torch.bfloat16,
                  device: torch.device = torch.device("cpu"), **settings) -> str | None:
    """``variant`` in ``mode`` under autocast to ``low`` (``how="autocast"`` / ``"autocast-shell"``)
    or cast to it, against float32, within the tolerances above; None when it holds."""
    key = variant_key(variant)
    tol_out, tol_grad = allowance(key, "tol", (TOL_OUT, TOL_GRAD))
    flips = allowance(key, "flips", 0.0)
    setting = HOW[how].format(low=dtype_name(low)) + f" ({mode})"
    ref, ref_grads = run(variant, "fp32", mode, device=device, **settings)
    out, grads = run(variant, how, mode, low, device, **settings)
    if how == "cast" and out.dtype != low:
        return f"a mixer cast to {dtype_name(low)} returned {dtype_name(out.dtype)} ({mode}); usually a float32 constant or buffer promotes the result"
    if how != "cast" and out.dtype not in (low, torch.float32):
        return f"the output is {dtype_name(out.dtype)} {setting}"
    problem = close_problem("the output", setting, out, ref, tol_out, ref.abs().max().item(), flips)
    if problem:
        return problem
    if [n for n, _ in grads] != [n for n, _ in ref_grads]:
        return f"other parameters get gradients {setting} than in float32"
    floor = 1e-2 * max(g.abs().max().item() for _, g in ref_grads)
    for (gname, g), (_, g_ref) in zip(grads, ref_grads):
        scale = max(g_ref.abs().max().item(), floor)
        if gname in "qkvx":
            problem = close_problem(f"the gradient of {gname}", setting, g, g_ref, tol_grad, scale, flips)
        elif flips or gname in allowance(key, "cancelled", ()):
            problem = None if torch.isfinite(g).all() else \
                f"the gradient of {gname} {setting} is not finite (held in {dtype_name(g.dtype)}); {CAUSES}"
        else:
            problem = close_problem(f"the gradient of {gname}", setting, g.flatten(), g_ref.flatten(), tol_grad, scale, 0.0)
        if problem:
            return problem
    return None
