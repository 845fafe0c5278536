"""Efficiency harness: ``python run.py mode=bench ...`` (one run record per job) and a side-by-side
CLI, ``python -m lra.bench --protocol block --variants softmax,linear --lengths 1024 2048 4096``, and the
race against the public implementations, ``python -m lra.bench --protocol peers`` (:mod:`lra.bench.peers`).

Protocols (``bench.protocol``; ``bench.lengths`` / ``bench.batch_size`` null = the protocol's):

* ``table2`` - AdaMRA Table 2: the text task's shapes (vocabulary, classes) with the configured
  backbone (``model=``), batch 16, lengths 1K/2K/4K, ONE full training step (forward, loss,
  backward, AdamW step). Running time and peak memory.
* ``smat`` - AdaMRA Table 3 / eq. 10: the same training step at length 4K, batch 8; examples/s and
  peak memory feed the SMAT score of the report.
* ``block`` - forward + backward of ONE encoder block (``model.d_model``, 64 for the Xiong backbone,
  ``model.n_heads``, ``model.d_ffn``, block dropout 0), batch 8, N = 1K/2K/4K.

Choices, written down:

* No data is read: token ids are uniform over ``1..vocab-1``, every position is real (mask all True,
  the worst case at that length), labels uniform. Retrieval-like (dual) tasks get ``[B, 2, N]`` ids.
* Attention dropout is forced to 0 (every ``*dropout*`` key of the attention config): on CPU a
  non-zero value sends PyTorch's SDPA to its materialised N x N path. The backbone's own dropout is
  kept for the training step (it is part of a real step), and is 0 in the block protocol.
* Timing: ``warmup`` untimed steps, then timed steps, each bracketed by device synchronisation,
  until both ``repeats`` steps and ``min_time_s`` seconds of them are done; the figure is the median
  (min and every step are recorded too). ``min_time_s`` gives a fast variant the same sampling
  window as a slow one: on a shared CPU the speed drifts by +-25% over stretches of seconds
  (measured: one block step went 178-348 ms, median 219, over 250 steps), so 5 steps of a 0.2 s
  variant would sample one stretch while 5 steps of a 2 s variant average several. ``rounds``
  repeats every measurement (in a fresh process each time), interleaved across variants in the CLI,
  and pools the timed steps of all rounds; the peak memory is the largest of the rounds.
* Memory: peak over the timed repeats (:mod:`lra.footprint`), minus the memory in use before the
  model was built, so the figure is what the step needs (parameters, gradients, optimiser state,
  activations, inputs) and not the interpreter. On CPU both ends exclude file-backed pages
  (``RssFile + RssShmem``: library code first touched by the step) and the baseline is taken after
  the imports and a throw-away optimiser step, so it is anonymous memory of the workload only. On
  CUDA the baseline is ~0 and the peak is ``max_memory_allocated``. With ``bench.isolate`` (default) every measurement runs in a FRESH
  subprocess, so no measurement inherits allocator state or a high-water mark from another; with
  ``isolate=false`` measurements share this process (baseline subtracted, but memory the allocator
  kept from an earlier measurement can hide part of a later one's peak).
* Dispatches: one more step, profiled after the timed ones, counts what a GPU step would launch
  (``dispatches``, :func:`count_dispatches`): the outermost aten operators of one training step on
  the accelerator path (:func:`attention.base.emulate_accelerator`, and a foreach AdamW, as
  on CUDA), at the protocol's batch; on CUDA also the runtime's kernel launches; compiled
  (``bench.compile``), also the kernels Inductor generated. At small sizes on a GPU a step costs what
  its operator calls cost (the H200 records fit 1.6 ms + 29 us per operator), so this says why a
  variant is slower than its arithmetic, on any machine. ``python -m lra.bench --protocol
  dispatches`` prints them for every variant beside linear attention's (:mod:`lra.bench.dispatches`).
* A measurement that fails (out of memory, a variant error, timeout) is recorded with its status
  and the others go on; the record is ``failed`` only when every measurement failed.
"""
from __future__ import annotations

import argparse
import difflib
import gc
import importlib
import json
import logging
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable

import torch
import torch.nn.functional as F

from lra import CONF_DIR, ROOT
from lra.badinput import ConfigError, UserError
from lra.files import FOLDERS
from lra.footprint import PeakMemory, count_parameters

log = logging.getLogger(__name__)
RESULT_TAG = "LRA_BENCH_RESULT "
DEVICES = ("auto", "cpu", "cuda")
# bench.compile: false (eager), true (torch.compile's default mode), or a torch.compile mode;
# "reduce-overhead" replays the compiled step as CUDA graphs (one launch per graph on a GPU).
COMPILE_MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


def compile_mode(value: Any) -> str | None:
    """The torch.compile mode of ``bench.compile`` (None: eager)."""
    if value is None or value is False:
        return None
    if value is True:
        return "default"
    if str(value) not in COMPILE_MODES:
        raise ConfigError(f"bench.compile={value!r} is invalid: false (eager), true, or a torch.compile mode "
                          f"({', '.join(COMPILE_MODES)}), e.g. bench.compile=reduce-overhead for CUDA graphs")
    return str(value)


@dataclass(frozen=True)
class Protocol:
    kind: str                 # train_step | block
    lengths: tuple[int, ...]
    batch_size: int
    task: str | None          # the task whose shapes are used (None: the composed task)
    doc: str


PROTOCOLS: dict[str, Protocol] = {
    "table2": Protocol("train_step", (1024, 2048, 4096), 16, "text",
                       "AdaMRA Table 2: one training step (fwd+bwd+AdamW), text shapes, batch 16"),
    "smat": Protocol("train_step", (4096,), 8, "text",
                     "AdaMRA Table 3 (SMAT, eq. 10): one training step, text shapes, length 4K, batch 8"),
    "block": Protocol("block", (1024, 2048, 4096), 8, None,
                      "forward+backward of one encoder block, batch 8"),
}


# ---------------------------------------------------------------------------------------------
# Planning: config -> measurement specs (plain JSON, so a fresh subprocess can run them)
# ---------------------------------------------------------------------------------------------
def attention_config(attention: Any) -> tuple[dict[str, Any], list[str]]:
    """Resolved attention config with every dropout key forced to 0, and the keys forced."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.to_container(attention, resolve=True) if not isinstance(attention, dict) else dict(attention)
    forced = sorted(k for k, v in cfg.items() if "dropout" in k and isinstance(v, (int, float)))
    for k in forced:
        cfg[k] = 0.0
    return cfg, forced


def _compose_task(name: str):
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    if GlobalHydra.instance().is_initialized():
        return compose("config", overrides=[f"task={name}"]).task
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        return compose("config", overrides=[f"task={name}"]).task


def task_shapes(cfg: Any, protocol: Protocol) -> dict[str, Any]:
    """Name, vocabulary, classes and dual-ness of the task whose shapes the protocol uses."""
    explicit = cfg.bench.get("task")
    wanted = explicit or protocol.task
    task, source = cfg.task, "composed task"
    if wanted is not None and wanted != cfg.task.name:
        if (CONF_DIR / "task" / f"{wanted}.yaml").exists():
            task, source = _compose_task(wanted), f"conf/task/{wanted}.yaml"
        elif explicit:
            names = sorted(p.stem for p in (CONF_DIR / "task").glob("*.yaml"))
            raise ConfigError(f"bench.task={wanted!r} has no conf/task/{wanted}.yaml; valid: {', '.join(names)}")
        else:
            source = f"composed task (conf/task/{wanted}.yaml, the protocol's task, does not exist)"
            log.warning("bench: protocol task %r not available; using the shapes of task=%s", wanted, cfg.task.name)
    return {"name": str(task.name), "vocab_size": int(task.vocab_size), "num_classes": int(task.num_classes),
            "dual": bool(task.get("dual", False)), "source": source}


def _count(b: Any, key: str, low: int, default: int | None = None, example: int | None = None) -> int:
    value = b.get(key)
    value = default if value is None else value
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        raise ConfigError(f"bench.{key}={value!r} is invalid: it must be a whole number >= {low}, "
                          f"e.g. bench.{key}={example if example is not None else default}")
    return value


def check_settings(b: Any) -> None:
    """Every ``bench.*`` setting :func:`plan` reads, each wrong one named with its fix (exit 2 in run.py)."""
    if b.get("protocol") not in PROTOCOLS and b.get("protocol") != "approximation":
        valid = [*PROTOCOLS, "approximation"]
        close = difflib.get_close_matches(str(b.get("protocol")), valid, n=1)
        raise ConfigError(f"unknown bench.protocol={b.get('protocol')!r}; valid: {', '.join(valid)}"
                          + (f" (did you mean bench.protocol={close[0]}?)" if close else ""))
    lengths = b.get("lengths")
    if lengths is not None:
        lengths = list(lengths) if not isinstance(lengths, (str, int)) else [lengths]
        bad = [n for n in lengths if isinstance(n, bool) or not isinstance(n, int) or n <= 0]
        if not lengths or bad:
            raise ConfigError(f"bench.lengths={lengths} is invalid: it must be a list of sequence lengths >= 1, "
                              f"e.g. bench.lengths=[1024,2048,4096] (or null: the protocol's)")
    examples = {"batch_size": PROTOCOLS[b.protocol].batch_size, "repeats": 5, "rounds": 1, "warmup": 2}
    for key, low in (("batch_size", 1), ("repeats", 1), ("rounds", 1), ("warmup", 0)):
        if b.get(key) is not None:
            _count(b, key, low, example=examples[key])
    if compile_mode(b.get("compile")) and int(b.get("warmup") or 0) < 1:
        raise ConfigError(f"bench.compile={str(b.get('compile')).lower()} needs bench.warmup >= 1: the first step "
                          "compiles, and must not be timed")
    min_time = b.get("min_time_s")
    if min_time is not None and (isinstance(min_time, bool) or not isinstance(min_time, (int, float)) or min_time < 0):
        raise ConfigError(f"bench.min_time_s={min_time!r} is invalid: it must be a number of seconds >= 0, e.g. bench.min_time_s=3.0")
    device = str(b.get("device") or "auto")
    if device not in DEVICES:
        raise ConfigError(f"unknown bench.device={device!r}; valid: {', '.join(DEVICES)}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("bench.device=cuda but no CUDA GPU is visible (torch.cuda.is_available() is False); "
                          "use bench.device=auto or cpu")
    if b.get("isolate", True) and str(b.get("cpu_malloc") or "default") not in MALLOC_ENV:
        raise ConfigError(f"unknown bench.cpu_malloc={b.get('cpu_malloc')!r}; valid: {', '.join(MALLOC_ENV)}")


def plan(cfg: Any, attention_name: str) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """The bench settings (for the record) and one spec per length."""
    from omegaconf import OmegaConf

    b = cfg.bench
    check_settings(b)
    proto = PROTOCOLS[b.protocol]
    lengths = [int(n) for n in (b.get("lengths") or proto.lengths)]
    batch = _count(b, "batch_size", 1, proto.batch_size)
    repeats, warmup = int(b.repeats), int(b.warmup)
    min_time = float(b.get("min_time_s") or 0.0)
    rounds = 1 if b.get("rounds") is None else int(b.rounds)
    device = str(b.get("device") or "auto")
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    attn, forced = attention_config(cfg.attention)
    model = OmegaConf.to_container(cfg.model, resolve=True)
    shapes = task_shapes(cfg, proto) if proto.kind == "train_step" else None
    meta = {
        "protocol": b.protocol, "kind": proto.kind, "description": proto.doc, "attention": attention_name,
        "batch_size": batch, "lengths": lengths, "repeats": repeats, "warmup": warmup, "device": device,
        "task": shapes["name"] if shapes else "none", "task_shapes": shapes,  # a block sees no task
        "attention_dropout_forced_to_0": forced, "isolate": bool(b.isolate),
        "cpu_malloc": str(b.get("cpu_malloc") or "default") if b.isolate else "default",
        "min_time_s": min_time, "rounds": rounds, "compile": bool(compile_mode(b.get("compile"))),
        **({"compile_mode": compile_mode(b.get("compile"))} if compile_mode(b.get("compile")) else {}),
        "timing": (f"median of all device-synchronised steps, at least {repeats} and {min_time:g} s of them after "
                   f"{warmup} warm-up steps, pooled over {rounds} round(s)"),
    }
    common = {"kind": proto.kind, "attention": attn, "batch_size": batch, "repeats": repeats, "warmup": warmup,
              "min_time_s": min_time, "rounds": rounds,
              "device": device, "seed": int(cfg.seed), "threads": int(b.get("threads") or torch.get_num_threads()),
              "cpu_malloc": meta["cpu_malloc"], "compile": meta.get("compile_mode", False)}
    specs = []
    for n in lengths:
        if proto.kind == "train_step":
            m = {**model, "vocab_size": shapes["vocab_size"], "num_classes": shapes["num_classes"],
                 "max_len": n, "dual": shapes["dual"]}
            specs.append({**common, "length": n, "model": m, "lr": float(cfg.optim.lr)})
        else:
            specs.append({**common, "length": n, "d_model": int(model["d_model"]), "n_heads": int(model["n_heads"]),
                          "d_ffn": int(model["d_ffn"])})
    return meta, specs


# ---------------------------------------------------------------------------------------------
# Measuring one spec
# ---------------------------------------------------------------------------------------------
def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _maybe_compile(model: torch.nn.Module, spec: dict[str, Any]) -> None:
    """``bench.compile``: the model compiled as ``trainer.compile`` does (fullgraph, static shapes),
    in the spec's torch.compile mode; the first warm-up step pays the compilation (``first_step_s``)."""
    if spec.get("compile"):
        mode = compile_mode(spec["compile"])
        model.compile(fullgraph=True, dynamic=False, mode=None if mode == "default" else mode)


Step = Callable[[], None]


def _train_step(spec: dict[str, Any], device: torch.device) -> tuple[Step, torch.nn.Module, Callable[[], Step]]:
    """The timed step, its model, and a maker of the counted step: the same step with a foreach
    AdamW of its own (what CUDA runs; CPU's default loops over the parameters)."""
    from hydra.utils import instantiate

    model = instantiate(spec["model"], mixer=instantiate(spec["attention"])).to(device).train()
    b, n, m = spec["batch_size"], spec["length"], spec["model"]
    shape = (b, 2, n) if m.get("dual") else (b, n)
    ids = torch.randint(1, max(2, m["vocab_size"]), shape, device=device)
    mask = torch.ones(shape, dtype=torch.bool, device=device)
    labels = torch.randint(0, m["num_classes"], (b,), device=device)
    _maybe_compile(model, spec)

    def step_with(opt: torch.optim.Optimizer) -> Step:
        def step() -> None:
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(ids, mask, padded=False), labels)  # stated, as LRAModule does
            aux = model.pop_aux_loss()
            (loss if aux is None else loss + aux).backward()
            opt.step()
        return step

    timed = step_with(torch.optim.AdamW(model.parameters(), lr=spec["lr"]))
    return timed, model, lambda: step_with(torch.optim.AdamW(model.parameters(), lr=spec["lr"], foreach=True))


def _block_step(spec: dict[str, Any], device: torch.device) -> tuple[Step, torch.nn.Module, Callable[[], Step]]:
    from hydra.utils import instantiate

    from attention.base import Mixer
    from attention.padding import Padding
    from models.encoder import EncoderBlock

    b, n, d = spec["batch_size"], spec["length"], spec["d_model"]
    block = EncoderBlock(d, spec["n_heads"], spec["d_ffn"], 0.0, instantiate(spec["attention"]), n, 0)
    block = block.to(device).train()
    x = torch.randn(b, n, d, device=device, requires_grad=True)
    pad = Padding.full(b, n, device)   # no padding, stated on the host as the network does per batch
    mixers = [m for m in block.modules() if isinstance(m, Mixer)]
    _maybe_compile(block, spec)

    def step() -> None:
        block.zero_grad(set_to_none=True)
        x.grad = None
        loss = block(x, pad).pow(2).mean()
        for mx in mixers:
            if mx.aux_loss is not None:
                loss = loss + mx.aux_loss.reshape(())
                mx.aux_loss = None
        loss.backward()

    return step, block, lambda: step  # no optimiser: the counted step is the timed one


def _preload(spec: dict[str, Any], device: torch.device) -> None:
    """Import everything the step will use and run a throw-away AdamW step (its first use imports
    ~70 MB of torch._dynamo), so the memory baseline is taken after one-off import costs."""
    import hydra.utils  # noqa: F401
    import models.encoder  # noqa: F401
    import models.network  # noqa: F401

    importlib.import_module(spec["attention"]["_target_"].rsplit(".", 1)[0])
    p = torch.nn.Parameter(torch.zeros(4, device=device))
    opt = torch.optim.AdamW([p])
    p.sum().backward()
    opt.step()
    _sync(device)


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    """Time and peak memory of one spec, in this process."""
    if spec.get("threads"):
        torch.set_num_threads(int(spec["threads"]))
    device = torch.device(spec["device"])
    meter = PeakMemory(device)
    out: dict[str, Any] = {"length": spec["length"], "batch_size": spec["batch_size"], "memory_method": meter.method,
                           "threads": torch.get_num_threads(), "compile": bool(spec.get("compile"))}
    try:
        _preload(spec, device)
        gc.collect()
        baseline = meter.current_mb() - meter.file_mb()
        torch.manual_seed(spec.get("seed", 0))
        step, model, counted = build_step(spec, device)
        kernels_before = _inductor_kernels()
        for i in range(spec["warmup"]):
            t0 = time.perf_counter()
            step()
            _sync(device)
            if i == 0:
                out["first_step_s"] = time.perf_counter() - t0
        meter.reset()
        times: list[float] = []
        while len(times) < spec["repeats"] or sum(times) < spec.get("min_time_s", 0.0):
            _sync(device)
            t0 = time.perf_counter()
            step()
            _sync(device)
            times.append(time.perf_counter() - t0)
        peak = meter.peak_mb() - meter.file_mb()
        try:   # a diagnostic: a profiler that fails must not cost the measurement
            dispatches: dict[str, Any] = count_dispatches(counted(), device, spec["batch_size"], model)
            if spec.get("compile"):
                dispatches["compiled_kernels"] = _inductor_kernels() - kernels_before
        except Exception as e:
            dispatches = {"error": f"{type(e).__name__}: {e}"[:200]}
    except (torch.OutOfMemoryError, MemoryError) as e:
        return out | {"status": "oom", "error": str(e)[:500]}
    except Exception as e:  # a variant failing at one length must not stop the others
        return out | {"status": "failed", "error": f"{type(e).__name__}: {e}"[:500]}
    ms = 1000.0 * statistics.median(times)
    tokens = spec["batch_size"] * spec["length"] * (2 if spec.get("model", {}).get("dual") else 1)
    return out | {
        "status": "ok", "ms": ms, "ms_min": 1000.0 * min(times), "ms_all": [1000.0 * t for t in times],
        "examples_per_s": spec["batch_size"] / (ms / 1000.0), "tokens_per_s": tokens / (ms / 1000.0),
        "peak_mb": max(0.0, peak - baseline), "peak_process_mb": peak, "baseline_mb": baseline,
        "parameters": count_parameters(model), "dispatches": dispatches,
    }


def build_step(spec: dict[str, Any], device: torch.device) -> tuple[Step, torch.nn.Module, Callable[[], Step]]:
    """The protocol's step for ``spec``: (timed step, model, maker of the counted step)."""
    return (_train_step if spec["kind"] == "train_step" else _block_step)(spec, device)


def _inductor_kernels() -> int:
    """Kernels Inductor has generated in this process so far (0 before any compile)."""
    metrics = sys.modules.get("torch._inductor.metrics")
    return int(getattr(metrics, "generated_kernel_count", 0)) if metrics is not None else 0


COUNTED = ("outermost aten operators of one training step on the accelerator path (emulate_accelerator, "
           "foreach AdamW), batch {batch}, after one warm-up step of the same kind")


def count_dispatches(step: Step, device: torch.device, batch: int, model: torch.nn.Module) -> dict[str, Any]:
    """What one step launches on a GPU, counted on any device: the aten operators called by no other
    aten operator (each one dispatch from Python or the autograd engine; views count, though they
    launch nothing), with ``model``'s mixers on their accelerator choices
    (:func:`attention.base.emulate_accelerator`, undone afterwards) so a CPU-only split is not taken.
    ``step`` runs twice: once to create the optimiser's state, once profiled. On CUDA also
    ``kernel_launches``, the runtime's launch calls."""
    from torch.profiler import ProfilerActivity, profile

    from attention.base import emulate_accelerator

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    emulate_accelerator(model)
    try:
        step()
        _sync(device)
        with profile(activities=activities) as prof:
            step()
            _sync(device)
    finally:
        emulate_accelerator(model, on=False)
    events = prof.events()
    counts: dict[str, Any] = {"outermost_aten_ops": sum(1 for e in events if e.name.startswith("aten::") and not _under_aten(e)),
                              "counted": COUNTED.format(batch=batch)}
    if device.type == "cuda":
        counts["kernel_launches"] = sum(1 for e in events if "LaunchKernel" in e.name)
    return counts


def _under_aten(event: Any) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name.startswith("aten::"):
            return True
        parent = parent.cpu_parent
    return False


# glibc hands every allocation over 32 MB a fresh mmap and returns it at free, so at 4K tokens each
# step page-faults its large tensors anew: CPU step times then grow faster than the arithmetic does
# (measured 2-3.5x slower at 4K). "tuned" keeps freed memory in the heap, as a caching allocator
# does on CUDA; the setting is written into every bench record.
MALLOC_ENV = {"tuned": {"MALLOC_MMAP_MAX_": "0", "MALLOC_TRIM_THRESHOLD_": str(2**36)}, "default": {}}


def measure_isolated(spec: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
    """:func:`measure` in a fresh Python process (honest per-measurement peak memory)."""
    malloc = spec.get("cpu_malloc", "default")
    if malloc not in MALLOC_ENV:
        raise ValueError(f"bench.cpu_malloc={malloc!r} is not valid; use {' or '.join(MALLOC_ENV)}")
    env = {**os.environ, **MALLOC_ENV[malloc],
           "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)}
    base = {"length": spec["length"], "batch_size": spec["batch_size"]}
    try:
        proc = subprocess.run([sys.executable, "-m", "lra.bench.harness", "--worker"], input=json.dumps(spec), text=True,
                              capture_output=True, cwd=ROOT, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return base | {"status": "timeout", "error": f"measurement exceeded bench.timeout_s={timeout_s}"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):]) | {"isolated": True}
    tail = (proc.stderr or proc.stdout)[-800:]
    status = "oom" if proc.returncode in (-9, 137) else "failed"
    return base | {"status": status, "error": f"worker exited with {proc.returncode}: {tail}"}


def pool_rounds(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """One result from the rounds of a measurement: the timed steps of all rounds pooled (median,
    min), the largest peak. A round that did not finish makes the whole measurement not ok."""
    for i, r in enumerate(rounds):
        if r.get("status") != "ok":
            return r | ({"round": i} if len(rounds) > 1 else {})
    if len(rounds) == 1:
        return rounds[0]
    first, steps = rounds[0], [t for r in rounds for t in r["ms_all"]]
    ms = statistics.median(steps)
    peak = max(rounds, key=lambda r: r["peak_mb"])
    return first | {
        "ms": ms, "ms_min": min(steps), "ms_all": steps, "ms_rounds": [r["ms"] for r in rounds],
        "examples_per_s": first["examples_per_s"] * first["ms"] / ms, "tokens_per_s": first["tokens_per_s"] * first["ms"] / ms,
        "peak_mb": peak["peak_mb"], "peak_process_mb": peak["peak_process_mb"], "baseline_mb": peak["baseline_mb"],
        "peak_mb_rounds": [r["peak_mb"] for r in rounds], "rounds": len(rounds),
    }


def run_specs(specs: list[dict[str, Any]], isolate: bool = True, timeout_s: float | None = None) -> list[dict[str, Any]]:
    """Every spec, each its ``rounds`` times in a row (the CLI interleaves rounds across variants)."""
    one = lambda s: measure_isolated(s, timeout_s) if isolate else measure(s)  # noqa: E731
    return [pool_rounds([one(s) for _ in range(int(s.get("rounds", 1)))]) for s in specs]


def _line(name: str, r: dict[str, Any]) -> str:
    if r.get("status") != "ok":
        return f"{name} N={r['length']}: {r.get('status')} ({r.get('error', '')[:200]})"
    return (f"{name} N={r['length']}: {r['ms']:.1f} ms/step, {r['examples_per_s']:.2f} examples/s, "
            f"peak {r['peak_mb']:.1f} MB ({r['memory_method']})"
            + "".join(f", {v} {k.replace('_', ' ')}" for k, v in r.get("dispatches", {}).items() if isinstance(v, int)))


# ---------------------------------------------------------------------------------------------
# run.py mode=bench
# ---------------------------------------------------------------------------------------------
def run_bench(cfg: Any) -> dict[str, Any]:
    """One bench job: measure every length, write one run record (mode=bench)."""
    from omegaconf import OmegaConf

    from lra.records import RunRecord

    name = str(cfg.attention_name)
    meta, specs = plan(cfg, name)
    record = RunRecord(cfg.paths.results_dir, mode="bench", task=meta["task"], attention=name, seed=int(cfg.seed),
                       config=OmegaConf.to_container(cfg, resolve=True), protocol=meta["protocol"])
    record.update(efficiency={"bench": meta | {"results": []}, "threads": specs[0]["threads"]}).write()
    results = []
    with record.outcome():
        for spec in specs:
            results += run_specs([spec], meta["isolate"], cfg.bench.get("timeout_s"))
            log.info(_line(name, results[-1]))
            record.data["efficiency"]["bench"]["results"] = results
            record.write()
    ok = [r for r in results if r.get("status") == "ok"]
    methods = sorted({r["memory_method"] for r in ok})
    record.data["efficiency"]["bench"]["memory_method"] = ",".join(methods) or None
    if ok:
        record.update(efficiency={"parameters": ok[0].get("parameters")})
        path = record.finish("finished")
    else:
        path = record.finish("failed", error="; ".join(f"N={r['length']}: {r.get('error')}" for r in results)[:2000])
    log.info("bench record: %s", path)
    return {"results": results, "record": str(path)}


# ---------------------------------------------------------------------------------------------
# Side-by-side CLI
# ---------------------------------------------------------------------------------------------
def ratio_table(names: list[str], lengths: list[int], results: dict[tuple[str, int], dict[str, Any]]) -> str:
    """Plain-text table: ms and MB per length, with softmax / variant ratios (>1 = better than softmax)."""
    def cell(name: str, n: int, key: str) -> str:
        r, ref = results.get((name, n), {}), results.get(("softmax", n), {})
        if r.get("status") != "ok":
            return str(r.get("status", "-"))
        ratio = f" ({ref[key] / r[key]:.2f}x)" if ref.get("status") == "ok" and r[key] >= 0.05 else ""
        return f"{r[key]:.1f}{ratio}"

    header = ["variant"] + [f"ms@{n}" for n in lengths] + [f"MB@{n}" for n in lengths]
    rows = [[v] + [cell(v, n, "ms") for n in lengths] + [cell(v, n, "peak_mb") for n in lengths] for v in names]
    widths = [max(len(r[i]) for r in [header] + rows) for i in range(len(header))]
    fmt = lambda r: "  ".join(c.ljust(w) for c, w in zip(r, widths))  # noqa: E731
    return "\n".join([fmt(header), fmt(["-" * w for w in widths])] + [fmt(r) for r in rows])


# the row label suffix of each --modes entry (eager has none)
MODE_LABELS = {"eager": "", "default": " compiled", "reduce-overhead": " cudagraphs",
               "max-autotune": " max-autotune", "max-autotune-no-cudagraphs": " max-autotune-no-cudagraphs"}


def compile_table(names: list[str], lengths: list[int], results: dict[tuple[str, int], dict[str, Any]],
                  mode: str = "default") -> str:
    """Step time in torch.compile ``mode`` / eager step time per variant and length (``--modes``)."""
    label = MODE_LABELS[mode]
    lines = [f"{label.strip()} / eager step time (median ms; first compiled step in s)",
             "| variant | " + " | ".join(f"N={n}" for n in lengths) + " |", "|---" * (len(lengths) + 1) + "|"]
    for v in names:
        cells = []
        for n in lengths:
            c, e = results.get((f"{v}{label}", n), {}), results.get((v, n), {})
            if c.get("status") == "ok" and e.get("status") == "ok":
                cells.append(f"{c['ms'] / e['ms']:.2f}x ({c['ms']:.0f}/{e['ms']:.0f} ms; {c.get('first_step_s', 0):.0f} s)")
            else:
                cells.append(f"{c.get('status', '-')}/{e.get('status', '-')}")
        lines.append(f"| {v} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    p = argparse.ArgumentParser(prog="python -m lra.bench", description="Measure variants side by side.")
    p.add_argument("--protocol", default="block", choices=sorted(PROTOCOLS),
                   help="also: peers (our layers against the public implementations; --protocol peers --help)")
    p.add_argument("--variants", default="softmax", help="comma-separated conf/attention names")
    p.add_argument("--lengths", type=int, nargs="+", default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--repeats", type=int, default=None)
    p.add_argument("--warmup", type=int, default=None)
    p.add_argument("--min-time", type=float, default=None, help="seconds of timed steps per measurement, at least")
    p.add_argument("--rounds", type=int, default=None, help="measurements per point, interleaved across variants")
    p.add_argument("--model", default="xiong", help="conf/model name (backbone shapes)")
    p.add_argument("--task", default=None, help="task whose shapes table2/smat use (default: text)")
    p.add_argument("--threads", type=int, default=1, help="torch threads per measurement (default 1: honest per-core timings; 0: torch's default)")
    p.add_argument("--no-isolate", action="store_true", help="measure in this process (faster, less honest memory)")
    p.add_argument("--compile", action="store_true", help="torch.compile each step's model (fullgraph, static shapes)")
    p.add_argument("--against-eager", action="store_true", help="the same as --modes eager,default")
    p.add_argument("--modes", default=None,
                   help="comma-separated: eager and torch.compile modes (default, reduce-overhead = CUDA graphs), "
                        "each variant measured in each, interleaved, with the ratios to eager")
    p.add_argument("--results-dir", default=os.environ.get(FOLDERS["results_dir"][0]) or None,
                   help="also write one run record per variant here (default: $LRA_RESULTS_DIR when it is set, "
                        "where run.py writes them; else no records)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        print(RESULT_TAG + json.dumps(measure(json.loads(sys.stdin.read()))), flush=True)
        return 0
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    from hydra import compose, initialize_config_dir

    names = [v.strip() for v in args.variants.split(",") if v.strip()]
    names = (["softmax"] if "softmax" not in names else []) + names
    over = [f"bench.protocol={args.protocol}", f"model={args.model}"]
    for key, val in (("lengths", args.lengths), ("batch_size", args.batch_size), ("repeats", args.repeats),
                     ("warmup", args.warmup), ("task", args.task), ("threads", args.threads),
                     ("min_time_s", args.min_time), ("rounds", args.rounds)):
        if val is not None:
            over.append(f"bench.{key}=" + (json.dumps(val).replace(" ", "") if isinstance(val, list) else str(val)))
    if args.no_isolate:
        over.append("bench.isolate=false")
    modes = [m.strip() for m in (args.modes or ("eager,default" if args.against_eager else "")).split(",") if m.strip()]
    if any(m not in MODE_LABELS for m in modes):
        p.error(f"--modes: each one of {', '.join(MODE_LABELS)}")
    if args.compile or any(m != "eager" for m in modes):
        over.append("bench.compile=true")
    unknown = [v for v in names if not (CONF_DIR / "attention" / f"{v}.yaml").is_file()]
    if unknown:
        p.error(f"--variants: no conf/attention/{unknown[0]}.yaml")
    try:
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            plans = {v: plan(compose("config", overrides=over + [f"attention={v}"]), v) for v in names}
    except UserError as e:  # the same checks as run.py mode=bench, in argparse's words (exit 2)
        p.error(str(e))
    meta0 = plans[names[0]][0]
    print(f"protocol {args.protocol}: {meta0['description']}; {meta0['timing']}; device {meta0['device']}; "
          f"memory: peak minus pre-build baseline, {'in this process' if args.no_isolate else 'fresh subprocess per measurement'}")
    compiles = [False if m == "eager" else m for m in modes] or [meta0.get("compile_mode", False)]
    label = {c: MODE_LABELS["eager" if c is False else c] for c in compiles} if modes else {compiles[0]: ""}
    results: dict[tuple[str, int], dict[str, Any]] = {}
    for i, n in enumerate(meta0["lengths"]):  # interleaved, so load drift hits every variant alike
        rounds: dict[tuple[str, Any], list[dict[str, Any]]] = {(v, c): [] for v in names for c in compiles}
        for _ in range(meta0["rounds"]):
            for v in names:
                for c in compiles:
                    spec = plans[v][1][i] | {"rounds": 1, "compile": c}
                    rounds[(v, c)] += run_specs([spec], isolate=not args.no_isolate)
        for (v, c), measured in rounds.items():
            results[(v + label[c], n)] = pool_rounds(measured)
            print(_line(v + label[c], results[(v + label[c], n)]), flush=True)
    print()
    print(ratio_table([v + label[c] for v in names for c in compiles], meta0["lengths"], results))
    if False in compiles:
        for c in compiles:
            if c is not False:
                print()
                print(compile_table(names, meta0["lengths"], results, c))
    if args.results_dir:
        for c in compiles:  # one record per variant and mode (compiled and eager are separate bench groups)
            _write_cli_records(args.results_dir, plans, {(v, n): results[(v + label[c], n)] for v in names
                                                          for n in meta0["lengths"]}, compiled=c)
    return 0


def _write_cli_records(results_dir: str, plans: dict, results: dict, compiled: bool | str = False) -> None:
    from lra.records import RunRecord

    for v, (meta, specs) in plans.items():
        mode = compile_mode(compiled)
        meta = {k: x for k, x in meta.items() if k != "compile_mode"} | {"compile": bool(mode)} | (
            {"compile_mode": mode} if mode else {})
        specs = [s | {"compile": mode or False} for s in specs]
        rs = [results[(v, n)] for n in meta["lengths"]]
        ok = [r for r in rs if r.get("status") == "ok"]
        rec = RunRecord(results_dir, mode="bench", task=meta["task"], attention=v, seed=specs[0]["seed"],
                        config={"bench": meta, "spec": specs[0]}, protocol=meta["protocol"])
        rec.update(efficiency={"bench": meta | {"results": rs, "memory_method": ",".join(sorted({r["memory_method"] for r in ok})) or None},
                               "parameters": ok[0].get("parameters") if ok else None, "threads": specs[0]["threads"]})
        rec.finish("finished" if ok else "failed")


if __name__ == "__main__":
    sys.exit(main())
