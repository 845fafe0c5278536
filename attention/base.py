"""The contract every attention variant implements.

A variant subclasses :class:`Mixer`. The shell (:mod:`attention.shell`) owns the q/k/v/output
projections and head splitting; a mixer only mixes tokens per head::

    mixer(q, k, v, pad, x) -> out             # q, k, v, out: [B, H, N, Dh]; pad: Padding

``pad`` (:class:`attention.padding.Padding`) carries the bool mask ``[B, N]`` (True for real
tokens), its lengths, and whether the batch has padding at all, decided once per batch on the
host. Rules every mixer keeps (tests check them for all variants):

* padded keys never receive weight; outputs at real positions do not depend on padded tokens;
* a fully padded row gives finite output (zeros), never NaN;
* randomness comes from :meth:`Mixer.rand` / :meth:`Mixer.randn` / :meth:`Mixer.randint` (or
  :meth:`Mixer.init_generator` for draws at construction), seeded from the run
  seed at construction, and evaluation is deterministic;
* a mixer that contributes a loss term stores it in ``self.aux_loss`` during training forward
  passes (the LightningModule adds every mixer's ``aux_loss`` to the task loss);
* hyperparameters come from ``conf/attention/<name>.yaml``; the shell passes the shape arguments
  ``n_heads, head_dim, max_len, layer_idx``.
"""
from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor, nn

from attention import counter_random
from attention.padding import Padding, as_padding


def require_positive(*, hint: str = "", **settings: float) -> None:
    """Raise naming every attention setting that is not > 0 (by its config key, so the message
    points at the fix)."""
    _require(settings, lambda v: v > 0, "must be positive", hint)


def require_non_negative(*, hint: str = "", **settings: float) -> None:
    """Raise naming every attention setting that is negative."""
    _require(settings, lambda v: v >= 0, "must be >= 0", hint)


def _require(settings: dict[str, float], ok: Callable[[float], bool], what: str, hint: str) -> None:
    bad = [f"attention.{name}={value}" for name, value in settings.items() if not ok(value)]
    if bad:
        raise ValueError(f"{' and '.join(bad)} {what}{f' ({hint})' if hint else ''}; "
                         "set it in conf/attention/<name>.yaml or on the command line")


def autocast_state(t: Tensor) -> tuple[str, bool, torch.dtype]:
    """The autocast state of ``t``'s device, for a custom autograd Function to keep in ``ctx``: its
    backward runs outside the forward's autocast region and re-enters it with :func:`autocast_as`."""
    dev = t.device.type
    return dev, torch.is_autocast_enabled(dev), torch.get_autocast_dtype(dev)


def autocast_as(state: tuple[str, bool, torch.dtype]) -> torch.autocast:
    """``torch.autocast`` as recorded by :func:`autocast_state`."""
    dev, enabled, dtype = state
    return torch.autocast(dev, dtype=dtype, enabled=enabled)


def emulate_accelerator(module: nn.Module, on: bool = True) -> nn.Module:
    """Every mixer of ``module`` takes its accelerator choices on CPU from now on (``on=False``:
    its own device's again), so tests and the dispatch count run the code a GPU runs, on the same
    values; returns ``module``."""
    for m in module.modules():
        if isinstance(m, Mixer):
            m._emulated_accelerator = on
            m.on_cpu = m.draws.device.type == "cpu" and not on
    return module


class Mixer(nn.Module):
    """Base class of the per-head token mixing of an attention variant.

    Subclasses set ``shared_qk = True`` when their method ties queries and keys (Reformer): the
    shell then builds no key projection and passes ``k = q``. ``uses_qk = False`` marks a method
    that builds its mixing from ``x`` alone (Synthesizer): the shell builds no q/k projections and
    passes zero-size q/k placeholders, so no parameter or FLOP is spent on them.
    ``fuses_projections = True`` marks a method that only uses linear images of the projections
    (compressed keys, routed queries): the shell then calls :meth:`forward_input` with ``x`` and its
    projection layers instead of projecting every token, and the mixer applies the maps where they
    are cheapest. ``forward`` stays the reference (the contract tests use it); a test checks the two
    agree in values and gradients.
    """

    shared_qk: bool = False
    uses_qk: bool = True
    fuses_projections: bool = False
    # A causal mask (query i sees keys j <= i): only exact softmax has one; self-pretraining's
    # next-token objective sets ``causal`` (models/pretraining.py), never a classifier.
    supports_causal: bool = False
    causal: bool = False

    def __init__(self, n_heads: int, head_dim: int, max_len: int, layer_idx: int = 0) -> None:
        super().__init__()
        if n_heads <= 0 or head_dim <= 0:
            raise ValueError(f"n_heads ({n_heads}) and head_dim ({head_dim}) must be positive")
        if max_len <= 0:
            raise ValueError(f"max_len ({max_len}) must be positive: set task.max_len to the sequence length")
        self.n_heads = n_heads
        self.head_dim = head_dim
        self.max_len = max_len
        self.layer_idx = layer_idx
        self.aux_loss: Tensor | None = None
        # Seed drawn from the global RNG at construction: the run seeds it (seed_everything), so the
        # stream is reproducible per run and per layer without threading the seed through configs.
        # Kept as a Python int (no device sync in forward) and checkpointed through extra state.
        self.seed = int(torch.randint(0, 2**62, (1,)).item())
        # every draw is counter-based (attention.counter_random): one count per training draw
        self.register_buffer("draws", torch.zeros((), dtype=torch.int64), persistent=False)
        # Device-specific choices (a CPU split size, a fused CPU kernel) read this flag, set when the
        # module is made and each time it moves (``_apply``), never asked of a tensor per call, as
        # nanoGPT sets ``self.flash``. :func:`emulate_accelerator` sets it False on CPU for tests.
        self.on_cpu = True

    def _apply(self, fn, recurse=True):  # noqa: ANN001, ANN202 (nn.Module's signature)
        module = super()._apply(fn, recurse)
        self.on_cpu = self.draws.device.type == "cpu" and not getattr(self, "_emulated_accelerator", False)
        return module

    def rand(self, shape: tuple[int, ...] | torch.Size, device: torch.device | str,
             dtype: torch.dtype = torch.float32) -> Tensor:
        """Uniform draws in (0, 1) from this mixer's counter-based stream (:meth:`_counter`)."""
        return counter_random.uniform(tuple(shape), *self._counter(device), dtype=dtype)

    def randn(self, shape: tuple[int, ...] | torch.Size, device: torch.device | str,
              dtype: torch.dtype = torch.float32) -> Tensor:
        """Standard normal draws from this mixer's stream (Box-Muller, :mod:`attention.counter_random`)."""
        return counter_random.normal(tuple(shape), *self._counter(device), dtype=dtype)

    def randint(self, high: int, shape: tuple[int, ...] | torch.Size, device: torch.device | str) -> Tensor:
        """Integers uniform in ``[0, high)`` (int64): ``floor(high u)`` of the uniforms of :meth:`rand`
        (uniform up to float32 rounding of ``high u``, at most ``high * 2**-24`` in probability)."""
        u = counter_random.uniform(tuple(shape), *self._counter(device))
        return (u * high).long().clamp_max(high - 1)

    def _counter(self, device: torch.device | str) -> tuple[int, Tensor]:
        """Key and counter of the next draw: a pure function of the seed and a step count kept in a
        device buffer, so eager and compiled code draw the same values, with no generator object
        (a graph break) and no host read. Training advances the count (a fresh draw every call,
        resumed from the checkpointed count); evaluation always draws count 0 of another key, so it
        is deterministic."""
        if not self.training:
            return counter_random.key32(self.seed ^ 0x5EED), torch.zeros((), dtype=torch.int64, device=device)
        count = self.draws.to(device)
        # a new tensor, not add_: a compiled backward may recompute a draw from the count it saved
        self.draws = self.draws + 1
        return counter_random.key32(self.seed), count

    def init_generator(self) -> torch.Generator:
        """A CPU generator seeded from this mixer's seed, for draws at construction only (initial
        centroids, fixed random matrices): reproducible per run and layer. A forward never uses
        one (a ``torch.Generator`` breaks ``torch.compile``'s graph)."""
        return torch.Generator().manual_seed(self.seed)

    def get_extra_state(self) -> dict:
        """Checkpoint the seed and the draw count, so a resumed run draws what it would have."""
        return {"seed": self.seed, "draws": int(self.draws)}

    def set_extra_state(self, state: dict) -> None:
        """Also reads checkpoints from before the counter-only stream (their ``streams`` are unused)."""
        self.seed = int(state["seed"])
        self.draws.fill_(int(state.get("draws", 0)))

    def setting_problems(self) -> list[str]:
        """Settings that leave this variant without its mechanism: a run with them would measure
        nothing, so the benchmark refuses them before any work (``lra.checks.build``). The
        constructor still accepts them: the contract tests need the edge cases. Named by config key."""
        return []

    def setting_warnings(self, max_len: int) -> list[str]:
        """Legal settings that make this variant another one on sequences of ``task.max_len`` =
        ``max_len`` (one bucket or block holding every token: full attention); the run goes on, warned."""
        return []

    def __call__(self, q: Tensor, k: Tensor, v: Tensor, pad: Padding | Tensor, x: Tensor) -> Tensor:
        """``forward`` with ``pad`` as a :class:`~attention.padding.Padding` (a bool mask tensor is
        wrapped, with one host read: a mixer called on its own, in a test or a tool)."""
        return super().__call__(q, k, v, as_padding(pad), x)

    def forward_input(
        self, x: Tensor, pad: Padding, q_proj: nn.Linear | None, k_proj: nn.Linear | None, v_proj: nn.Linear,
    ) -> Tensor:  # pragma: no cover
        """``forward`` on ``q_proj(x), k_proj(x), v_proj(x)`` (split in heads), computed in another order."""
        raise NotImplementedError

    def forward(self, q: Tensor, k: Tensor, v: Tensor, pad: Padding, x: Tensor) -> Tensor:  # pragma: no cover
        raise NotImplementedError
