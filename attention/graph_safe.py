"""What is left of the second execution path that issue 62 removes, until the last variant is
converted: :func:`graph_safe_active` (True while ``torch.compile`` traces), which a variant with
a static-shape twin asks, and :func:`host_reads_free`, which guards the CPU-only shortcuts that
read device values (:func:`accelerator_branches` makes it False so tests run the accelerator's
branches on CPU). The eager graph-safe mode (``model.graph_safe``) is gone: every random draw is
counter-based already, and padding travels with the mask (:class:`attention.padding.Padding`).
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


_STATE = _State()


def graph_safe_active() -> bool:
    """Whether ``torch.compile`` traces the code."""
    return torch.compiler.is_compiling()


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
