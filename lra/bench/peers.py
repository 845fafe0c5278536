"""The race against the public implementations (issue 14, item 2):
``python -m lra.bench --protocol peers [--variants a,b] [--shapes 64/2 256/4] [--lengths 1024 4096]``.

For every variant whose peer package is installed, our attention layer and the peer's are timed side
by side under one protocol, and their peak memory is measured, each in a fresh process:

* CPU, float32, ``--threads`` (default 1, written into the output), batch 8, shapes (d_model 64,
  2 heads) and (d_model 256, 4 heads), N = 1024 and 4096; no padding (mask all True), attention
  dropout 0, training mode: what a training step runs.
* A step is forward + backward of the attention LAYER with its projections on both sides: ours is
  the suite's shell (:class:`attention.shell.MultiHeadAttention`: q/k/v projections, the mixer,
  the output projection) built from ``conf/attention/<name>.yaml`` as the model builds it
  (``max_len`` = N, dropout keys forced to 0 as :func:`lra.bench.harness.attention_config` does); the peer
  is its own layer with the closest hyperparameters (table below). Loss ``mean(out^2)`` plus the
  layer's auxiliary loss where it has one (routing's commitment loss, on both sides); the input
  requires grad, as a layer inside a network does.
* Time: in ONE fresh process per round, ``--warmup`` untimed steps of each side, then steps
  alternate ours, peer, ours, peer ... until each side has at least 3 steps and ``--min-time``
  seconds of them, so load drift hits both alike. ``--rounds`` repeats that in new processes (the
  peer leading each pair in odd rounds) and pools the steps. Time ratio = the median over all pairs
  of (our step / the peer's adjacent step): below 1 we are faster. A pair's two steps are seconds
  apart, so the machine's drift (+-25% over seconds when shared) cancels in each pair; the ratio of
  the pooled medians, which drift does not cancel in, is recorded too (``time_ratio_of_medians``).
* Memory: each side alone in a fresh process (allocator state never shared), measured as
  :func:`lra.bench.harness.measure` does: anonymous peak RSS (:class:`lra.footprint.PeakMemory`, file-backed
  pages excluded) over 2 steps after 1 warm-up step, minus the memory in use before the layer was
  built (after the imports and a throw-away backward). Ratio = our peak / peer peak; largest of the
  rounds. Timing processes get the suite's bench allocator setting (``--cpu-malloc``, default
  ``tuned`` as ``bench.cpu_malloc``); memory processes map every block of 64 KiB or more on its own
  (``EXACT_MALLOC``, without the timing setting, which disables mapping: :func:`memory_env`), so the
  peak is that of live tensors and repeats to ~0.2 MB. Every process gets ``OMP_NUM_THREADS`` =
  threads (fast-transformers' C++ kernels use OpenMP).
* Agreement: where both sides are deterministic, the projections (and the mechanism's learned or
  drawn tensors: Linformer's E/F, Performer's features, Nystromformer's conv kernel) are copied
  from ours into the peer (ours built without the projection biases the peer lacks, see below), both run in eval mode in
  float64 on one sample at the race's N, and the figure is max |ours - peer| / max |ours|; "yes"
  below 1e-9 (1e-5 for Nystromformer, whose peer starts the pseudo-inverse differently: ~3e-7;
  a wrong mapping, e.g. one pinv iteration less, differs by ~1e-3). Where the mechanism draws
  randomness the two cannot share (hash planes, LSH rotations, Gumbel noise, k-means
  initialisations drawn inside the peer), "n/a (random)" with the reason.
* A peer that is not importable gives one clean "skipped" line naming the pip package.

Peer mapping (our conf value -> the peer's argument; ``h`` heads, ``d`` d_model, ``N`` length); which
peers a config races is its class's ``spec.peers`` (attention/spec.py), naming this module's adapters:

=============  ==================================================  ================================================
variant        peer (pip package: class)                           hyperparameters
=============  ==================================================  ================================================
softmax        torch: ``F.scaled_dot_product_attention``            same four nn.Linear projections as ours, no mask
clustered      pytorch-fast-transformers: ``ClusteredAttention``    clusters=100, iterations=10, bits=63 (AttentionLayer)
i_clustered    pytorch-fast-transformers: ``ImprovedClustered..``   clusters=100, iterations=10, bits=63, topk=32
linear         pytorch-fast-transformers: ``LinearAttention``       elu+1 feature map, eps=1e-6
reformer       pytorch-fast-transformers: ``ReformerAttention``     rounds=n_hashes (2), chunk_size=64,
                                                                   bits=n_buckets/2 (n_buckets = N/bucket_size 32)
reformer       reformer-pytorch: ``LSHSelfAttention``              n_hashes=2, bucket_size=chunk_size 64 (its
                                                                   chunk = its bucket: each query sees 2x64 keys
                                                                   as ours; its buckets hold ~64 tokens, ours ~32),
                                                                   attend_across_buckets=False,
                                                                   allow_duplicate_attention=False (ours: own
                                                                   bucket only, duplicates discounted)
routing        routing-transformer: ``SelfAttention``              local_attn_heads=h//2, window_size=N/k with
                                                                   k=round(sqrt(N)) (so k clusters of N/k tokens),
                                                                   local_attn_window_size=256 (min N),
                                                                   local_attn_radius_blocks=0 (ours: own block),
                                                                   rel_pos_emb=False, ema 0.999, commitment 1e-4
sinkhorn       sinkhorn-transformer: ``SinkhornSelfAttention``     bucket_size=32, sinkhorn_iter=7,
                                                                   temperature=0.75, non_permutative=False
                                                                   (Gumbel-Sinkhorn sorting, as ours)
nystromformer  nystrom-attention: ``NystromAttention``              num_landmarks=32, pinv_iterations=6,
                                                                   residual conv kernel 33
performer      performer-pytorch: ``SelfAttention``                nb_features=256, softmax kernel,
                                                                   qkv_bias=True (ours has biases)
local          local-attention: ``LocalAttention``                 window_size=64, look_backward=1,
                                                                   look_forward=1, non-causal, no rotary;
                                                                   our four projections around it
linformer      linformer: ``LinformerSelfAttention``               k=256 (min N), share_kv=False
=============  ==================================================  ================================================

Projection biases follow the peer (``Peer.biases``): where the peer's q/k/v or output projections
have no bias (linformer, nystrom, reformer-pytorch, sinkhorn: q/k/v; routing: output; its local heads'
q/k/v do have biases, so ours keep theirs), ours run without them too: bias adds are not the
mechanism. Differences that remain, written down: fast-transformers' AttentionLayer always builds a key
projection, also for Reformer (which ignores it: shared QK); the Nystromformer
peer starts its pseudo-inverse from a max over the whole batch and heads (ours per matrix), so it
agrees to ~3e-7, not to round-off; the agreement run uses the peer's eps for Performer (1e-4; ours 1e-6).
``pytorch-fast-transformers`` is not in the ``peers`` extra: its setup.py builds CUDA extensions
whenever ``nvcc`` is on the PATH (docs/race.md: how to build its CPU extensions).
"""
from __future__ import annotations

import argparse
import gc
import importlib
import json
import math
import os
import platform
import shlex
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention.padding import Padding
from attention.spec import complete_configs, spec_of
from lra import CONF_DIR, ROOT

RESULT_TAG = "LRA_PEERS_RESULT "
MODULE = __spec__.name if __spec__ is not None else "lra.bench.peers"   # the workers run this module (moves with it)
AGREE_TOL = 1e-9   # float64: a right mapping agrees to ~1e-15, a wrong one by >1e-4
MIN_STEPS = 3


# ---------------------------------------------------------------------------------------------
# Our side
# ---------------------------------------------------------------------------------------------
def our_conf(variant: str, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """conf/attention/<variant>.yaml, dropout keys forced to 0 (as the bench does), plus overrides."""
    from omegaconf import OmegaConf

    from lra.bench.harness import attention_config

    cfg, _ = attention_config(OmegaConf.load(CONF_DIR / "attention" / f"{variant}.yaml"))
    return {**cfg, **(overrides or {})}


def build_ours(conf: dict[str, Any], d_model: int, n_heads: int, n: int) -> nn.Module:
    """The suite's attention layer exactly as :class:`models.encoder.EncoderBlock` builds it."""
    from hydra.utils import instantiate

    from attention.shell import MultiHeadAttention

    return MultiHeadAttention(d_model, n_heads, instantiate(conf), max_len=n, layer_idx=0)


def ours_forward(layer: nn.Module, x: Tensor) -> tuple[Tensor, Tensor | None]:
    out = layer(x, Padding.full(x.shape[0], x.shape[1], x.device))   # no padding, stated on the host
    aux, layer.mixer.aux_loss = layer.mixer.aux_loss, None
    return out, aux


# ---------------------------------------------------------------------------------------------
# Peer adapters: build(conf, d_model, n_heads, n) -> module whose forward(x) gives (out, aux | None)
# ---------------------------------------------------------------------------------------------
class _Peer(nn.Module):
    """Uniform call: ``forward(x) -> (out [B, N, D], aux loss or None)``."""

    def __init__(self, layer: nn.Module, call: Callable[[nn.Module, Tensor], Any], aux: bool = False) -> None:
        super().__init__()
        self.layer, self._call, self._aux = layer, call, aux

    def forward(self, x: Tensor) -> tuple[Tensor, Tensor | None]:
        out = self._call(self.layer, x)
        return (out[0], out[1]) if self._aux else (out, None)


class _Projected(nn.Module):
    """A bare mechanism ``f(q, k, v) [B, H, N, dh]`` between four projections like ours."""

    def __init__(self, d_model: int, n_heads: int, mechanism: Callable[[Tensor, Tensor, Tensor], Tensor]) -> None:
        super().__init__()
        self.h = n_heads
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (nn.Linear(d_model, d_model) for _ in range(4))
        self.mechanism = mechanism   # an nn.Module mechanism registers as a submodule

    def forward(self, x: Tensor) -> Tensor:
        b, n, d = x.shape
        q, k, v = (p(x).view(b, n, self.h, d // self.h).transpose(1, 2) for p in (self.q_proj, self.k_proj, self.v_proj))
        return self.out_proj(self.mechanism(q, k, v).transpose(1, 2).reshape(b, n, d))


def _ft_call(layer: nn.Module, x: Tensor) -> Tensor:
    from fast_transformers.masking import FullMask, LengthMask

    b, n, _ = x.shape
    lengths = LengthMask(torch.full((b,), n, dtype=torch.long, device=x.device), max_len=n)
    return layer(x, x, x, FullMask(n, device=x.device), lengths, lengths)


def _ft(inner: nn.Module, d_model: int, n_heads: int) -> nn.Module:
    from fast_transformers.attention import AttentionLayer

    return _Peer(AttentionLayer(inner, d_model, n_heads), _ft_call)


def peer_softmax(conf: dict, d: int, h: int, n: int) -> nn.Module:
    return _Peer(_Projected(d, h, F.scaled_dot_product_attention), lambda m, x: m(x))


def peer_clustered(conf: dict, d: int, h: int, n: int) -> nn.Module:
    from fast_transformers.attention import ClusteredAttention, ImprovedClusteredAttention

    kw = dict(clusters=min(conf["clusters"], n), iterations=conf["iterations"], bits=conf["bits"], attention_dropout=0.0)
    inner = ImprovedClusteredAttention(topk=min(conf["topk"], n), **kw) if conf["improved"] else ClusteredAttention(**kw)
    return _ft(inner, d, h)


def peer_linear_ft(conf: dict, d: int, h: int, n: int) -> nn.Module:
    from fast_transformers.attention import LinearAttention

    return _ft(LinearAttention(d // h, eps=conf["eps"]), d, h)


def reformer_buckets(conf: dict, n: int) -> int:
    """Our bucket count at max_len n (attention/reformer.py: ceil(n / bucket_size), rounded up to even)."""
    nb = math.ceil(n / conf["bucket_size"])
    return nb + nb % 2


def peer_reformer_ft(conf: dict, d: int, h: int, n: int) -> nn.Module:
    from fast_transformers.attention import ReformerAttention

    inner = ReformerAttention(chunk_size=min(conf["chunk_size"], n), bits=max(1, reformer_buckets(conf, n) // 2),
                              rounds=conf["n_hashes"], attention_dropout=0.0)
    return _ft(inner, d, h)


def peer_reformer_lucid(conf: dict, d: int, h: int, n: int) -> nn.Module:
    from reformer_pytorch import LSHSelfAttention

    layer = LSHSelfAttention(dim=d, heads=h, bucket_size=min(conf["chunk_size"], n // 2), n_hashes=conf["n_hashes"],
                             attend_across_buckets=False, allow_duplicate_attention=False, dropout=0.0)
    return _Peer(layer, lambda m, x: m(x))


def routing_split(conf: dict, h: int, n: int) -> tuple[int, int, int]:
    """(local heads, clusters k, local window) as our RoutingAttention resolves them at max_len n."""
    local = h // 2 if conf.get("local_heads") is None else conf["local_heads"]
    k = max(1, round(math.sqrt(n))) if conf.get("n_clusters") is None else conf["n_clusters"]
    return local, k, min(conf["window"], n)


def peer_routing(conf: dict, d: int, h: int, n: int) -> nn.Module:
    from routing_transformer.routing_transformer import SelfAttention

    local, k, window = routing_split(conf, h, n)
    layer = SelfAttention(dim=d, depth=1, max_seq_len=n, heads=h, local_attn_heads=local, window_size=n // k,
                          local_attn_window_size=window, local_attn_radius_blocks=0, rel_pos_emb=False,
                          attn_dropout=0.0, dropout=0.0, kmeans_ema_decay=conf["decay"],
                          commitment_factor=conf["commitment"])
    return _Peer(layer, lambda m, x: m(x), aux=True)


def peer_sinkhorn(conf: dict, d: int, h: int, n: int) -> nn.Module:
    from sinkhorn_transformer.sinkhorn_transformer import SinkhornSelfAttention

    layer = SinkhornSelfAttention(dim=d, bucket_size=min(conf["block_size"], n), max_seq_len=n, heads=h,
                                  sinkhorn_iter=conf["sinkhorn_iterations"], temperature=conf["temperature"],
                                  non_permutative=False, attn_dropout=0.0, dropout=0.0)
    return _Peer(layer, lambda m, x: m(x))


def peer_nystrom(conf: dict, d: int, h: int, n: int) -> nn.Module:
    from nystrom_attention import NystromAttention

    kernel = conf.get("conv_kernel")
    layer = NystromAttention(dim=d, dim_head=d // h, heads=h, num_landmarks=min(conf["num_landmarks"], n),
                             pinv_iterations=conf["pinv_iterations"], residual=bool(kernel),
                             residual_conv_kernel=kernel or 33, dropout=0.0)
    return _Peer(layer, lambda m, x: m(x))


def peer_performer(conf: dict, d: int, h: int, n: int) -> nn.Module:
    from performer_pytorch import SelfAttention

    if conf["kernel"] != "softmax":
        raise ValueError("the performer-pytorch adapter maps the softmax kernel only")
    layer = SelfAttention(dim=d, heads=h, dim_head=d // h, nb_features=conf["nb_features"], qkv_bias=True,
                          attn_out_bias=True, dropout=0.0)
    return _Peer(layer, lambda m, x: m(x))


def peer_local(conf: dict, d: int, h: int, n: int) -> nn.Module:
    from local_attention import LocalAttention

    w = conf["window"]
    inner = LocalAttention(window_size=min(conf["block_size"], n), causal=False, look_backward=w, look_forward=w,
                           dropout=0.0, autopad=True)
    return _Peer(_Projected(d, h, inner), lambda m, x: m(x))


def peer_linformer(conf: dict, d: int, h: int, n: int) -> nn.Module:
    from linformer import LinformerSelfAttention

    layer = LinformerSelfAttention(dim=d, seq_len=n, k=min(conf["k"], n), heads=h, share_kv=conf["share_kv"], dropout=0.0)
    return _Peer(layer, lambda m, x: m(x))


# ---------------------------------------------------------------------------------------------
# Weight alignment for the agreement check (ours -> peer)
# ---------------------------------------------------------------------------------------------
def _set(dst: nn.Linear, src: nn.Linear) -> None:
    dst.weight.copy_(src.weight)
    if dst.bias is not None:
        dst.bias.copy_(src.bias)
    elif src.bias is not None:
        src.bias.zero_()  # the peer has no bias: ours then computes without one


def _align_four(ours: nn.Module, q: nn.Linear, k: nn.Linear, v: nn.Linear, out: nn.Linear) -> None:
    for dst, src in ((q, ours.q_proj), (k, ours.k_proj), (v, ours.v_proj), (out, ours.out_proj)):
        _set(dst, src)


def align_projected(ours: nn.Module, peer: nn.Module) -> None:
    p = peer.layer
    _align_four(ours, p.q_proj, p.k_proj, p.v_proj, p.out_proj)


def align_ft(ours: nn.Module, peer: nn.Module) -> None:
    p = peer.layer
    _align_four(ours, p.query_projection, p.key_projection, p.value_projection, p.out_projection)


def align_performer(ours: nn.Module, peer: nn.Module) -> None:
    p = peer.layer
    _align_four(ours, p.to_q, p.to_k, p.to_v, p.to_out)
    p.fast_attention.projection_matrix.copy_(ours.mixer.features)


def align_linformer(ours: nn.Module, peer: nn.Module) -> None:
    p = peer.layer
    _align_four(ours, p.to_q, p.to_k, p.to_v, p.to_out)
    p.proj_k.copy_(ours.mixer.proj_k)
    p.proj_v.copy_(ours.mixer.proj_v)


def align_nystrom(ours: nn.Module, peer: nn.Module) -> None:
    p = peer.layer
    for src in (ours.q_proj, ours.k_proj, ours.v_proj):
        if src.bias is not None:
            src.bias.zero_()
    p.to_qkv.weight.copy_(torch.cat([ours.q_proj.weight, ours.k_proj.weight, ours.v_proj.weight]))
    _set(p.to_out[0], ours.out_proj)
    if ours.mixer.conv_weight is not None:
        p.res_conv.weight.copy_(ours.mixer.conv_weight[:, None, :, None])


# ---------------------------------------------------------------------------------------------
# The table of peers
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Peer:
    variant: str                    # conf/attention/<variant>.yaml: our side
    label: str                      # the peer, for the table
    package: str                    # pip package that provides it
    module: str                     # what must import for the adapter to work
    mapping: str                    # hyperparameters, one line (printed with the results)
    build: Callable[[dict, int, int, int], nn.Module]
    align: Callable[[nn.Module, nn.Module], None] | None = None   # None: outputs cannot be compared
    why_not: str = ""               # the reason when align is None
    agree_overrides: dict[str, Any] = field(default_factory=dict)  # our conf for the agreement run
    agree_tol: float = AGREE_TOL    # relative difference below which the outputs agree
    biases: tuple[bool, bool] = (True, True)   # the peer's (q/k/v, output) projections have biases

    @property
    def key(self) -> str:
        return f"{self.variant}:{self.package}"


FT = "pytorch-fast-transformers"


def spec_peers() -> tuple[Peer, ...]:
    """The table of peers: every config's ``spec.peers`` (attention/spec.py), in the order of the
    configs, with the adapter functions of this module the spec names."""
    out = []
    for name in complete_configs():
        for ref in spec_of(name).peers:
            if ref.config != name:
                continue
            out.append(Peer(ref.config, ref.label, ref.package, ref.module, ref.mapping, globals()[ref.build],
                            globals()[ref.align] if ref.align else None, ref.why_not, dict(ref.agree_overrides),
                            AGREE_TOL if ref.agree_tol is None else ref.agree_tol, tuple(ref.biases)))
    return tuple(out)


PEERS: tuple[Peer, ...] = spec_peers()


def find_peer(key: str, peers: tuple[Peer, ...] = PEERS) -> Peer:
    for p in peers:
        if p.key == key:
            return p
    raise KeyError(f"no peer {key!r}; known: {', '.join(p.key for p in peers)}")


def availability(peer: Peer) -> str | None:
    """None when the peer imports, else the skip reason naming the pip package."""
    try:
        importlib.import_module(peer.module)
    except Exception as e:  # ImportError, or a compiled extension that fails to load
        how = f"pip install {peer.package}" + (" (CPU build: see docs/race.md)" if peer.package == FT else "")
        return f"skipped: {peer.package} not installed ({type(e).__name__}); {how}"
    return None


# ---------------------------------------------------------------------------------------------
# Measurements (each kind runs in a fresh process: ``--worker``)
# ---------------------------------------------------------------------------------------------
def build_side(job: dict[str, Any], side: str, peers: tuple[Peer, ...] = PEERS, dtype: torch.dtype = torch.float32,
               overrides: dict[str, Any] | None = None) -> nn.Module:
    """Our layer (``side='ours'``, seed s) or the peer's (seed s + 1) for a job's shape."""
    peer = find_peer(job["peer"], peers)
    conf = our_conf(peer.variant, {**job.get("overrides", {}), **(overrides or {})})
    d, h, n = job["d_model"], job["n_heads"], job["length"]
    torch.manual_seed(job.get("seed", 0) + (side != "ours"))
    if side != "ours":
        return peer.build(conf, d, h, n).to(dtype)
    return match_biases(build_ours(conf, d, h, n), *peer.biases).to(dtype)


def match_biases(layer: nn.Module, qkv: bool, out: bool) -> nn.Module:
    """Our shell without the projection biases the peer's layer does not have (the closest mapping:
    bias adds and their gradients are not the mechanism)."""
    for proj, keep in ((layer.q_proj, qkv), (layer.k_proj, qkv), (layer.v_proj, qkv), (layer.out_proj, out)):
        if proj is not None and not keep:
            proj.register_parameter("bias", None)
    return layer


def _stepper(layer: nn.Module, forward: Callable, x: Tensor) -> Callable[[], None]:
    def step() -> None:
        layer.zero_grad(set_to_none=True)
        x.grad = None
        out, aux = forward(layer, x)
        loss = out.pow(2).mean()
        (loss if aux is None else loss + aux.reshape(())).backward()
    return step


def _peer_forward(layer: nn.Module, x: Tensor) -> tuple[Tensor, Tensor | None]:
    return layer(x)


def _compiled(layer: nn.Module, job: dict[str, Any], side: str) -> nn.Module:
    """``--compile``: both sides through ``torch.compile`` (static shapes; ours must give one graph,
    a peer may break its graph). The warm-up steps pay the compilation."""
    if job.get("compile"):
        layer.compile(fullgraph=side == "ours", dynamic=False)
    return layer


def time_job(job: dict[str, Any], peers: tuple[Peer, ...] = PEERS) -> dict[str, Any]:
    """Warm-up, then ours and the peer alternate step by step; every step's seconds of each side."""
    ours, theirs = (_compiled(build_side(job, side, peers).train(), job, side) for side in ("ours", "peer"))
    x = torch.randn(job["batch_size"], job["length"], job["d_model"], requires_grad=True)
    steps = {"ours": _stepper(ours, ours_forward, x), "peer": _stepper(theirs, _peer_forward, x)}
    if job.get("peer_first"):   # odd rounds: the peer leads each pair, so order effects cancel
        steps = dict(reversed(steps.items()))
    for _ in range(job["warmup"]):
        for s in steps.values():
            s()
    times: dict[str, list[float]] = {"ours": [], "peer": []}
    done = lambda t: len(t) >= MIN_STEPS and sum(t) >= job["min_time_s"]  # noqa: E731
    while not all(done(t) for t in times.values()):
        for side, s in steps.items():
            t0 = time.perf_counter()
            s()
            times[side].append(time.perf_counter() - t0)
    return {"ours_s": times["ours"], "peer_s": times["peer"]}


def memory_job(job: dict[str, Any], peers: tuple[Peer, ...] = PEERS) -> dict[str, Any]:
    """Peak memory of ONE side (``job['side']``), as lra.bench.harness.measure measures a spec."""
    from lra.footprint import PeakMemory

    peer = find_peer(job["peer"], peers)
    importlib.import_module(peer.module)
    import hydra.utils  # noqa: F401

    import attention.shell  # noqa: F401
    importlib.import_module(our_conf(peer.variant)["_target_"].rsplit(".", 1)[0])
    w = torch.zeros(4, requires_grad=True)
    w.sum().backward()   # autograd engine start-up is not the layer's memory
    meter = PeakMemory("cpu")
    gc.collect()
    baseline = meter.current_mb() - meter.file_mb()
    layer = _compiled(build_side(job, job["side"], peers).train(), job, job["side"])
    forward = ours_forward if job["side"] == "ours" else _peer_forward
    x = torch.randn(job["batch_size"], job["length"], job["d_model"], requires_grad=True)
    step = _stepper(layer, forward, x)
    step()
    meter.reset()
    for _ in range(2):
        step()
    peak = meter.peak_mb() - meter.file_mb()
    return {"peak_mb": max(0.0, peak - baseline), "memory_method": meter.method}


def agree_job(job: dict[str, Any], peers: tuple[Peer, ...] = PEERS) -> dict[str, Any]:
    """Max |ours - peer| / max |ours| in float64, eval mode, weights copied ours -> peer."""
    peer = find_peer(job["peer"], peers)
    if peer.align is None:
        return {"agree": None, "why_not": peer.why_not}
    ours, theirs = (build_side(job, side, peers, torch.float64, peer.agree_overrides).eval() for side in ("ours", "peer"))
    with torch.no_grad():
        peer.align(ours, theirs)
        g = torch.Generator().manual_seed(job.get("seed", 0) + 2)
        x = torch.randn(1, job["length"], job["d_model"], generator=g, dtype=torch.float64)
        a, _ = ours_forward(ours, x)
        b, _ = theirs(x)
    return {"agree": float((a - b).abs().max() / a.abs().max()), "agree_tol": peer.agree_tol}


JOBS = {"time": time_job, "memory": memory_job, "agree": agree_job}


# Memory workers: every allocation of 64 KiB or more gets its own mapping, returned at free, so the
# anonymous RSS peak is the peak of live tensors. With glibc's heap (and the dynamic mmap threshold)
# freed blocks are kept and reused by chance: the same workload (the softmax control) read 0.95-1.15x
# of itself between runs; with this setting a figure repeats to ~0.1 MB.
EXACT_MALLOC = {"MALLOC_MMAP_THRESHOLD_": str(64 * 1024)}


def memory_env(env: dict[str, str]) -> dict[str, str]:
    """A timing worker's environment with :data:`EXACT_MALLOC` as its only glibc setting: the timing
    setting (``tuned``: ``MALLOC_MMAP_MAX_=0``, no mapping at all) would defeat it, and freed blocks
    kept on the heap would count in the peak."""
    return {**{k: v for k, v in env.items() if not k.startswith("MALLOC_")}, **EXACT_MALLOC}


def worker_env(threads: int, cpu_malloc: str) -> dict[str, str]:
    from lra.bench.harness import MALLOC_ENV

    if cpu_malloc not in MALLOC_ENV:
        raise ValueError(f"--cpu-malloc {cpu_malloc!r} is not valid; use {' or '.join(MALLOC_ENV)}")
    path = os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return {**os.environ, **MALLOC_ENV[cpu_malloc], "PYTHONPATH": path, "OMP_NUM_THREADS": str(threads),
            "MKL_NUM_THREADS": str(threads)}


def run_worker(job: dict[str, Any], env: dict[str, str], timeout_s: float | None = None) -> dict[str, Any]:
    """One job in a fresh process; a failure comes back as ``{'status': 'failed', 'error': ...}``."""
    try:
        proc = subprocess.run([sys.executable, "-m", MODULE, "--worker"], input=json.dumps(job), text=True,
                              capture_output=True, cwd=ROOT, env=env, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {"status": "timeout", "error": f"{job['kind']} job exceeded {timeout_s} s"}
    for line in reversed(proc.stdout.splitlines()):
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
    status = "oom" if proc.returncode in (-9, 137) else "failed"
    return {"status": status, "error": f"exit {proc.returncode}: {' | '.join(tail)[-300:]}"}


def worker_main() -> int:
    job = json.loads(sys.stdin.read())
    torch.set_num_threads(int(job["threads"]))
    try:
        out = {"status": "ok", **JOBS[job["kind"]](job)}
    except Exception as e:  # one failing peer or shape must not stop the race
        out = {"status": "failed", "error": f"{type(e).__name__}: {e}"[:400]}
    print(RESULT_TAG + json.dumps(out), flush=True)
    return 0


# ---------------------------------------------------------------------------------------------
# The race
# ---------------------------------------------------------------------------------------------
def race_point(peer: Peer, d: int, h: int, n: int, args: argparse.Namespace, env: dict[str, str],
               run: Callable[[dict, dict], dict] = run_worker) -> dict[str, Any]:
    """Every round's timing and both memories at one (shape, length), and the agreement once."""
    job = {"peer": peer.key, "d_model": d, "n_heads": h, "length": n, "batch_size": args.batch_size,
           "threads": args.threads, "seed": 0, "warmup": args.warmup, "min_time_s": args.min_time,
           "compile": bool(getattr(args, "compile", False))}
    ours_s: list[float] = []
    peer_s: list[float] = []
    rounds, mem, mem_errors = [], {"ours": [], "peer": []}, []
    pair = lambda o, p: [a / b for a, b in zip(o, p)]  # noqa: E731 (adjacent steps: drift cancels)
    for i in range(args.rounds):
        t = run({**job, "kind": "time", "peer_first": i % 2 == 1}, env)
        if t.get("status") != "ok":
            return {"status": t.get("status", "failed"), "error": t.get("error", "")}
        ours_s += t["ours_s"]
        peer_s += t["peer_s"]
        rounds.append(statistics.median(pair(t["ours_s"], t["peer_s"])))
        for side in ("ours", "peer"):
            m = run({**job, "kind": "memory", "side": side}, memory_env(env))
            mem[side].append(m.get("peak_mb") if m.get("status") == "ok" else None)
            if m.get("status") != "ok":
                mem_errors.append(f"{side}: {m.get('status')} {m.get('error', '')}"[:300])
    agree = run({**job, "kind": "agree"}, env)
    ours_ms, peer_ms = 1000 * statistics.median(ours_s), 1000 * statistics.median(peer_s)
    mo = max((v for v in mem["ours"] if v is not None), default=None)
    mp = max((v for v in mem["peer"] if v is not None), default=None)
    return {
        "status": "ok", "ours_ms": ours_ms, "peer_ms": peer_ms, "time_ratio": statistics.median(pair(ours_s, peer_s)),
        "time_ratio_of_medians": ours_ms / peer_ms, "time_ratio_rounds": rounds, "steps": [len(ours_s), len(peer_s)],
        "ours_ms_all": [1000 * t for t in ours_s], "peer_ms_all": [1000 * t for t in peer_s],
        "ours_mb": mo, "peer_mb": mp, "mem_ratio": mo / mp if mo is not None and mp and mp >= 1.0 else None,
        "mem_errors": mem_errors,
        "agree": agree.get("agree"), "agree_tol": agree.get("agree_tol"), "agree_note": agree.get("why_not"),
        "agree_error": agree.get("error") if agree.get("status") != "ok" else None,
    }


def agree_cell(r: dict[str, Any]) -> str:
    if r.get("agree") is not None:
        return f"{'yes' if r['agree'] < (r.get('agree_tol') or AGREE_TOL) else 'NO'} {r['agree']:.0e}"
    return "n/a (random)" if r.get("agree_note") else "failed"


def table(rows: list[dict[str, Any]], points: list[tuple[int, int, int]]) -> str:
    """mechanism | peer | per point: time ratio | memory ratio | agree."""
    def short(n: int) -> str:
        return f"{n // 1024}K" if n % 1024 == 0 else str(n)

    header = ["mechanism", "peer"]
    for d, h, n in points:
        tag = f"d{d}/{h}h {short(n)}"
        header += [f"{tag} time", "mem", "agree"]
    body = []
    for row in rows:
        cells = [row["variant"], row["label"]]
        if row.get("skip"):
            body.append(cells + [row["skip"]])
            continue
        for p in points:
            r = row["points"].get("%d/%d/%d" % p, {})
            if r.get("status") != "ok":
                cells += [str(r.get("status", "-")), "", ""]
                continue
            mem = f"{r['mem_ratio']:.2f}" if r.get("mem_ratio") is not None else "-"
            cells += [f"{r['time_ratio']:.2f}", mem, agree_cell(r)]
        body.append(cells)
    full = [header] + [r for r in body if len(r) == len(header)]
    widths = [max(len(r[i]) for r in full) for i in range(len(header))]
    widths[:2] = [max(len(r[i]) for r in [header] + body) for i in range(2)]

    def fmt(r: list[str]) -> str:
        return " | ".join(c.ljust(w) for c, w in zip(r, widths)) if len(r) == len(header) else \
            " | ".join([r[0].ljust(widths[0]), r[1].ljust(widths[1]), r[2]])

    return "\n".join([fmt(header), "-+-".join("-" * w for w in widths)] + [fmt(r) for r in body])


def machine_stamp(threads: int, cpu_malloc: str) -> dict[str, Any]:
    from lra.stamp import cpu_model

    versions = {}
    for pkg in sorted({p.package for p in PEERS}):
        try:
            versions[pkg] = metadata.version(pkg)
        except metadata.PackageNotFoundError:
            versions[pkg] = None
    return {"cpu": cpu_model(), "cpu_count": os.cpu_count(), "threads": threads, "torch": torch.__version__,
            "python": platform.python_version(), "loadavg_start": list(os.getloadavg()), "cpu_malloc": cpu_malloc,
            "peer_versions": versions, "dtype": "float32", "device": "cpu"}


def parse_shapes(items: list[str]) -> list[tuple[int, int]]:
    out = []
    for s in items:
        try:
            d, h = s.lower().lstrip("d").split("/")
            out.append((int(d), int(h)))
        except ValueError:
            raise SystemExit(f"--shapes {s!r}: write d_model/heads, e.g. 64/2 256/4") from None
    return out


def select(variants: str | None, peers: tuple[Peer, ...] = PEERS) -> list[Peer]:
    """Peers of the named variants (``reformer``: both its peers; ``reformer:reformer-pytorch``: one)."""
    if not variants:
        return list(peers)
    names = [v.strip() for v in variants.split(",") if v.strip()]
    known = {p.variant for p in peers} | {p.key for p in peers}
    bad = [v for v in names if v not in known]
    if bad:
        raise SystemExit(f"--variants: no peer for {', '.join(bad)}; variants with a peer: "
                         f"{', '.join(sorted({p.variant for p in peers}))} (or variant:package, e.g. {peers[-1].key})")
    return [p for p in peers if p.variant in names or p.key in names]


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m lra.bench --protocol peers",
                                description="Race our attention layers against the public implementations.")
    p.add_argument("--protocol", default="peers", choices=["peers"])
    p.add_argument("--variants", default=None,
                   help="comma-separated variants or variant:package (default: every variant with a peer)")
    p.add_argument("--shapes", nargs="+", default=["64/2", "256/4"], help="d_model/heads (default: 64/2 256/4)")
    p.add_argument("--lengths", type=int, nargs="+", default=[1024, 4096])
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--rounds", type=int, default=1, help="timing processes per point, pooled (default 1)")
    p.add_argument("--min-time", type=float, default=3.0, help="seconds of timed steps per side per round (default 3)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps of each side first (default 2)")
    p.add_argument("--compile", action="store_true", help="both sides through torch.compile (needs --warmup >= 1)")
    p.add_argument("--cpu-malloc", default="tuned", help="glibc setting of the workers, as bench.cpu_malloc")
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds per worker process")
    p.add_argument("--out", "--json", dest="out", default=None, help="also write the figures here (JSON; never overwritten)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parser().parse_args(argv)
    if args.worker:
        return worker_main()
    if min(args.batch_size, args.threads, args.rounds, *args.lengths) < 1 or args.min_time < 0 or args.warmup < 0:
        raise SystemExit("--batch-size, --threads, --rounds, --lengths must be positive; --min-time, --warmup >= 0")
    if args.compile and args.warmup < 1:
        raise SystemExit("--compile needs --warmup >= 1: the first step compiles, and must not be timed")
    out = Path(args.out) if args.out else None
    if out is not None and out.exists():
        raise SystemExit(f"{out} exists: results already written are never overwritten; choose another --out")
    shapes = parse_shapes(args.shapes)
    peers = select(args.variants)
    points = [(d, h, n) for d, h in shapes for n in args.lengths]
    env = worker_env(args.threads, args.cpu_malloc)
    command = "python -m lra.bench " + " ".join(shlex.quote(a) for a in (argv if "--protocol" in " ".join(argv)
                                                                         else ["--protocol", "peers", *argv]))
    stamp = machine_stamp(args.threads, args.cpu_malloc)
    print(f"race against the peers: {command}")
    print(describe(stamp, args), flush=True)
    rows = race(peers, points, args, env, lambda j, e: run_worker(j, e, args.timeout))
    stamp["loadavg_end"] = list(os.getloadavg())
    print()
    print(report(rows, points, stamp, command))
    if out is not None:
        from lra.files import write_json

        write_json(out, {"command": command, "stamp": stamp, "protocol": vars(args) | {"worker": None},
                         "points": ["%d/%d/%d" % p for p in points], "rows": rows}, exclusive=True)
        print(f"figures written to {out}")
    return 0


def race(peers: list[Peer], points: list[tuple[int, int, int]], args: argparse.Namespace, env: dict[str, str],
         run: Callable[[dict, dict], dict]) -> list[dict[str, Any]]:
    rows = []
    for peer in peers:
        row: dict[str, Any] = {"variant": peer.variant, "label": peer.label, "package": peer.package,
                               "mapping": peer.mapping, "points": {}}
        skip = availability(peer)
        if skip:
            print(f"{peer.variant} vs {peer.label}: {skip}", flush=True)
            rows.append(row | {"skip": skip})
            continue
        for d, h, n in points:
            r = race_point(peer, d, h, n, args, env, run)
            row["points"]["%d/%d/%d" % (d, h, n)] = r
            print(point_line(peer, d, h, n, r), flush=True)
        rows.append(row)
    return rows


def point_line(peer: Peer, d: int, h: int, n: int, r: dict[str, Any]) -> str:
    head = f"{peer.variant} vs {peer.label}, d{d}/{h}h N={n}:"
    if r.get("status") != "ok":
        return f"{head} {r.get('status')} ({r.get('error', '')})"
    mem = (f"{r['ours_mb']:.1f} / {r['peer_mb']:.1f} MB" if r["ours_mb"] is not None and r["peer_mb"] is not None
           else "memory not measured")
    rr = ", ".join(f"{x:.2f}" for x in r["time_ratio_rounds"])
    return (f"{head} {r['ours_ms']:.1f} / {r['peer_ms']:.1f} ms (ratio {r['time_ratio']:.2f}; rounds {rr}; "
            f"{r['steps'][0]}/{r['steps'][1]} steps), {mem}, agree {agree_cell(r)}")


def describe(stamp: dict[str, Any], args: argparse.Namespace) -> str:
    load = ", ".join(f"{x:.2f}" for x in stamp["loadavg_start"])
    return (f"machine: {stamp['cpu']} ({stamp['cpu_count']} cores), {stamp['threads']} thread(s), torch "
            f"{stamp['torch']}, python {stamp['python']}, load average {load}, malloc {stamp['cpu_malloc']}\n"
            f"protocol: CPU float32, batch {args.batch_size}, fwd+bwd of the attention layer with projections, "
            f"train mode, no padding, dropout 0; {args.warmup} warm-up steps each, then ours/peer alternate until "
            f"each has >= {MIN_STEPS} steps and {args.min_time:g} s, x{args.rounds} round(s) (fresh process each); "
            f"memory: each side alone in a fresh process")


def report(rows: list[dict[str, Any]], points: list[tuple[int, int, int]], stamp: dict[str, Any], command: str) -> str:
    load = ", ".join(f"{x:.2f}" for x in stamp["loadavg_start"])
    end = ", ".join(f"{x:.2f}" for x in stamp.get("loadavg_end", []))
    lines = [table(rows, points), "",
             "time = median over adjacent step pairs of our step time / the peer's; mem = our peak / peer peak\n"
             "(anonymous RSS, fresh process each; - = not measured or a peer peak under 1 MB); below 1.00 we are\n"
             "better. agree = max|ours - peer| / max|ours| (float64, eval, weights copied ours -> peer).",
             "", "mapping:"]
    for r in rows:
        note = {p.get("agree_note") for p in r["points"].values() if p.get("agree_note")}
        lines.append(f"  {r['variant']} -> {r['label']} ({r['package']}): {r['mapping']}"
                     + (f"; agree n/a: {'; '.join(sorted(note))}" if note else ""))
    versions = ", ".join(f"{k} {v}" for k, v in stamp["peer_versions"].items() if v)
    lines += ["", f"command: {command}",
              f"machine: {stamp['cpu']} ({stamp['cpu_count']} cores), {stamp['threads']} thread(s), torch {stamp['torch']}, "
              f"load average {load} at start, {end} at end", f"peers: {versions}"]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
