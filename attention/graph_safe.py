"""The graph-safe switch, and the host reads of attention code it rules out.

On an accelerator every host read of a device value (``bool(t)``, ``.item()``, ``.tolist()``, a
data-dependent shape) waits for the device queue to drain: a *host sync*. A traced graph
(``torch.compile``) cannot have one at all. This module owns the switch between the two regimes
and the rules that keep host reads rare:

* **Graph-safe mode reads nothing.** Inside :func:`graph_safe` (``model.graph_safe=true``) and
  whenever ``torch.compile`` traces the code (:func:`graph_safe_active`), :func:`host_reads_free`
  is False, :func:`has_padding` answers from the host's statement or "padded", and
  :func:`per_batch` refuses: a variant then runs branches whose shapes depend only on ``max_len``
  and its config, and draws its randomness with counter-based tensors
  (:mod:`attention.counter_random`), so ``torch._dynamo`` sees one graph with no host read
  (``tests/attention/test_graph_safe.py`` counts the breaks and forbids every sync). Variants do
  not ask the switch for the common cases: random draws go through :meth:`Mixer.rand`,
  :meth:`Mixer.randn` and :meth:`Mixer.randint <attention.base.Mixer.randint>`, and a fused
  autograd Function with a plain-ops reference goes through :func:`fused_unless_graph_safe`. Only
  a plan whose eager shape is data-dependent (AdaMRA's routing groups, BigBird's per-length plans,
  Performer's redraw step) asks :func:`graph_safe_active` to take its static-shape branch.
* **Padding is decided once per batch.** Whether a batch has padding decides fast paths in many
  variants (skip the key bias, skip zeroing padded rows). The network states it once per batch with
  :func:`batch_padding` (the LightningModule reads it on the host before the batch reaches the
  device, where it costs nothing); every layer and segment then asks :func:`has_padding`, which
  answers from that statement for the same mask object, and otherwise reads the mask once for the
  whole block (``padded=None``) or, outside any block (a mixer called on its own), once per call.
  Answering "padded" for a mask that has none is always correct (the masked path gives the same
  values); only "not padded" must be exact. Other facts a layer reads from the batch mask on the
  host are shared by every layer the same way (:func:`per_batch`).
* **Host reads that buy speed only on CPU are taken only where they are free.** The device
  branches of the attention code all go through :func:`host_reads_free` (True on CPU). Tests take
  the accelerator's branches on CPU with :func:`accelerator_branches`, which makes it answer False,
  so the code an accelerator runs is the code the tests run, on the same values.

**Why the padding fact is stated beside the mask, not carried by it** (issue 35 weighed both).
fast-transformers passes mask objects (``LengthMask``) that carry their lengths. Here the mixer
contract takes a plain bool ``[B, N]`` tensor (every variant under ``conf/attention/``, the shell,
the contract and reference tests, the bench's peers), and the fact stays a statement per batch,
looked up by mask identity, because:

* a mask type would change every variant, test and peer for a fact that a few call sites read;
  a ``Tensor`` subclass instead would have to be made traceable for ``torch.compile``, and every
  op that derives a mask (padding to a block multiple, a group's rows, a segment, the CLS column)
  drops its attribute, just as a derived mask misses a statement made for another object;
* where a derived mask keeps the fact, the code that derives it says so in one line either way
  (Memformer restates it per segment with :func:`batch_padding`; a mask object would be re-wrapped);
  where nobody says, the answer is still correct: one read in eager mode, "padded" in graph-safe
  mode (``tests/attention/test_graph_safe_unstated_masks.py``);
* other facts read once per batch (:func:`per_batch`: BigBird's plan lengths) need a per-batch
  scope that every layer reaches, which the block is.

``tests/host_syncs.py`` counts the host syncs of a training step per variant on the accelerator's
branches; ``tests/attention/test_host_syncs.py`` pins the counts.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, Hashable, Iterator, TypeVar

import torch
from torch import Tensor

T = TypeVar("T")


class _Batch:
    """What the host knows about one batch mask (an open :func:`batch_padding` block)."""

    def __init__(self, mask: Tensor, padded: bool | None) -> None:
        self.mask = mask
        self.facts: dict[Hashable, Any] = {} if padded is None else {"padded": padded}


class _State(threading.local):
    def __init__(self) -> None:
        self.accelerator_on_cpu = False
        self.graph_safe = False
        self.batches: list[_Batch] = []


_STATE = _State()


class GraphSafeError(RuntimeError):
    """A host read was asked for in graph-safe mode: the variant's graph-safe branch is missing."""


def graph_safe_active() -> bool:
    """Whether code runs graph-safe: inside :func:`graph_safe`, or while ``torch.compile`` traces it."""
    return torch.compiler.is_compiling() or _STATE.graph_safe


@contextmanager
def graph_safe(on: bool = True) -> Iterator[None]:
    """Within the block (``on``), attention code takes no host read and draws counter-based randoms.

    ``on=False`` switches nothing off: inside an enclosing graph-safe block the code stays graph-safe.
    The switch does nest: ``LRAClassifier.forward`` enters ``graph_safe(self.graph_safe)`` on every
    call, and a caller that runs a network built without the flag inside its own graph-safe block
    (a test, a tool) must still get no host read and the counter-based draws."""
    before = _STATE.graph_safe
    _STATE.graph_safe = on or before    # never ``on``: a nested False would undo the caller's block
    try:
        yield
    finally:
        _STATE.graph_safe = before


def fused_unless_graph_safe(fused: Callable[..., T], reference: Callable[..., T]) -> Callable[..., T]:
    """One op from two implementations with the same values: ``fused`` (a custom autograd Function's
    ``apply``, or code writing through ``out=`` views: fewer temporaries) in eager mode, and
    ``reference`` (plain autograd ops, which ``torch.compile`` traces) in graph-safe mode. The mode
    is asked at each call, not when the op is made."""
    def op(*args: Any) -> T:
        return (reference if graph_safe_active() else fused)(*args)
    return op


def host_reads_free(t: Tensor) -> bool:
    """True where reading ``t``'s values on the host costs no device sync (CPU tensors), unless
    :func:`accelerator_branches` or graph-safe mode is active."""
    return t.device.type == "cpu" and not _STATE.accelerator_on_cpu and not graph_safe_active()


@contextmanager
def accelerator_branches() -> Iterator[None]:
    """Within the block, :func:`host_reads_free` is False on CPU too: the branches an accelerator
    takes (no data-dependent shortcut) run on CPU, with the same results."""
    before = _STATE.accelerator_on_cpu
    _STATE.accelerator_on_cpu = True
    try:
        yield
    finally:
        _STATE.accelerator_on_cpu = before


@contextmanager
def batch_padding(mask: Tensor, padded: bool | None = None) -> Iterator[None]:
    """Within the block, :func:`has_padding` of this ``mask`` object is ``padded`` (None: read from
    the mask at the first question, once for the whole block)."""
    _STATE.batches.append(_Batch(mask, padded))
    try:
        yield
    finally:
        _STATE.batches.pop()


def per_batch(mask: Tensor, key: Hashable, read: Callable[[], T]) -> T:
    """``read()`` (a host read of the batch ``mask``) once per :func:`batch_padding` block of this
    mask object, shared by every layer; outside any such block, on every call. Graph-safe mode
    answers only facts the host stated (:func:`batch_padding`) and raises :class:`GraphSafeError`
    for any other."""
    safe = graph_safe_active()
    for batch in reversed(_STATE.batches):
        if batch.mask is mask:
            if key not in batch.facts:
                if safe:
                    raise GraphSafeError(f"host read of the batch mask ({key!r}) in graph-safe mode")
                batch.facts[key] = read()
            return batch.facts[key]
    if safe:
        raise GraphSafeError(f"host read of the batch mask ({key!r}) in graph-safe mode")
    return read()


def has_padding(mask: Tensor) -> bool:
    """Whether the bool ``mask`` (True = real token) has a padded position: as stated for this
    mask object by the innermost :func:`batch_padding` block, else read from the device (one
    host sync, once per block). Graph-safe mode never reads: unstated padding answers True (the
    masked path is right for any mask)."""
    if graph_safe_active():
        for batch in reversed(_STATE.batches):
            if batch.mask is mask:
                return batch.facts.get("padded", True)
        return True
    return per_batch(mask, "padded", lambda: not bool(mask.all()))
