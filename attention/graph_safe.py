"""The graph-safe switch: the second execution path that issue 62 removes, variant by variant.

Inside :func:`graph_safe` (``model.graph_safe=true``) and while ``torch.compile`` traces
(:func:`graph_safe_active`), a variant that still has two paths takes its static-shape one and
draws counter-based randoms (:mod:`attention.counter_random`). :func:`host_reads_free` (True on
CPU) guards the CPU-only shortcuts that read device values; :func:`accelerator_branches` makes it
False so tests run the accelerator's branches on CPU. Padding is no longer looked up here: it
travels with the mask as :class:`attention.padding.Padding`.
"""
from __future__ import annotations

import threading
from contextlib import contextmanager
from typing import Any, Callable, Iterator, TypeVar

import torch
from torch import Tensor

T = TypeVar("T")


class _State(threading.local):
    def __init__(self) -> None:
        self.accelerator_on_cpu = False
        self.graph_safe = False


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
