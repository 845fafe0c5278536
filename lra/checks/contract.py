"""The attention contract (:mod:`attention.base`) as properties of one variant, at small sizes.

Each property takes a variant (a registered name, or a :data:`Factory` for a mixer the registry does
not know) and returns ``None`` when it holds, or one sentence in words when it does not: the tensor,
the magnitude, and what usually causes it. ``python run.py mode=check attention=<name>``
(:mod:`lra.checks.variant`) runs them on one variant and prints the table; the contract tests
(``tests/attention/test_attention_contract.py``, ``test_pooling_reach.py``, ``test_fuzz_attention.py``)
run them on every config and assert that each answers ``None``. One copy of each property, so the
check a variant's author runs is the one the suite holds every variant to.

Sizes: ``B, H, N, DH`` = 3 rows, 2 heads, 37 tokens (a length that divides no block, segment or
bucket size), head size 8. At a variant's defaults (blocks of 64, 100 clusters) 37 tokens take its
exact or single-block path, where structural bugs cannot show; :data:`SMALL_STRUCTURE` gives the
settings under which they span several blocks, clusters and segments.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from attention.base import Mixer
from attention.registry import variant_names
from attention.spec import complete_configs, small, spec_of, spec_problem

B, H, N, DH = 3, 2, 37, 8   # N deliberately divides no block/segment size
MAX_LEN = 64
LONG = 2 * N                # the padded length of the padded-length property
SEED = 123
LENGTHS = [N, 23, 9]        # a full row and two padded ones
ATOL, RTOL = 1e-5, 1e-4     # float32: a reordered sum differs by ~1e-6; a leak or a dropped mask by O(1)



class PerConfig(Mapping):
    """``config -> settings`` read from each config's spec (attention/spec.py), holding the configs
    whose entry is not empty; written once, next to the class, never as a table here."""

    def __init__(self, read: Callable[[str], dict]) -> None:
        self._read = read

    def _entries(self) -> dict[str, dict]:
        return {name: entry for name in complete_configs() if (entry := self._read(name))}

    def __getitem__(self, name: str) -> dict:
        entry = self._read(name) if isinstance(name, str) and name in variant_names() and not spec_problem(name) else None
        if not entry:
            raise KeyError(name)
        return entry

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries())

    def __len__(self) -> int:
        return len(self._entries())


# Per-variant settings under which 37-74 tokens span several blocks, segments, clusters, landmarks
# or buckets (at the defaults a short sequence takes the exact path, where a global block that
# follows the padding, or a plan cut by the padded length, cannot show): each spec's ``small``.
SMALL_STRUCTURE: Mapping[str, dict] = PerConfig(small)
# Training noise drawn with the shape of the padded input (Sinkhorn's Gumbel noise over block pairs)
# is aligned differently at another padded length: another sample of the same distribution, by
# design. Those variants are compared with that noise off (each spec's ``train_noise_off``); the
# rest of their training path is checked.
TRAIN_NOISE_OFF: Mapping[str, dict] = PerConfig(lambda name: dict(spec_of(name).train_noise_off))

# settings -> a partial mixer constructor (what Hydra builds from conf/attention/<name>.yaml)
Factory = Callable[..., Callable[..., Mixer]]


def factory(variant: str | Factory, small: bool = False) -> Factory:
    """The constructor maker of ``variant``: a registered name (at :data:`SMALL_STRUCTURE` if
    ``small``) or a factory of its own, returned as is."""
    if callable(variant):
        return variant
    from attention.registry import build_mixer

    base = SMALL_STRUCTURE.get(variant, {}) if small else {}
    return lambda **settings: build_mixer(variant, **{**base, **settings})


def variant_key(variant: str | Factory) -> str:
    return variant if isinstance(variant, str) else getattr(variant, "name", "variant")


# ----------------------------------------------------------------------------- inputs
def lengths_mask(lengths: list[int], n: int = N) -> Tensor:
    return torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]


def qkvx(b: int = B, h: int = H, n: int = N, dh: int = DH, seed: int = 1, requires_grad: bool = False):
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(b, h, n, dh, generator=g) for _ in range(3))
    x = torch.randn(b, n, h * dh, generator=g)
    if requires_grad:
        for t in (q, k, v, x):
            t.requires_grad_(True)
    return q, k, v, x


def make_mixer(variant: str | Factory, n_heads: int = H, head_dim: int = DH, max_len: int = MAX_LEN,
               layer_idx: int = 0, seed: int = 0, **settings) -> Mixer:
    """``variant`` built with ``settings`` (a name: at its config's values, not at SMALL_STRUCTURE),
    from the global RNG seeded with ``seed`` (the mixer's own stream is seeded from it)."""
    torch.manual_seed(seed)
    return factory(variant)(**settings)(n_heads=n_heads, head_dim=head_dim, max_len=max_len, layer_idx=layer_idx)


def on_device(device: torch.device, *tensors: Tensor) -> list[Tensor]:
    """The tensors on ``device``, as leaves that keep their ``requires_grad``."""
    return [t.detach().to(device).requires_grad_(t.requires_grad) for t in tensors]


# ----------------------------------------------------------------------------- comparisons
def difference(got: Tensor, ref: Tensor, atol: float = ATOL, rtol: float = RTOL) -> float | None:
    """The largest ``|got - ref|`` when it exceeds ``atol + rtol |ref|`` somewhere (inf if either is
    not finite where the other is), else None."""
    got, ref = got.detach().double(), ref.detach().double()
    if got.shape != ref.shape:
        return math.inf
    if not torch.equal(torch.isfinite(got), torch.isfinite(ref)):
        return math.inf
    fin = torch.isfinite(ref)
    diff = (got[fin] - ref[fin]).abs()
    if diff.numel() == 0 or bool((diff <= atol + rtol * ref[fin].abs()).all()):
        return None
    return float(diff.max())


def at_real(out: Tensor, mask: Tensor) -> Tensor:
    """The entries of ``out [B, H, N, D]`` at the real positions of ``mask [B, N]``."""
    return out[mask.to(out.device)[:, None, :, None].expand_as(out)]


def fresh_call(variant: str | Factory, mode: str, q: Tensor, k: Tensor, v: Tensor, mask: Tensor, x: Tensor,
               device: torch.device = torch.device("cpu"), /, **settings) -> tuple[Tensor, Tensor | None, dict]:
    """One forward of a mixer built from :data:`SEED` (so every call draws the same) in ``mode``;
    the output, the mixer's aux loss and its buffers after the call (state updates)."""
    mixer = make_mixer(variant, seed=SEED, **settings).to(device).train(mode == "train")
    torch.manual_seed(7)  # the same ambient state, as under seed_everything
    with torch.no_grad():
        out = mixer(*on_device(device, q, k, v), mask.to(device), x.to(device))
    aux = mixer.aux_loss.detach() if mixer.aux_loss is not None else None
    return out, aux, {n: b.detach().clone() for n, b in mixer.named_buffers()}


# ----------------------------------------------------------------------------- properties
def padding_invariance(variant: str | Factory, mode: str, device: torch.device = torch.device("cpu"),
                       **settings) -> str | None:
    """Changing what sits at padded positions changes nothing at real positions, and in training
    neither the aux loss nor any state update (buffers such as routing centroids) sees it."""
    mask = lengths_mask(LENGTHS)
    q, k, v, x = qkvx(seed=1)
    q2, k2, v2, x2 = qkvx(seed=2)
    pad = ~mask
    mixed = [torch.where(pad[:, None, :, None], b_, a_) for a_, b_ in ((q, q2), (k, k2), (v, v2))]
    x_mixed = torch.where(pad[:, :, None], x2, x)
    out, aux, state = fresh_call(variant, mode, q, k, v, mask, x, device, **settings)
    out2, aux2, state2 = fresh_call(variant, mode, *mixed, mask, x_mixed, device, **settings)
    diff = difference(at_real(out2, mask), at_real(out, mask))
    if diff is not None:
        return (f"padding leaks ({mode}): the output at real positions changes by up to {diff:.3g} when only the "
                f"padded q, k, v and x change; usually the key mask is not applied to the scores, or a sum or mean "
                f"over keys (a normaliser, a segment or cluster summary) includes padded tokens")
    if (aux is None) != (aux2 is None):
        return f"padding changes whether the aux loss is set ({mode})"
    if aux is not None and (diff := difference(aux2, aux, 1e-6, 1e-5)) is not None:
        return (f"padding leaks into the aux loss ({mode}): it changes by {diff:.3g} when only padded tokens "
                f"change; usually a loss term averaged over every position instead of the real ones")
    for key in state:
        if (diff := difference(state2[key], state[key], 1e-6, 1e-5)) is not None:
            return (f"padding leaks into buffer {key} ({mode}): it changes by {diff:.3g} when only padded tokens "
                    f"change; usually a state update (centroids, memory) that averages over padded tokens")
    return None


def padded_length_invariance(variant: str | Factory, mode: str, device: torch.device = torch.device("cpu"),
                             **settings) -> str | None:
    """The same sequences padded to N and to 2N give the same outputs at their real positions."""
    settings = {**(TRAIN_NOISE_OFF.get(variant, {}) if mode == "train" and isinstance(variant, str) else {}),
                **settings}
    mask = lengths_mask(LENGTHS)
    q, k, v, x = qkvx(seed=1)
    tail = qkvx(n=LONG - N, seed=3)  # what fills the extra padding (arbitrary, non-zero)
    long = [torch.cat([a, t], dim=2) for a, t in zip((q, k, v), tail)] + [torch.cat([x, tail[3]], dim=1)]
    long_mask = torch.cat([mask, torch.zeros(B, LONG - N, dtype=torch.bool)], dim=1)
    out, *_ = fresh_call(variant, mode, q, k, v, mask, x, device, max_len=LONG, **settings)
    out_long, *_ = fresh_call(variant, mode, *long[:3], long_mask, long[3], device, max_len=LONG, **settings)
    diff = difference(at_real(out_long[:, :, :N], mask), at_real(out, mask))
    if diff is None:
        return None
    return (f"padded length matters ({mode}): the output at real positions changes by up to {diff:.3g} when the "
            f"same sequences are padded to {LONG} tokens instead of {N}; usually a block, segment or landmark plan "
            f"cut by the padded length instead of the real lengths, or a mean divided by N")


def batch_independence(variant: str | Factory, device: torch.device = torch.device("cpu"), **settings) -> str | None:
    """A row's eval output is the same alone (batch of one) and inside a batch of other rows."""
    mask = lengths_mask(LENGTHS)
    q, k, v, x = qkvx(seed=1)
    out, *_ = fresh_call(variant, "eval", q, k, v, mask, x, device, **settings)
    for i in range(B):
        row = slice(i, i + 1)
        alone, *_ = fresh_call(variant, "eval", q[row], k[row], v[row], mask[row], x[row], device, **settings)
        diff = difference(at_real(alone, mask[row]), at_real(out[row], mask[row]))
        if diff is not None:
            return (f"rows depend on each other: row {i}'s output changes by up to {diff:.3g} when it runs alone "
                    f"instead of in a batch of {B}; usually a statistic (a mean, a max, k-means, a norm) taken over "
                    f"the whole batch instead of per row")
    return None


def fully_padded_row(variant: str | Factory, device: torch.device = torch.device("cpu"), **settings) -> str | None:
    """A row with no real token gives zeros, never NaN, in training and in eval, and finite gradients."""
    mixer = make_mixer(variant, **settings).to(device)
    q, k, v, x = on_device(device, *qkvx(requires_grad=True))
    mask = lengths_mask([N, 0, 5]).to(device)
    for mode in ("train", "eval"):
        mixer.train(mode == "train")
        out = mixer(q, k, v, mask, x)
        if not torch.isfinite(out).all():
            bad = int((~torch.isfinite(out)).sum())
            return (f"a fully padded row gives {bad} non-finite outputs ({mode}); usually a softmax or a normaliser "
                    f"over zero keys (0/0, or -inf fills): use a finite fill (attention.masking.key_bias) or clamp "
                    f"the normaliser, then zero padded rows (attention.masking.zero_padded)")
        row = out[1].detach().abs().max().item()
        if row > 0:
            return (f"a fully padded row gives non-zero outputs (largest {row:.3g}, {mode}); usually the padded "
                    f"query positions are not zeroed (attention.masking.zero_padded)")
        out.sum().backward()
        for name, t in zip("qkvx", (q, k, v, x)):
            if t.grad is not None and not torch.isfinite(t.grad).all():
                return (f"a fully padded row gives a non-finite gradient of {name} ({mode}); usually a division "
                        f"by a normaliser that is zero for that row")
    return None


def gradients(variant: str | Factory, device: torch.device = torch.device("cpu"), **settings) -> str | None:
    """In training, gradients are finite and reach q, k (the ones the method reads: none for a
    mixer with ``uses_qk = False``, no separate k for ``shared_qk``) and v, every trainable
    parameter, and x where the method reads it."""
    mixer = make_mixer(variant, **settings).to(device).train()
    q, k, v, x = on_device(device, *qkvx(requires_grad=True))
    mask = lengths_mask([N, 30, 12]).to(device)
    out = mixer(q, k, v, mask, x)
    loss = out.pow(2).sum() + (mixer.aux_loss if mixer.aux_loss is not None else 0.0)
    loss.backward()
    needed = ["v"] + (["q"] if mixer.uses_qk else []) + (["k"] if mixer.uses_qk and not mixer.shared_qk else [])
    for name, t in zip("qkvx", (q, k, v, x)):
        if t.grad is not None and not torch.isfinite(t.grad).all():
            return (f"the gradient of {name} is not finite ({int((~torch.isfinite(t.grad)).sum())} entries); usually "
                    f"a division by a normaliser near zero, a sqrt or log at 0, or an overflowing exp")
        if name in needed and (t.grad is None or t.grad.abs().sum() == 0):
            return (f"no gradient reaches {name}; usually {name} is detached, used only under no_grad or through a "
                    f"discrete choice (argmax, sort) alone, or the variant should declare "
                    f"{'uses_qk = False' if name == 'q' else 'shared_qk = True' if name == 'k' else 'nothing: v must be mixed'}")
    for pname, p in mixer.named_parameters():
        if p.requires_grad and (p.grad is None or not torch.isfinite(p.grad).all()):
            return (f"parameter {pname} gets {'no' if p.grad is None else 'a non-finite'} gradient; usually it is "
                    f"used only under no_grad or only in eval, or it should be a buffer")
    return None


def determinism(variant: str | Factory, device: torch.device = torch.device("cpu"), **settings) -> str | None:
    """Eval is deterministic call to call; training draws repeat for a seed (two mixers built from
    the same seed under the same ambient RNG state give the same training output)."""
    q, k, v, x = on_device(device, *qkvx())
    mask = lengths_mask([N, 30, 12]).to(device)
    outs = []
    for _ in range(2):
        mixer = make_mixer(variant, seed=SEED, **settings).to(device).train()
        torch.manual_seed(7)  # the same ambient state, as under seed_everything
        with torch.no_grad():
            outs.append(mixer(q, k, v, mask, x))
            mixer.eval()
            outs.append(mixer(q, k, v, mask, x))
            outs.append(mixer(q, k, v, mask, x))
    if (diff := difference(outs[2], outs[1], 0.0, 0.0)) is not None:
        return (f"eval is not deterministic: two eval calls differ by up to {diff:.3g}; usually a draw in eval that "
                f"does not come from Mixer.rand/randn (which repeat in eval), or state updated outside training")
    if (diff := difference(outs[4], outs[1], 0.0, 0.0)) is not None:
        return (f"eval depends on more than the seed: two mixers built from one seed differ by up to {diff:.3g} in "
                f"eval; usually a draw from the global RNG (torch.rand) instead of the mixer's stream")
    if (diff := difference(outs[3], outs[0], 0.0, 0.0)) is not None:
        return (f"training draws do not repeat for a seed: two mixers built from one seed differ by up to "
                f"{diff:.3g}; usually a draw from the global RNG or a generator of its own instead of Mixer.rand/randn")
    return None


# ----------------------------------------------------------------------------- the network
SEQ, BATCH, VOCAB, CLASSES = 64, 4, 16, 3
PADDED_LENGTHS = [SEQ, 50, 37, 20]


def tiny_network(variant: str | Factory, n_layers: int = 2, small: bool = True,
                 seq: int = SEQ, pool: str = "mean", **settings) -> nn.Module:
    """A 2-layer LRA classifier (d_model 16, 2 heads) of ``variant``, seeded; a name at
    :data:`SMALL_STRUCTURE` unless ``small=False``; ``pool`` as ``model.pool``."""
    from models.network import LRAClassifier

    torch.manual_seed(0)
    mixer = factory(variant, small=small)(**settings)
    return LRAClassifier(mixer, vocab_size=VOCAB, num_classes=CLASSES, max_len=seq, d_model=16, n_layers=n_layers,
                         n_heads=2, d_ffn=32, dropout=0.0, pool=pool)


def step_batch(padded: bool, seed: int = 1) -> tuple[Tensor, Tensor, Tensor]:
    """``ids, mask, label`` of a batch of 4 x 64 tokens (lengths ``PADDED_LENGTHS`` when padded)."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(1, VOCAB, (BATCH, SEQ), generator=g)
    lengths = PADDED_LENGTHS if padded else [SEQ] * BATCH
    mask = torch.arange(SEQ)[None, :] < torch.tensor(lengths)[:, None]
    return ids, mask, torch.randint(0, CLASSES, (BATCH,), generator=g)


def training_loss(net: nn.Module, ids: Tensor, mask: Tensor, label: Tensor, padded: bool | None = None,
                  model: nn.Module | None = None) -> Tensor:
    """``LRAModule.training_step``'s loss: cross-entropy plus the mixers' loss terms. ``model``: what
    to call instead of ``net`` (a DDP wrapper of it); ``padded`` as the module passes it (None: the
    network reads it)."""
    logits = (net if model is None else model)(ids, mask, padded=padded)
    loss = F.cross_entropy(logits, label)
    aux = net.pop_aux_loss()
    return loss if aux is None else loss + aux


# The token-reach network: conf/model/tiny.yaml with the backbone's 2 layers (conf/model/xiong.yaml),
# the variant at its own settings, 40 tokens. With ONE layer, a sparse method legitimately leaves some
# tokens out of the CLS token's receptive field (a 2-round Reformer CLS reads only the keys hashed with
# it); two layers let every method reach all of a 40-token sequence, as the LRA backbone's depth does.
REACH_SEQ, REACH_VOCAB = 40, 20
REACH_LENGTHS = [REACH_SEQ, 29, 35]     # one full row; the others end inside the 2nd segment/block of 32


def tiny_model_settings() -> dict:
    """Sizes of conf/model/tiny.yaml (over its xiong defaults), two layers (see above)."""
    from omegaconf import OmegaConf

    from attention.registry import CONF_DIR

    cfg = OmegaConf.merge(*(OmegaConf.load(CONF_DIR / "model" / f"{name}.yaml") for name in ("xiong", "tiny")))
    keys = ("d_model", "n_heads", "d_ffn", "d_head", "dropout")
    return {**{k: cfg[k] for k in keys}, "n_layers": 2}


def reach_network(variant: str | Factory, pool: str, device: torch.device = torch.device("cpu")) -> nn.Module:
    """The token-reach network of ``variant`` (a name at its config's values) with ``pool``, seeded."""
    from models.network import LRAClassifier

    torch.manual_seed(0)
    return LRAClassifier(factory(variant)(), vocab_size=REACH_VOCAB, num_classes=CLASSES, max_len=REACH_SEQ,
                         pool=pool, **tiny_model_settings()).to(device)


def reach_batch(g: torch.Generator, device: torch.device = torch.device("cpu")) -> tuple[Tensor, Tensor]:
    ids = torch.randint(1, REACH_VOCAB, (len(REACH_LENGTHS), REACH_SEQ), generator=g).to(device)
    return ids, (torch.arange(REACH_SEQ)[None] < torch.tensor(REACH_LENGTHS)[:, None]).to(device)


def embedding_gradient(net: nn.Module, ids: Tensor, mask: Tensor, g: torch.Generator) -> Tensor:
    """Norm of d(random projection of the logits)/d(token embedding), ``[B, N]``."""
    embedded = []

    def keep(module: nn.Module, inputs: Any, out: Tensor) -> None:
        out.retain_grad()
        embedded.append(out)

    handle = net.embed.register_forward_hook(keep)
    try:
        logits = net(ids, mask)
        (logits * torch.randn(logits.shape, generator=g).to(logits.device)).sum().backward()
    finally:
        handle.remove()
    return embedded[0].grad.norm(dim=-1)


def token_reach(net: nn.Module, ids: Tensor, mask: Tensor, g: torch.Generator, what: str = "") -> str | None:
    """Every real token reaches the logits (a non-zero gradient w.r.t. its embedding) and no padded
    token does (exactly zero)."""
    grad = embedding_gradient(net, ids, mask, g)
    where = f" ({what})" if what else ""
    unreached = (mask & (grad == 0)).nonzero().tolist()
    if unreached:
        return (f"real tokens never reach the logits{where}: {len(unreached)} of {int(mask.sum())}, [row, position] "
                f"{unreached[:6]}{' ...' if len(unreached) > 6 else ''}; usually positions dropped by a block or "
                f"segment cut, a window that misses them, or real tokens masked as padding")
    leaked = grad[~mask]
    if (leaked != 0).any():
        return (f"padded tokens reach the logits{where} (max gradient {leaked.abs().max():.3g}); usually the key "
                f"mask is not applied, or a summary (a mean, memory, landmarks) includes padded tokens")
    return None


def logits_batch_independence(net: nn.Module, ids: Tensor, mask: Tensor, what: str = "") -> str | None:
    """A sequence's eval logits do not depend on the rest of its batch (pooling and heads included)."""
    net = net.eval()
    with torch.no_grad():
        together = net(ids, mask)
        alone = torch.cat([net(ids[i:i + 1], mask[i:i + 1]) for i in range(len(ids))])
    diff = difference(alone, together)
    if diff is None:
        return None
    return (f"a row's logits depend on its batch{' (' + what + ')' if what else ''}: they change by up to "
            f"{diff:.3g} when it runs alone; usually a statistic taken over the batch (a mean, a norm, k-means)")


# ----------------------------------------------------------------------------- compiled
def compiled_step(variant: str | Factory, padded: bool, steps: int = 2, backend: str | Callable = "inductor",
                  n_layers: int = 1, part: str = "network", **settings) -> list[tuple[Tensor, dict, dict]]:
    """Per step: (eager loss - compiled loss, eager grads, compiled grads) of two identical
    networks, one run eagerly and one compiled as ``trainer.compile`` compiles it
    (``fullgraph=True``, static shapes: a graph break is an error), with the batch's padding stated
    as ``LRAModule`` states it. Both draw the same counter-based randoms. The second step checks
    that the state a step leaves (draw counters, centroids, redraws) compiles too.

    ``part="attention"`` compiles only the first block's attention (projections and mixer, the code
    that differs between configs) and runs the rest of the network eagerly: the same trace of the
    attention, with about half the generated kernels (linformer: 13 of 23)."""
    eager = tiny_network(variant, n_layers, **settings).train()
    compiled = tiny_network(variant, n_layers, **settings).train()
    compiled.load_state_dict(eager.state_dict())
    torch._dynamo.reset()
    target = compiled if part == "network" else compiled.encoder.blocks[0].attn
    target.compile(fullgraph=True, dynamic=False, backend=backend)
    ids, mask, label = step_batch(padded)
    out = []
    for _ in range(steps):
        results = []
        for net in (eager, compiled):
            net.zero_grad(set_to_none=True)
            loss = training_loss(net, ids, mask, label, padded=padded)
            loss.backward()
            results.append((loss.detach(), {n: p.grad for n, p in net.named_parameters() if p.grad is not None}))
        out.append((results[0][0] - results[1][0], results[0][1], results[1][1]))
    return out


def compiled_matches_eager(variant: str | Factory, padded: bool = True, backend: str | Callable = "aot_eager_decomp_partition",
                           part: str = "network", **settings) -> str | None:
    """Two training steps of ``torch.compile(fullgraph=True)`` give eager's loss and gradients."""
    try:
        steps = compiled_step(variant, padded, backend=backend, part=part, **settings)
    except Exception as e:  # noqa: BLE001 - any compile failure is the finding
        first = str(e).strip().splitlines()[0] if str(e).strip() else ""
        return (f"torch.compile(fullgraph=True) fails: {type(e).__name__}: {first[:200]}; usually a graph break "
                f"(.item(), a Python branch on a tensor, a data-dependent shape) or a torch.Generator in the "
                f"forward (draw with Mixer.rand/randn)")
    for step, (dloss, eager, compiled) in enumerate(steps, 1):
        if abs(float(dloss)) >= 1e-5:
            return (f"the compiled step's loss differs from eager by {float(dloss):.3g} (step {step}); usually code "
                    f"that branches on a tensor's value eagerly and traces one branch, or state updated in place")
        if eager.keys() != compiled.keys():
            return f"different parameters get gradients compiled and eager (step {step}): {sorted(eager.keys() ^ compiled.keys())}"
        for key in eager:
            if (diff := difference(compiled[key], eager[key], 1e-5, 1e-4)) is not None:
                return (f"the compiled gradient of {key} differs from eager by up to {diff:.3g} (step {step}); "
                        f"usually a draw or a state update that the trace replays differently")
    return None


@dataclass(frozen=True)
class NamedFactory:
    """A :data:`Factory` with a name (what a table prints): ``NamedFactory("mine", make)``;
    ``plain``: the same variant at its own settings, without :data:`SMALL_STRUCTURE` (the network
    properties' sizes; None = ``make``)."""

    name: str
    make: Factory
    plain: Factory | None = None

    def __call__(self, **settings) -> Callable[..., Mixer]:
        return self.make(**settings)

    def at_own_sizes(self) -> Factory:
        return self.plain or self.make
