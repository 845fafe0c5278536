"""What a model occupies: peak memory of a phase (measured honestly, the method named in every
record) and parameter counts.

* CUDA: ``torch.cuda.max_memory_allocated`` after ``reset_peak_memory_stats`` (tensor memory held
  by PyTorch's allocator; what AdaMRA's Table 2 reports as "peak allocated GPU memory").
* CPU (Linux): the kernel's resident-set high-water mark ``VmHWM`` of ``/proc/self/status``, reset
  at the start of the phase by writing ``5`` to ``/proc/self/clear_refs``. That is the process's
  real peak RSS during the phase (it includes the interpreter, libraries and anything the allocator
  keeps; callers that want the phase's own need subtract a baseline, see :mod:`lra.bench.harness`).
* CPU without a writable ``clear_refs`` (old kernels, hardened containers): ``VmHWM`` cannot be
  reset, so the figure is the peak since the process started, an upper bound of the phase's; the
  method name says so. Without ``/proc`` at all (macOS): ``ru_maxrss``, also lifetime.

Only the standard library, torch and the attention shell are imported: the bench workers use this
module without paying for Lightning's import.
"""
from __future__ import annotations

import re
import resource
import sys
from pathlib import Path

import torch
from torch import nn

from attention.base import Mixer
from attention.shell import MultiHeadAttention

MB = 2.0**20
CUDA = "cuda-max-memory-allocated"
CPU_RESET = "cpu-vmhwm-reset"          # VmHWM reset through /proc/self/clear_refs
CPU_LIFETIME = "cpu-vmhwm-lifetime"    # clear_refs not writable: peak since process start
CPU_RUSAGE = "cpu-ru-maxrss-lifetime"  # no /proc: getrusage, peak since process start

METHOD_NOTES = {
    CUDA: "torch.cuda.max_memory_allocated, peak stats reset at the start of each phase",
    CPU_RESET: "process peak RSS (VmHWM), reset at the start of each phase via /proc/self/clear_refs",
    CPU_LIFETIME: "process peak RSS (VmHWM) since process start: /proc/self/clear_refs is not writable, "
                  "so the high-water mark could not be reset per phase (an upper bound)",
    CPU_RUSAGE: "getrusage ru_maxrss since process start (no /proc): an upper bound of the phase peak",
}


def _status_kb(field: str, status_path: Path) -> float | None:
    try:
        m = re.search(rf"^{field}:\s+(\d+)\s*kB", status_path.read_text(), re.M)
    except OSError:
        return None
    return float(m.group(1)) if m else None


class PeakMemory:
    """``reset()`` at a phase start, ``peak_mb()`` at its end; ``method`` names what was measured."""

    def __init__(
        self, device: torch.device | str = "cpu", clear_refs: str | Path = "/proc/self/clear_refs",
        status: str | Path = "/proc/self/status",
    ) -> None:
        self.device = torch.device(device)
        self._clear_refs, self._status = Path(clear_refs), Path(status)
        if self.device.type == "cuda":
            self.method = CUDA
        elif _status_kb("VmHWM", self._status) is None:
            self.method = CPU_RUSAGE
        else:
            self.method = CPU_RESET if self._try_reset() else CPU_LIFETIME

    @property
    def note(self) -> str:
        return METHOD_NOTES[self.method]

    @property
    def resettable(self) -> bool:
        return self.method in (CUDA, CPU_RESET)

    def _try_reset(self) -> bool:
        try:
            with open(self._clear_refs, "w") as f:
                f.write("5")
            return True
        except OSError:
            return False

    def reset(self) -> None:
        if self.method == CUDA:
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
        elif self.method == CPU_RESET:
            self._try_reset()

    def peak_mb(self) -> float:
        if self.method == CUDA:
            torch.cuda.synchronize(self.device)
            return torch.cuda.max_memory_allocated(self.device) / MB
        if self.method == CPU_RUSAGE:
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
            return rss / MB if sys.platform == "darwin" else rss / 1024.0  # bytes on macOS, kB on Linux
        return (_status_kb("VmHWM", self._status) or 0.0) / 1024.0

    def file_mb(self) -> float:
        """File-backed and shared resident pages (library code, memory-mapped data) on CPU; 0 on CUDA.
        Subtracted by the bench so the first use of a library's code pages is not counted as memory
        the workload needs."""
        if self.method == CUDA:
            return 0.0
        return ((_status_kb("RssFile", self._status) or 0.0) + (_status_kb("RssShmem", self._status) or 0.0)) / 1024.0

    def current_mb(self) -> float:
        """Memory in use now (allocated tensors on CUDA, resident set on CPU)."""
        if self.method == CUDA:
            return torch.cuda.memory_allocated(self.device) / MB
        rss = _status_kb("VmRSS", self._status)
        return rss / 1024.0 if rss is not None else self.peak_mb()


def count_parameters(model: nn.Module) -> dict[str, int]:
    """Total, trainable, attention (everything under :class:`MultiHeadAttention`: projections and
    mixer) and mixer-only (the variant's own parameters) counts; shared tensors are counted once."""
    def unique(modules) -> dict[int, nn.Parameter]:
        return {id(p): p for m in modules for p in m.parameters()}

    every = unique([model])
    attn = unique(m for m in model.modules() if isinstance(m, MultiHeadAttention))
    mixer = unique(m for m in model.modules() if isinstance(m, Mixer))
    return {
        "total": sum(p.numel() for p in every.values()),
        "trainable": sum(p.numel() for p in every.values() if p.requires_grad),
        "attention": sum(p.numel() for p in attn.values()),
        "mixer": sum(p.numel() for p in mixer.values()),
    }
