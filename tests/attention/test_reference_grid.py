"""Every attention config against its float64 reference at every point of its settings grid
(tests/attention/settings_grid.py): values, gradients (inputs and every parameter, the commitment
loss included) and state (routing centroids after the update, Performer features after the redraw
schedule, Memformer memories after every segment, ABC's W_phi tied across layers), at the
tolerances of the defaults' reference tests. The references read the module's parameters and
random draws, never its forward code. One test function per family, so a mutant's check runs its
family only; the grid's size and time are printed at the end of the run."""
from __future__ import annotations

import time

import pytest
import torch

from attention.padding import Padding
from attention.registry import build_mixer
from attention.spec import spec_of
from attention.shell import MultiHeadAttention
from models.encoder import Encoder
from models.memory_encoder import MemformerEncoder
from tests.attention.settings_grid import FAMILIES, HEAD_DIM, TIMES, Point, family_of, grid
from tests.attention.test_reference_baselines import assert_close, forward_with_draws, reference
from tests.attention_harness import DEVICE, lengths_mask, make_mixer, qkvx
from tests.reference import memformer as ref_memformer
from tests.reference.abc import abc_reference
from tests.reference.adamra import adamra_reference
from tests.reference.agreement import ATOL, RTOL, assert_same, grads_of, record_calls
from tests.reference.clustered import clustered_reference
from tests.reference.routing import routing_reference


F64 = torch.float64


def inputs64(p: Point, seed: int = 1) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """Float64 ``q, k, v, x`` of the point's shape that require grad, and its mask."""
    q, k, v, x = qkvx(b=len(p.lengths), h=p.heads, n=p.n, dh=HEAD_DIM, seed=seed)
    tensors = {name: t.to(DEVICE, F64).requires_grad_(True) for name, t in zip("qkvx", (q, k, v, x))}
    return tensors, lengths_mask(list(p.lengths), p.n).to(DEVICE)


def mixer_of(p: Point, layer_idx: int = 0):
    return make_mixer(p.config, n_heads=p.heads, head_dim=HEAD_DIM, max_len=p.max_len, layer_idx=layer_idx,
                      **p.overrides).to(DEVICE, F64).train(p.train)


# ----------------------------------------------------------------------------- settings as documented
def check_documented(mixer, p: Point) -> None:
    """The settings a module derives from its config (clamps, null defaults), as its docstring
    writes them: the references read these attributes, so a wrong derivation would agree with them.
    The derivations are the class's ``spec.documented`` (keys: the attribute equals the setting)."""
    doc = spec_of(p.config).documented
    rows = doc(mixer, p.overrides, p.heads, p.max_len) if callable(doc) else \
        [(key, getattr(mixer, key), p.overrides[key]) for key in doc]
    for label, actual, expected in rows:
        assert actual == expected, f"{label}: {actual!r}, documented {expected!r}"


# ----------------------------------------------------------------------------- baselines
def grads(y: torch.Tensor, wrt: list[torch.Tensor]) -> list[torch.Tensor | None]:
    """d y / d wrt (None where none flows, and everywhere when nothing depends on the inputs)."""
    return list(torch.autograd.grad(y, wrt, allow_unused=True)) if y.requires_grad else [None] * len(wrt)


def check_baseline(p: Point) -> None:
    name, mixer = p.config, mixer_of(p)
    check_documented(mixer, p)
    t, mask = inputs64(p)
    q, k, v, x = t["q"], (t["q"] if mixer.shared_qk else t["k"]), t["v"], t["x"]
    calls = p.extra.get("calls", 1) if p.train else 1
    made = {}   # Performer: training calls before a draw -> the draw (graph-safe mode draws every call)
    performer = family_of(name) == "performer"
    if performer:
        draw = mixer._draw
        mixer._draw = lambda device: made.setdefault(int(mixer.calls), draw(device))
    with torch.no_grad():
        for _ in range(calls - 1):
            mixer(q, k, v, mask, x)
    out, draws = forward_with_draws(name, mixer, q, k, v, mask, x)
    expected = reference(name, mixer, q, k, v, mask, x, draws, p.overrides)
    assert_close(out, expected, "values")
    assert torch.isfinite(out).all()
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1234), dtype=F64).to(DEVICE)
    named = {"q": q, "v": v, "x": x, **({} if mixer.shared_qk else {"k": k}),
             **{f"param:{n}": w for n, w in mixer.named_parameters()}}
    got, want = (grads((y * g).sum(), list(named.values())) for y in (out, expected))
    for label, a, b, w in zip(named, got, want, named.values()):
        assert_close(torch.zeros_like(w) if a is None else a, torch.zeros_like(w) if b is None else b, f"grad {label}")
    if performer:
        expected_calls = calls if p.train else 0
        assert mixer.get_extra_state()["training_calls"] == expected_calls
        if p.train:
            every = mixer.redraw_interval
            due = (calls - 1) // every * every if every else 0
            assert torch.equal(mixer.features, made[due].to(F64)), "features off the redraw schedule"


# ----------------------------------------------------------------------------- paper variants
def check_routing(p: Point) -> None:
    mixer = mixer_of(p)
    check_documented(mixer, p)
    t, mask = inputs64(p)
    t = {k: t[k] for k in "qkv"}
    before = mixer.centroids.clone()
    got = grads_of(lambda: (mixer(t["q"], t["k"], t["v"], mask, None), mixer.aux_loss if p.train else None), t, mixer)
    after = mixer.centroids.clone()
    state = {}

    def ref():
        out, aux, state["centroids"], _ = routing_reference(mixer, t["q"], t["k"], t["v"], mask, before)
        return out, aux if p.train and mixer.local_heads < p.heads else None

    assert_same(got, grads_of(ref, t, mixer))
    if p.train:
        torch.testing.assert_close(after, state["centroids"], rtol=RTOL, atol=ATOL, msg=lambda m: f"centroids: {m}")
    else:
        assert torch.equal(after, before), "centroids moved in eval"


def check_abc(p: Point) -> None:
    torch.manual_seed(0)
    partial = build_mixer(p.config, **p.overrides)
    layers = [partial(n_heads=p.heads, head_dim=HEAD_DIM, max_len=p.max_len, layer_idx=i).to(DEVICE, F64).train(p.train)
              for i in range(p.extra["layers"])]
    check_documented(layers[0], p)
    if layers[0].control == "mlp":
        tied = partial.keywords.get("tie") is not None
        assert all((m.w_phi is layers[0].w_phi) == tied for m in layers[1:]), "W_phi tying across layers"
        with torch.no_grad():   # a learned, clearly non-uniform W_phi per group
            for m in layers:
                m.w_phi.weight.copy_(0.5 * torch.randn(m.w_phi.weight.shape, dtype=F64))
    for i, mixer in enumerate(layers):
        t, mask = inputs64(p, seed=1 + i)
        slots = record_calls(mixer, "random_slots")
        got = grads_of(lambda: (mixer(t["q"], t["k"], t["v"], mask, t["x"]), None), t, mixer)
        drawn = slots[-1] if slots else None
        assert_same(got, grads_of(lambda: (abc_reference(mixer, t["q"], t["k"], t["v"], mask, t["x"], drawn), None),
                                  t, mixer))


def check_adamra(p: Point) -> None:
    b, s = len(p.lengths), p.heads
    if p.extra["path"] == "mixer":
        mixer = mixer_of(p)
        owner = mixer
    else:   # the path training uses: the shell calls forward_input with its projection layers
        torch.manual_seed(0)
        owner = MultiHeadAttention(s * HEAD_DIM, s, build_mixer(p.config, **p.overrides), max_len=p.max_len)
        owner = owner.to(DEVICE, F64).train(p.train)
        mixer = owner.mixer
    check_documented(mixer, p)
    if mixer.head_weight is not None:   # eq. 9's maps away from their identity init
        with torch.no_grad():
            mixer.head_weight.add_(0.3 * torch.randn(mixer.head_weight.shape, dtype=F64).to(DEVICE))
    t, mask = inputs64(p)
    heads = record_calls(mixer, "random_heads")
    if p.extra["path"] == "mixer":
        t = {k: t[k] for k in "qkv"}
        got = grads_of(lambda: (mixer(t["q"], t["k"], t["v"], mask, None), None), t, owner)
        qkv = lambda: (t["q"], t["k"], t["v"])  # noqa: E731
    else:
        t = {"x": t["x"]}
        got = grads_of(lambda: (mixer.forward_input(t["x"], Padding.of(mask), owner.q_proj, owner.k_proj, owner.v_proj), None),
                       t, owner)
        split = lambda u: u.view(b, p.n, s, HEAD_DIM).transpose(1, 2)  # noqa: E731
        qkv = lambda: tuple(split(proj(t["x"])) for proj in (owner.q_proj, owner.k_proj, owner.v_proj))  # noqa: E731
    drawn = heads[-1] if heads else None
    assert_same(got, grads_of(lambda: (adamra_reference(mixer, *qkv(), mask, drawn), None), t, owner))


def check_clustered(p: Point) -> None:
    mixer = mixer_of(p)
    check_documented(mixer, p)
    t, mask = inputs64(p)
    t = {k: t[k] for k in "qkv"}
    planes = record_calls(mixer, "hash_planes")
    got = grads_of(lambda: (mixer(t["q"], t["k"], t["v"], mask, None), None), t, mixer)
    drawn = planes[-1] if planes else None
    assert_same(got, grads_of(lambda: (clustered_reference(mixer, t["q"], t["k"], t["v"], mask, drawn)[0], None),
                              t, mixer))


def check_memformer(p: Point) -> None:
    """The segment-recurrent encoder (every layer, the memory read and write) against the float64
    reference per sequence: outputs, the summary token's output (CLS pooling), the memories after
    every segment and the gradients of the input and of every parameter."""
    d, summary = p.heads * HEAD_DIM, p.extra["pool"] == "cls"
    torch.manual_seed(0)
    enc = Encoder(d, p.extra["layers"], p.heads, 2 * d, 0.0, build_mixer("memformer", **p.overrides), max_len=p.n + 1)
    enc = MemformerEncoder(enc, summary_first=summary).to(DEVICE, F64).train(p.train)
    check_documented(enc.mixers[0], p)
    lengths, n = list(p.lengths), p.n + summary
    g = torch.Generator().manual_seed(3)
    x = torch.randn(len(lengths), n, d, generator=g, dtype=F64).to(DEVICE).requires_grad_(True)
    weight = torch.randn(len(lengths), n, d, generator=g, dtype=F64).to(DEVICE)
    mask = lengths_mask([length + summary for length in lengths], n=n).to(DEVICE)
    if summary:
        mask[:, 0] = True
    h, states = enc.unroll(x, mask)
    (h * weight * mask[..., None]).sum().backward()   # loss.backward(): MRBP's reentrant checkpointing
    params = dict(enc.named_parameters())
    got = {"x": x.grad.clone(), **{k: w.grad.clone() if w.grad is not None else torch.zeros_like(w)
                                   for k, w in params.items()}}
    x.grad = None
    enc.zero_grad(set_to_none=True)
    loss = 0.0
    for row, length in enumerate(lengths):
        out, pooled, ref_states = ref_memformer.encode(enc, x[row, summary:summary + length],
                                                       x[row, 0] if summary else None)
        torch.testing.assert_close(h[row, summary:summary + length], out, msg=f"outputs of row {row}")
        if summary:
            torch.testing.assert_close(h[row, 0], pooled, msg=f"summary output of row {row}")
            out = torch.cat([pooled[None], out])
        loss = loss + (out * weight[row, :summary + length]).sum()
        for step, state in enumerate(states):
            for layer, (mem, want) in enumerate(zip(state, ref_states[min(step, len(ref_states) - 1)])):
                torch.testing.assert_close(mem[row], want, msg=f"memory {layer} of row {row} after {step} segments")
    loss.backward()
    want = {"x": x.grad, **{k: w.grad if w.grad is not None else torch.zeros_like(w) for k, w in params.items()}}
    for name, grad in got.items():
        torch.testing.assert_close(grad, want[name], msg=f"gradient of {name}")


CHECKS = {"routing": check_routing, "abc": check_abc, "adamra": check_adamra, "clustered": check_clustered,
          "memformer": check_memformer}


def family_grid_test(family: str):
    """One test function per family over the grids of all its configs."""
    points = [pt for config in FAMILIES[family].configs for pt in grid(config)]
    check = CHECKS.get(family, check_baseline)

    @pytest.mark.slow  # 1402 points, a few minutes: the fast loop runs the defaults' reference tests
    @pytest.mark.parametrize("point", points, ids=[f"{pt.config}-{i}" for i, pt in enumerate(points)])
    def test(point: Point) -> None:
        start = time.perf_counter()
        try:
            check(point)
        except AssertionError as e:
            raise AssertionError(f"grid point {point.describe()}:\n{e}") from None
        finally:
            TIMES[point.config].append(time.perf_counter() - start)
    test.__doc__ = f"The {family} configs at every point of their settings grids."
    return test


for _family in FAMILIES:
    globals()[f"test_{_family}_grid"] = family_grid_test(_family)
