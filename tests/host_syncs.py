"""Host synchronisations, counted at the dispatcher: what a training step would make an accelerator
wait for, measured on CPU.

A host sync is any point where the host needs a value the device computes: ``.item()``, ``bool()``,
``int()``, ``float()`` of a tensor (all reach ``aten._local_scalar_dense``), ``.tolist()`` (patched:
on CPU it reads memory without dispatching), ops whose output shape depends on the data
(``nonzero``, ``unique``, ``masked_select``, boolean indexing, ``repeat_interleave`` without
``output_size``), ``bincount`` (two on CUDA: it reads the min and the max), ops that return a
Python bool (``equal``, ``allclose``, ``is_nonzero``) and copies between the host and the device.
A tensor built from Python data (``torch.tensor([...], device=...)``: ``aten.lift_fresh``) is a
host-to-device copy from pageable memory, which CUDA makes synchronous; on CPU the build and the
copy cannot be told apart, so every such build inside the counted region is counted.

:class:`HostSyncSpy` is a ``TorchDispatchMode``: it sees every op of the forward and the backward
(autograd runs the backward on the calling thread on CPU), including those inside custom autograd
Functions, and names the source line (in ``attention/``, ``models/`` or ``lra/``) of each sync.
The mixers take their accelerator choices (:func:`attention.base.emulate_accelerator`).

Reused by the graph-safe work (issue 25): :func:`forbid_host_syncs` raises at the first sync.

    python -m tests.host_syncs            # the per-variant table of a training step (padded, unpadded)
"""
from __future__ import annotations

import argparse
import sys
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

import torch
from torch.utils._python_dispatch import TorchDispatchMode

ROOT = Path(__file__).resolve().parent.parent
SOURCES = tuple(str(ROOT / d) for d in ("attention", "models", "lra"))
aten = torch.ops.aten

# op -> (kind, syncs it costs on CUDA)
SYNC_OPS: dict[object, tuple[str, int]] = {
    aten._local_scalar_dense.default: ("item", 1),
    aten.nonzero.default: ("nonzero", 1),
    aten.bincount.default: ("bincount", 2),
    aten.masked_select.default: ("masked_select", 1),
    aten.equal.default: ("equal", 1),
    aten.allclose.default: ("allclose", 1),
    aten.is_nonzero.default: ("is_nonzero", 1),
    aten.lift_fresh.default: ("tensor from host data", 1),
    aten.lift_fresh_copy.default: ("tensor from host data", 1),
}
for _name in ("_unique2", "unique_dim", "unique_consecutive", "unique_dim_consecutive"):
    SYNC_OPS[getattr(aten, _name).default] = ("unique", 1)
BOOL_INDEXED = {aten.index.Tensor, aten.index_put.default, aten.index_put_.default, aten._index_put_impl_.default}
COPIES = {aten._to_copy.default, aten.copy_.default}


@dataclass(frozen=True)
class SyncEvent:
    kind: str
    syncs: int
    site: str      # "attention/softmax.py:26" (innermost frame of the suite's own code)


def _site() -> str:
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if name.startswith(SOURCES):
            return f"{Path(name).relative_to(ROOT)}:{frame.f_lineno}"
        frame = frame.f_back
    return "<outside the suite>"


def _sync_of(func, args, kwargs) -> tuple[str, int] | None:
    if func in SYNC_OPS:
        return SYNC_OPS[func]
    if func in BOOL_INDEXED:
        indices = args[1] if len(args) > 1 else kwargs.get("indices", ())
        if any(t is not None and t.dtype in (torch.bool, torch.uint8) for t in indices):
            return ("boolean index", 1)
    if func is aten.repeat_interleave.Tensor and kwargs.get("output_size") is None:
        return ("repeat_interleave", 1)
    if func in COPIES:
        src, dst = (args[1], args[0]) if func is aten.copy_.default else (args[0], None)
        dst_device = dst.device if dst is not None else kwargs.get("device") or src.device
        if torch.device(dst_device).type != src.device.type:
            return ("host-device copy", 1)
    return None


class HostSyncSpy(TorchDispatchMode):
    """Records a :class:`SyncEvent` for every host sync dispatched while it is active."""

    def __init__(self, on_sync: Callable[[SyncEvent], None] | None = None) -> None:
        super().__init__()
        self.events: list[SyncEvent] = []
        self.on_sync = on_sync
        self._quiet = 0       # inside a patched method that records itself

    def record(self, kind: str, syncs: int) -> None:
        event = SyncEvent(kind, syncs, _site())
        self.events.append(event)
        if self.on_sync is not None:
            self.on_sync(event)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if not self._quiet:
            found = _sync_of(func, args, kwargs)
            if found is not None:
                self.record(*found)
        return func(*args, **kwargs)

    @property
    def syncs(self) -> int:
        """Host syncs on CUDA (``bincount`` counts 2)."""
        return sum(e.syncs for e in self.events)

    def by_site(self) -> Counter:
        """Syncs per ``(site, kind)``."""
        out: Counter = Counter()
        for e in self.events:
            out[(e.site, e.kind)] += e.syncs
        return out


@contextmanager
def count_host_syncs(on_sync: Callable[[SyncEvent], None] | None = None) -> Iterator[HostSyncSpy]:
    """Count the host syncs of the block (``.tolist()`` included)."""
    spy = HostSyncSpy(on_sync)
    original = torch.Tensor.tolist

    def tolist(self):
        spy.record("tolist", 1)
        spy._quiet += 1
        try:
            return original(self)
        finally:
            spy._quiet -= 1

    torch.Tensor.tolist = tolist
    try:
        with spy:
            yield spy
    finally:
        torch.Tensor.tolist = original


class HostSyncError(RuntimeError):
    pass


@contextmanager
def forbid_host_syncs() -> Iterator[HostSyncSpy]:
    """Raise :class:`HostSyncError` at the first host sync of the block, naming it and its line."""
    def fail(event: SyncEvent) -> None:
        raise HostSyncError(f"host sync ({event.kind}) at {event.site}")

    with count_host_syncs(fail) as spy:
        yield spy


# -- a training step per variant ---------------------------------------------------------------------

def step_syncs(name: str, padded: bool, host_padding: bool = True, **overrides) -> HostSyncSpy:
    """The host syncs of the second training step of ``name`` (the first one warms lazily built
    state) on the accelerator's branches. ``host_padding``: the padding is known on the host (as
    ``LRAModule`` knows it before the batch transfer); False: the network reads it from the mask."""
    from attention.base import emulate_accelerator
    from tests.tiny_network import step_batch, tiny_network, training_loss

    net = emulate_accelerator(tiny_network(name, **overrides).train())
    ids, mask, label = step_batch(padded)
    hint = padded if host_padding else None
    training_loss(net, ids, mask, label, hint).backward()
    net.zero_grad(set_to_none=True)
    with count_host_syncs() as spy:
        training_loss(net, ids, mask, label, hint).backward()
    return spy


def main(argv: list[str] | None = None) -> int:
    from attention.registry import variant_names
    from tests.tiny_network import BATCH, PADDED_LENGTHS, SEQ

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--only", nargs="*", default=None, help="variants (default: every config)")
    ap.add_argument("--sites", action="store_true", help="list the source line of every sync")
    ap.add_argument("--device-padding", action="store_true",
                    help="the network reads the padding from the mask (no host hint)")
    args = ap.parse_args(argv)
    torch.set_num_threads(1)
    cases = [(n, {}) for n in (args.only or variant_names())]
    if args.only is None:
        cases.insert([n for n, _ in cases].index("memformer") + 1, ("memformer", {"mrbp": True}))
    print(f"host syncs per training step (2 layers, batch {BATCH}, {SEQ} tokens; padded lengths {PADDED_LENGTHS})")
    print("| variant | padded batch | unpadded batch |\n|---|---|---|")
    for name, overrides in cases:
        label = name + "".join(f" {k}={v}" for k, v in overrides.items())
        spies = [step_syncs(name, p, not args.device_padding, **overrides) for p in (True, False)]
        print(f"| {label} | {spies[0].syncs} | {spies[1].syncs} |", flush=True)
        if args.sites:
            for which, spy in zip(("padded", "unpadded"), spies):
                for (site, kind), n in sorted(spy.by_site().items()):
                    print(f"    {which}: {n} x {kind} at {site}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
