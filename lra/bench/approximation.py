"""The approximation map (issue 37): how far each efficient attention is from exact softmax
attention (Vaswani et al. 2017, eq. 1) on the same q, k, v, as the length N and its budget grow.

    python -m lra.bench --protocol approximation [--variants performer,nystromformer] [--lengths 256 1024 4096]
    python run.py mode=bench bench.protocol=approximation attention=performer

Per point (variant config, budget value, N, input kind), in float64 and eval mode:

* ``rel_error`` = ||Y - Y*||_F / ||Y*||_F over the real query rows (Y* the exact softmax output);
* where the variant's output is A V for a mixing matrix A that does not depend on V (checked, not
  assumed: A is read off as the output for V = I, then ``A @ v`` must reproduce the output), the
  row-wise total-variation distance TV_i = 1/2 sum_j |A_ij - P_ij| to softmax's P (mean and worst row);
  reading A costs N times a forward, so it is done up to ``tv_max_len`` (256) on the first
  ``tv_draws`` (2) draws;
* a variant whose output depends on its construction seed (random features, hashes, random
  blocks, random initialisation of learned maps: detected by comparing two draws) gets mean, sd,
  min and max over ``draws`` (8) fresh constructions (``draws_long``, 2, at N >= 4096: the wall time); a deterministic one
  gets one value;
* ``time_ms``: the bench harness's own measurement (:func:`lra.bench.harness.measure`, protocol
  ``block``: forward + backward of one encoder block, float32, batch 1, one thread) of the same
  attention config at the same N, so the error can be joined with a step time per budget point.

Inputs (each point names its kind; the report never puts two kinds in one curve):

* ``gauss-flat`` / ``gauss-medium`` / ``gauss-peaked``: q, k entries N(0, tau) with tau = 0.25, 1,
  4, so the logits q.k/sqrt(d) have standard deviation tau; v ~ N(0, 1). Mean row entropy recorded.
* ``local``: q = k = sinusoidal position features (16 frequencies, pi/2 .. pi/64) plus noise 0.1,
  so the logit is ~12 * mean_f cos(w_f (i - j)): attention concentrated near the diagonal (mass
  within |i - j| <= 16 recorded).
* ``listops-L1`` / ``listops-L2``: q, k, v, mask and layer input captured from the two layers of a
  softmax ListOps checkpoint on generated ListOps sequences, cropped to N (or padded with masked
  positions beyond the checkpoint's length); :func:`listops_capture` says which checkpoint (or the
  short training run made when none is given).

Choices, written down:

* Shape: 2 heads of 32 (the Xiong backbone); batch 1 for Gaussian and local inputs, 2 sequences for ListOps.
* Reformer ties keys to queries (``shared_qk``): it is given k = q, as the shell gives it, and is
  compared to exact softmax on the same (q, q, v). Its own attention also normalises keys and
  penalises self-attention, so its error does not vanish at any budget.
* Nystromformer's depthwise convolution skip on V (``conv_kernel``) is a learned residual, not part
  of the Nystrom approximation: it is switched off here (its spec's ``fixed``), in the time too.
* Synthesizers do not read q and k: their error measures an untrained mixing, not an approximation.
* Memformer is no token mixer on (q, k, v) (a segment-recurrent memory run across the encoder): excluded.
* Layering: the ListOps capture imports ``lra.data.listops`` (bench may import data: lra/README.md; its
  generator and tokeniser, lazily) and starts the fallback training as a ``run.py`` subprocess.
"""
from __future__ import annotations

import argparse
import logging
import math
import random
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import Tensor

from attention.padding import as_padding
from attention.spec import Knob, Spec, SpecError, spec_of
from lra import CONF_DIR, ROOT
from lra.badinput import ConfigError
from lra.files import default_dir

log = logging.getLogger(__name__)
LENGTHS = (256, 1024, 4096)
HEADS, HEAD_DIM = 2, 32
LONG = 4096                      # from this N on, random variants get ``draws_long`` draws
MODE = "approximation"           # the record mode (the report admits it in lra.report.approximation)
REFERENCE = "softmax"


def spec(name: str) -> Spec:
    """``name``'s spec (attention/spec.py: its knobs, ``fixed`` overrides and ``excluded`` reason);
    a config without a complete spec, or no config at all, is a :class:`ConfigError` of one line."""
    try:
        return spec_of(name)
    except SpecError as e:
        raise ConfigError(str(e)) from None
    except KeyError as e:
        raise ConfigError(e.args[0]) from None


def knobs_of(name: str) -> tuple[Knob, ...]:
    """The budget axes of ``name`` (its spec's ``knobs``)."""
    return tuple(spec(name).knobs)


INPUTS = ("gauss-flat", "gauss-medium", "gauss-peaked", "local", "listops-L1", "listops-L2")
TEMPERATURES = {"gauss-flat": 0.25, "gauss-medium": 1.0, "gauss-peaked": 4.0}


# ---------------------------------------------------------------------------------------------
# Inputs
# ---------------------------------------------------------------------------------------------
@dataclass
class Inputs:
    kind: str
    q: Tensor        # [B, H, N, Dh] float64
    k: Tensor
    v: Tensor
    mask: Tensor     # [B, N] bool, True = real
    x: Tensor        # [B, N, H * Dh], the layer input (read by the synthesizers)
    meta: dict = field(default_factory=dict)


def gaussian(n: int, tau: float, seed: int = 0, batch: int = 1) -> Inputs:
    """q, k ~ N(0, tau) per entry: logits q.k/sqrt(d) have standard deviation tau."""
    g = torch.Generator().manual_seed(seed)
    shape = (batch, HEADS, n, HEAD_DIM)
    q, k, v = (torch.randn(shape, generator=g, dtype=torch.float64) for _ in range(3))
    x = torch.randn(batch, n, HEADS * HEAD_DIM, generator=g, dtype=torch.float64)
    s = math.sqrt(tau)
    return Inputs("", q * s, k * s, v, torch.ones(batch, n, dtype=torch.bool), x, {"tau": tau})


def local_pattern(n: int, seed: int = 0, peak: float = 12.0, noise: float = 0.1) -> Inputs:
    """q = k = position features whose dot product peaks at i = j: a banded true attention."""
    g = torch.Generator().manual_seed(seed)
    f = HEAD_DIM // 2
    w = math.pi / 2 * (1 / 32) ** (torch.arange(f, dtype=torch.float64) / (f - 1))   # pi/2 .. pi/64
    ang = torch.arange(n, dtype=torch.float64)[:, None] * w                              # [N, F]
    feats = torch.cat([ang.cos(), ang.sin()], dim=-1) * math.sqrt(peak * math.sqrt(HEAD_DIM) / f)
    base = feats.expand(1, HEADS, n, HEAD_DIM)
    q = base + noise * torch.randn(base.shape, generator=g, dtype=torch.float64)
    k = base + noise * torch.randn(base.shape, generator=g, dtype=torch.float64)
    v = torch.randn(base.shape, generator=g, dtype=torch.float64)
    x = torch.randn(1, n, HEADS * HEAD_DIM, generator=g, dtype=torch.float64)
    return Inputs("local", q, k, v, torch.ones(1, n, dtype=torch.bool), x, {"peak_logit": peak, "noise": noise})


def fit_length(t: Tensor, n: int, dim: int) -> Tensor:
    """Crop ``t`` to ``n`` along ``dim``, or right-pad it with zeros."""
    have = t.shape[dim]
    if have >= n:
        return t.narrow(dim, 0, n)
    shape = list(t.shape)
    shape[dim] = n - have
    return torch.cat([t, t.new_zeros(shape)], dim=dim)


def captured_inputs(capture: dict, layer: int, n: int) -> Inputs:
    """Layer ``layer``'s captured (q, k, v, mask, x) cropped / padded (masked) to length ``n``."""
    c = capture["layers"][layer]
    q, k, v = (fit_length(c[name], n, 2) for name in ("q", "k", "v"))
    mask, x = fit_length(c["mask"], n, 1), fit_length(c["x"], n, 1)
    return Inputs(f"listops-L{layer + 1}", q, k, v, mask, x,
                  {"real_tokens": mask.sum(1).tolist(), **capture["meta"]})


def make_inputs(kind: str, n: int, capture: dict | None, seed: int = 0) -> Inputs:
    if kind in TEMPERATURES:
        inp = gaussian(n, TEMPERATURES[kind], seed)
        inp.kind = kind
        return inp
    if kind == "local":
        return local_pattern(n, seed)
    if kind.startswith("listops-L"):
        if capture is None:
            raise ValueError("listops inputs need a capture (listops_capture)")
        return captured_inputs(capture, int(kind[-1]) - 1, n)
    raise ValueError(f"unknown input kind {kind!r}; valid: {', '.join(INPUTS)}")


# ---------------------------------------------------------------------------------------------
# The exact reference and the measures
# ---------------------------------------------------------------------------------------------
def softmax_matrix(q: Tensor, k: Tensor, mask: Tensor) -> Tensor:
    """P = softmax(Q K^T / sqrt(d)) with padded keys excluded and padded query rows zero (eq. 1)."""
    logits = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
    logits = logits.masked_fill(~mask[:, None, None, :], float("-inf"))
    p = torch.softmax(logits, dim=-1).nan_to_num(0.0)
    return p * mask[:, None, :, None].to(p.dtype)


def row_entropy(p: Tensor, mask: Tensor) -> float:
    """Mean over real rows of -sum_j P_ij log P_ij (nats)."""
    h = -(p * p.clamp_min(1e-300).log()).sum(-1)                       # [B, H, N]
    rows = mask[:, None, :].expand_as(h)
    return float(h[rows].mean())


def relative_error(y: Tensor, ref: Tensor, mask: Tensor) -> float:
    """||Y - Y*||_F / ||Y*||_F over real query rows."""
    keep = mask[:, None, :, None].to(y.dtype)
    return float(((y - ref) * keep).norm() / (ref * keep).norm())


def tv_rows(a: Tensor, p: Tensor, mask: Tensor) -> Tensor:
    """TV_i = 1/2 sum_j |A_ij - P_ij| for every real query row (flattened)."""
    tv = 0.5 * (a - p).abs().sum(-1)
    return tv[mask[:, None, :].expand_as(tv)]


def mixing_matrix(mixer: torch.nn.Module, inp: Inputs, k: Tensor, y: Tensor) -> tuple[Tensor | None, str]:
    """The variant's A (with Y = A V), read off as the output for V = I (every key position a
    value basis vector), or None with the reason when the output is not A V for an A free of V."""
    b, h, n, _ = inp.v.shape
    eye = torch.eye(n, dtype=inp.v.dtype).expand(b, h, n, n)
    try:
        a = mixer(inp.q, k, eye, inp.mask, inp.x)
    except Exception as e:  # noqa: BLE001 - a mixer tied to the value width: read A by column blocks
        try:
            d = inp.v.shape[-1]
            cols = []
            for j in range(0, n, d):
                block = torch.zeros(b, h, n, d, dtype=inp.v.dtype)
                width = min(d, n - j)
                block[:, :, j:j + width, :width] = torch.eye(width, dtype=inp.v.dtype)
                cols.append(mixer(inp.q, k, block, inp.mask, inp.x)[..., :width])
            a = torch.cat(cols, dim=-1)
        except Exception:  # noqa: BLE001
            return None, f"no matrix: the mixer rejects V = I ({type(e).__name__})"
    if a.shape != (b, h, n, n):
        return None, "no matrix: the output for V = I is not N x N"
    back = a @ inp.v
    keep = inp.mask[:, None, :, None].to(y.dtype)
    gap = float(((back - y) * keep).norm() / (y * keep).norm().clamp_min(1e-300))
    if not gap < 1e-8:
        return None, f"no matrix: the output is not A V for an A free of V (||A V - Y|| / ||Y|| = {gap:.2g})"
    return a, "A V"


def build(name: str, overrides: dict, n: int, seed: int) -> torch.nn.Module:
    """Variant ``name`` with ``overrides``, constructed under ``seed`` (its random draw), float64, eval."""
    from attention.registry import build_mixer

    torch.manual_seed(seed)
    mixer = build_mixer(name, **overrides)(n_heads=HEADS, head_dim=HEAD_DIM, max_len=n, layer_idx=0)
    return mixer.double().eval()


def _summary(values: list[float]) -> dict[str, Any]:
    return {"mean": statistics.fmean(values), "sd": statistics.stdev(values) if len(values) > 1 else 0.0,
            "min": min(values), "max": max(values), "all": values}


def is_random(name: str, overrides: dict, seed: int = 0, n: int = 1024) -> bool:
    """Whether the variant's output depends on its construction seed (two draws compared at N = 1024:
    at 256 BigBird's 3 random blocks of 64 reach every block, so its draws agree there)."""
    inp = make_inputs("gauss-medium", n, None, seed)
    outs = []
    for draw in (0, 1):
        mixer = build(name, overrides, n, 1000 + draw)
        k = inp.q if mixer.shared_qk else inp.k
        with torch.no_grad():
            outs.append(mixer(inp.q, k, inp.v, inp.mask, inp.x))
    return not torch.equal(outs[0], outs[1])


class References:
    """Exact softmax P and Y* per (input kind, N, shared-qk), computed once."""

    def __init__(self) -> None:
        self.cache: dict[tuple, tuple[Tensor, Tensor, dict]] = {}

    def get(self, inp: Inputs, shared: bool) -> tuple[Tensor, Tensor, dict]:
        key = (inp.kind, inp.q.shape[2], shared)
        if key not in self.cache:
            self.cache.clear()          # one (kind, N) at a time: 4K matrices are large
            k = inp.q if shared else inp.k
            p = softmax_matrix(inp.q, k, inp.mask)
            y = p @ inp.v
            band = _band_mass(p, 16)
            self.cache[key] = (p, y, {"entropy": row_entropy(p, inp.mask), "log_n": math.log(inp.q.shape[2]),
                                      "mass_within_16": band})
        return self.cache[key]


def _band_mass(p: Tensor, width: int) -> float:
    n = p.shape[-1]
    i = torch.arange(n)
    band = ((i[:, None] - i[None, :]).abs() <= width).to(p.dtype)
    rows = p.sum(-1) > 0
    return float((p * band).sum(-1)[rows].mean())


def measure_point(name: str, overrides: dict, inp: Inputs, refs: References, draws: int,
                  tv_draws: int = 0) -> dict[str, Any]:
    """Errors of one (config, budget, input, N) over ``draws`` constructions; the TV distance on
    the first ``tv_draws`` of them (reading A costs N forwards)."""
    tv = tv_draws > 0
    errors, tv_mean, tv_max, no_matrix = [], [], [], None
    for draw in range(draws):
        mixer = build(name, overrides, inp.q.shape[2], 1000 + draw)
        k = inp.q if mixer.shared_qk else inp.k
        p, ref, _ = refs.get(inp, mixer.shared_qk)
        with torch.no_grad():
            y = mixer(inp.q, k, inp.v, inp.mask, inp.x)
            errors.append(relative_error(y, ref, inp.mask))
            if draw < tv_draws and no_matrix is None:
                a, how = mixing_matrix(mixer, inp, k, y)
                if a is None:
                    no_matrix = how
                else:
                    rows = tv_rows(a, p, inp.mask)
                    tv_mean.append(float(rows.mean()))
                    tv_max.append(float(rows.max()))
                del a
        del mixer
    out: dict[str, Any] = {"draws": draws, "rel_error": _summary(errors)}
    if tv and no_matrix is None:
        out["tv_mean"], out["tv_max"] = _summary(tv_mean), _summary(tv_max)
    elif tv:
        out["matrix"] = no_matrix
    return out


# ---------------------------------------------------------------------------------------------
# Budget points and step time
# ---------------------------------------------------------------------------------------------
def default_config(name: str) -> dict:
    from omegaconf import OmegaConf


    return OmegaConf.to_container(OmegaConf.load(CONF_DIR / "attention" / f"{name}.yaml"), resolve=True)


def budget_points(name: str) -> list[dict[str, Any]]:
    """The default point first, then every knob's sweep (other knobs at their default); each with
    its overrides (the fixed ones included), knob, value and whether it is the default."""
    cfg = default_config(name)
    fixed = dict(spec(name).fixed)
    knobs = knobs_of(name)
    first = knobs[0] if knobs else None
    default_value = first.default_value(cfg) if first else None
    points = [{"knob": first.key if first else None, "value": default_value, "default": True, "overrides": dict(fixed)}]
    for knob in knobs:
        default = knob.default_value(cfg)
        for value in knob.values:
            if value == default:
                continue
            points.append({"knob": knob.key, "value": value, "default": False,
                           "overrides": {**fixed, **knob.overrides(value, cfg)}})
    return points


def step_time(name: str, overrides: dict, n: int, repeats: int | None = None) -> dict[str, Any]:
    """The bench harness's block step (fwd + bwd of one encoder block, float32, batch 1, one thread):
    the median of 2 timed steps after one warm-up step (1 timed step from N = 4096: the wall time)."""
    repeats = repeats or (1 if n >= LONG else 2)
    from lra.bench.harness import measure

    cfg = {**default_config(name), **overrides}
    for key in [k for k, v in cfg.items() if "dropout" in k and isinstance(v, (int, float))]:
        cfg[key] = 0.0
    spec = {"kind": "block", "attention": cfg, "batch_size": 1, "repeats": repeats, "warmup": 1, "min_time_s": 0.0,
            "rounds": 1, "device": "cpu", "seed": 0, "threads": 1, "cpu_malloc": "default", "compile": False,
            "length": n, "d_model": HEADS * HEAD_DIM, "n_heads": HEADS, "d_ffn": 2 * HEADS * HEAD_DIM}
    r = measure(spec)
    return {"ms": r.get("ms"), "status": r.get("status"), **({"error": r["error"]} if "error" in r else {})}


# ---------------------------------------------------------------------------------------------
# ListOps capture
# ---------------------------------------------------------------------------------------------
FALLBACK_OVERRIDES = [
    "experiment=quick", "task=listops", "attention=softmax", "seed=0", "logger=none",
    "model.n_layers=2", "model.d_model=64", "model.d_ffn=128", "model.d_head=128", "task.max_len=1024",
    "task.datamodule.generator.min_length=200", "task.datamodule.generator.max_length=1000",
    "task.datamodule.generator.max_depth=10", "task.datamodule.generator.n_train=2000",
    "task.datamodule.generator.n_val=200", "task.datamodule.generator.n_test=200",
    "task.max_steps=200", "task.val_every=100",
]


def _find_record(run_id: str, dirs: list[Path]) -> Path | None:
    for d in dirs:
        for path in sorted(d.glob(f"**/runs/{run_id}.json")):
            return path
    return None


def _fallback_checkpoint(cache: Path) -> Path | None:
    """The best checkpoint of a FINISHED fallback run in ``cache`` (an unfinished one is resumed)."""
    import json

    for rec_path in sorted((cache / "results" / "runs").glob("*.json")):
        rec = json.loads(rec_path.read_text())
        best = sorted((cache / "ckpt" / str(rec.get("run_id"))).glob("best-*.ckpt"))
        if rec.get("status") == "finished" and best:
            return best[-1]
    return None


def train_fallback(cache: Path) -> Path:
    """A short softmax ListOps run (``experiment=quick``, 2 layers of the Xiong width, sequences of
    200-1000 tokens, 200 steps): the checkpoint used when none is given. Kept in ``cache``; the
    same command resumes an interrupted one (``resume=auto``)."""
    found = _fallback_checkpoint(cache)
    if found is not None:
        return found
    cmd = [sys.executable, str(ROOT / "run.py"), *FALLBACK_OVERRIDES, f"paths.results_dir={cache / 'results'}",
           f"paths.checkpoint_dir={cache / 'ckpt'}", f"paths.data_dir={cache / 'data'}"]
    log.info("approximation: no --checkpoint; training the fallback: %s", " ".join(cmd[1:]))
    subprocess.run(cmd, cwd=ROOT, check=True)
    found = _fallback_checkpoint(cache)
    if found is None:
        raise RuntimeError(f"the fallback training left no finished run with a checkpoint under {cache}")
    return found


def listops_capture(checkpoint: str | Path | None, cache: Path, n_seq: int = 2, seed: int = 0) -> dict:
    """q, k, v, mask and layer input of every layer of a ListOps checkpoint on ``n_seq`` generated
    sequences (float64). The model's config comes from the checkpoint's run record
    (``<results>/runs/<run_id>.json``, the run id being the checkpoint's folder name)."""
    from hydra.utils import instantiate

    from lra.data.listops import encode, generate_one

    fallback = checkpoint is None
    ckpt = Path(train_fallback(cache) if fallback else checkpoint).resolve()
    cached = cache / f"capture-{ckpt.parent.name}-{ckpt.stem}-{n_seq}-{seed}.pt"
    if cached.exists():
        return torch.load(cached, weights_only=False)
    run_id = ckpt.parent.name
    rec_path = _find_record(run_id, [cache, ckpt.parent.parent.parent, default_dir("results_dir")])
    if rec_path is None:
        raise FileNotFoundError(f"no run record {run_id}.json found for checkpoint {ckpt}")
    import json

    from lra.identity import drop_retired

    rec = json.loads(rec_path.read_text())
    config = drop_retired(rec["config"])
    model = instantiate(config["model"], mixer=instantiate(config["attention"]))
    state = torch.load(ckpt, map_location="cpu", weights_only=False)
    state = state.get("state_dict", state)
    model.load_state_dict({k.removeprefix("network."): v for k, v in state.items() if k.startswith("network.")})
    model.eval()
    gen = config["task"]["datamodule"]["generator"]
    lo, hi, max_len = int(gen["min_length"]), int(gen["max_length"]), int(config["task"]["max_len"])
    rng, sources = random.Random(f"approximation:{seed}"), []
    while len(sources) < n_seq:
        one = generate_one(rng, int(gen.get("max_depth", 10)), int(gen.get("max_args", 10)), hi)
        if one is not None and lo < one[2] < hi:
            sources.append(one[0])
    ids, lengths = encode(sources, max_len, config["task"]["datamodule"].get("tokenization", "lra"))
    ids_t = torch.as_tensor(ids, dtype=torch.long)
    mask = ids_t != 0
    layers: list[dict[str, Tensor]] = []

    def hook(_module: torch.nn.Module, args: tuple) -> None:
        q, k, v, pad, x = args
        layers.append({"q": q.double().clone(), "k": k.double().clone(), "v": v.double().clone(),
                       "mask": as_padding(pad).mask.clone(), "x": x.double().clone()})

    handles = [blk.attn.mixer.register_forward_pre_hook(hook) for blk in model.encoder.blocks]
    with torch.no_grad():
        model(ids_t, mask)
    for hd in handles:
        hd.remove()
    meta = {"checkpoint": str(ckpt), "run_id": run_id, "fallback_training": fallback,
            "fallback_overrides": FALLBACK_OVERRIDES if fallback else None,
            "checkpoint_test_acc": (rec.get("metrics") or {}).get("test_acc"),
            "sequence_lengths": [int(x) for x in lengths], "checkpoint_max_len": max_len}
    capture = {"layers": layers, "meta": meta}
    cache.mkdir(parents=True, exist_ok=True)
    torch.save(capture, cached)
    return capture


# ---------------------------------------------------------------------------------------------
# The protocol
# ---------------------------------------------------------------------------------------------
@dataclass
class Settings:
    lengths: tuple[int, ...] = LENGTHS
    inputs: tuple[str, ...] = INPUTS
    draws: int = 8
    draws_long: int = 2
    tv_max_len: int = 256
    tv_draws: int = 2
    time_steps: bool = True
    seed: int = 0


def sweep(name: str, settings: Settings, capture: dict | None, refs: References | None = None,
          on_point: Callable[[dict], None] | None = None) -> dict[str, Any]:
    """Every budget point x length x input kind of config ``name``: the record's ``approximation`` block."""
    refs = refs or References()
    points = budget_points(name)
    random_variant = is_random(name, points[0]["overrides"], settings.seed)
    shared = bool(build(name, points[0]["overrides"], 256, 0).shared_qk)
    results, inputs_meta, times = [], {}, {}
    t_start, cpu_start = time.perf_counter(), time.process_time()
    for n in settings.lengths:
        for pt in points:
            if settings.time_steps:
                times[(n, id(pt))] = step_time(name, pt["overrides"], n)
        for kind in settings.inputs:
            inp = make_inputs(kind, n, capture, settings.seed)
            for pt in points:
                draws = (settings.draws_long if n >= LONG else settings.draws) if random_variant else 1
                t0 = time.perf_counter()
                try:
                    r = measure_point(name, pt["overrides"], inp, refs, draws,
                                      settings.tv_draws if n <= settings.tv_max_len else 0)
                    status = "ok"
                except Exception as e:  # noqa: BLE001 - one failing point must not stop the map
                    r, status = {"error": f"{type(e).__name__}: {e}"[:500]}, "failed"
                _, _, ref_meta = refs.get(inp, shared)
                inputs_meta.setdefault(f"{kind}@{n}", {**inp.meta, **ref_meta})
                point = {"n": n, "input": kind, "knob": pt["knob"], "value": pt["value"], "default": pt["default"],
                         "overrides": pt["overrides"], "status": status, "seconds": time.perf_counter() - t0, **r}
                if settings.time_steps:
                    point["time"] = times[(n, id(pt))]
                results.append(point)
                if on_point:
                    on_point(point)
    return {"random": random_variant, "points": results, "inputs": inputs_meta,
            "knobs": [{"key": k.key, "values": list(k.values)} for k in knobs_of(name)],
            "fixed": dict(spec(name).fixed), "wall_s": time.perf_counter() - t_start,
            "cpu_s": time.process_time() - cpu_start}


def approximate_configs() -> list[str]:
    from attention.registry import variant_names

    return [v for v in variant_names() if spec(v).excluded is None]


def settings_meta(settings: Settings) -> dict[str, Any]:
    return {"lengths": list(settings.lengths), "inputs": list(settings.inputs), "draws": settings.draws,
            "draws_long": settings.draws_long, "draws_long_from": LONG, "tv_max_len": settings.tv_max_len,
            "tv_draws": settings.tv_draws,
            "heads": HEADS, "head_dim": HEAD_DIM, "dtype": "float64", "mode": "eval", "seed": settings.seed,
            "temperatures": TEMPERATURES, "threads": torch.get_num_threads(),
            "time": "lra.bench.harness.measure, protocol block (fwd+bwd of one encoder block), float32, batch 1, 1 thread"}


def run(names: list[str], settings: Settings, results_dir: str | Path | None, capture: dict | None) -> list[Path]:
    """One record per config (mode ``approximation``) under ``<results_dir>/runs/``."""
    from lra.records import RunRecord

    paths, refs = [], References()
    for name in names:
        spec(name)   # every name first: a config without a complete spec stops the map before any point
    for name in names:
        if spec(name).excluded:
            log.info("approximation: %s skipped (%s)", name, spec(name).excluded)
            continue
        meta = settings_meta(settings) | {"listops": capture["meta"] if capture else None}
        record = None
        if results_dir is not None:
            record = RunRecord(results_dir, mode=MODE, task="none", attention=name, seed=settings.seed,
                               config={"approximation": meta, "attention": default_config(name),
                                       "attention_name": name}, protocol=MODE)
            record.update(approximation={"settings": meta, "points": []}).write()

        def progress(point: dict, name: str = name) -> None:
            err = point.get("rel_error", {}).get("mean")
            log.info("%s N=%d %s %s=%s: rel err %s%s", name, point["n"], point["input"], point["knob"], point["value"],
                     f"{err:.4g}" if err is not None else point.get("error"),
                     f", TV {point['tv_mean']['mean']:.3g}" if "tv_mean" in point else "")

        t0 = time.perf_counter()
        if record is None:
            sweep(name, settings, capture, refs, progress)
            continue
        with record.outcome():
            block = sweep(name, settings, capture, refs, progress)
            record.update(approximation={"settings": meta, **block})
            ok = any(p["status"] == "ok" for p in block["points"])
            paths.append(record.finish("finished" if ok else "failed",
                                       None if ok else "every point failed"))
        log.info("approximation: %s done in %.0f s -> %s", name, time.perf_counter() - t0, paths[-1])
    return paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m lra.bench --protocol approximation",
                                description="The approximation map: error against exact softmax attention.")
    p.add_argument("--protocol", default=MODE, choices=[MODE])
    p.add_argument("--variants", default=None, help="comma-separated conf/attention names (default: every approximate config)")
    p.add_argument("--lengths", type=int, nargs="+", default=list(LENGTHS))
    p.add_argument("--inputs", default=",".join(INPUTS), help=f"comma-separated input kinds ({', '.join(INPUTS)})")
    p.add_argument("--draws", type=int, default=8, help="draws of a random variant (>= 8 for the map)")
    p.add_argument("--draws-long", type=int, default=2, help=f"draws at N >= {LONG}")
    p.add_argument("--tv-max-len", type=int, default=256, help="read the mixing matrix (TV distance) up to this N")
    p.add_argument("--tv-draws", type=int, default=2, help="draws whose mixing matrix is read (TV distance)")
    p.add_argument("--checkpoint", default=None, help="softmax ListOps checkpoint (default: a short training run)")
    p.add_argument("--cache-dir", default=str(default_dir("checkpoint_dir") / "approximation-listops"),
                   help="the softmax ListOps run's cache (default: $LRA_CHECKPOINT_DIR/approximation-listops, else ./checkpoints/...)")
    p.add_argument("--no-time", action="store_true", help="skip the step-time measurements")
    p.add_argument("--results-dir", default=str(default_dir("results_dir")),
                   help="records go to <results-dir>/runs/ (default: $LRA_RESULTS_DIR, else ./results, as run.py)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    torch.set_num_threads(1)
    try:
        names = [v.strip() for v in args.variants.split(",")] if args.variants else approximate_configs()
        for name in names:
            spec(name)
    except ConfigError as e:
        p.error(f"--variants: {e}")
    inputs = tuple(s.strip() for s in args.inputs.split(",") if s.strip())
    bad = [s for s in inputs if s not in INPUTS]
    if bad:
        p.error(f"--inputs: unknown kind {bad[0]}; valid: {', '.join(INPUTS)}")
    settings = Settings(tuple(args.lengths), inputs, args.draws, args.draws_long, args.tv_max_len, args.tv_draws,
                        not args.no_time)
    capture = None
    if any(s.startswith("listops") for s in inputs):
        capture = listops_capture(args.checkpoint, Path(args.cache_dir))
    t0 = time.perf_counter()
    paths = run(names, settings, args.results_dir, capture)
    log.info("approximation: %d record(s), %.0f s wall, %.0f s CPU on %d thread(s)", len(paths),
             time.perf_counter() - t0, time.process_time(), torch.get_num_threads())
    return 0


def run_from_config(cfg: Any) -> dict[str, Any]:
    """``run.py mode=bench bench.protocol=approximation``: the composed attention (every approximate
    config when it is softmax), settings from ``bench.approximation``."""
    a = cfg.bench.get("approximation") or {}
    torch.set_num_threads(int(cfg.bench.get("threads") or 1))
    name = str(cfg.attention_name)
    names = list(a.get("variants") or ([name] if name != REFERENCE else approximate_configs()))
    for n in names:
        spec(n)   # one line (ConfigError) for a config without a complete spec, before any work
    settings = Settings(tuple(int(n) for n in (cfg.bench.get("lengths") or LENGTHS)), tuple(a.get("inputs") or INPUTS),
                        int(a.get("draws") or 8), int(a.get("draws_long") or 2), int(a.get("tv_max_len") or 256),
                        int(a.get("tv_draws") if a.get("tv_draws") is not None else 2), bool(a.get("time", True)),
                        int(cfg.seed))
    capture = None
    if any(s.startswith("listops") for s in settings.inputs):
        capture = listops_capture(a.get("checkpoint"), Path(a.get("cache_dir") or Path(cfg.paths.checkpoint_dir) / "approximation-listops"))
    paths = run(names, settings, cfg.paths.results_dir, capture)
    return {"records": [str(p) for p in paths]}
