"""CPU threads of a run (``threads:`` in ``conf/config.yaml``; ``bench.threads`` defaults to it).

Default 1, written down: on a shared or small CPU, torch's default (one thread per core) makes small
models many times slower (measured on a loaded 2-core machine: ``experiment=quick`` 1366 s with the
default against 35 s with one thread) and makes bench timings depend on the neighbours' load. One
thread measures per-core cost honestly and reproducibly; raise it on a dedicated many-core CPU for
the full protocols. GPU runs are unaffected (the threads only run host-side ops). The count is in
every record: ``efficiency.threads`` (and ``stamp.torch_threads``).
"""
from __future__ import annotations

import torch


def apply_threads(threads: int | str | None) -> int:
    """Set torch's intra-op threads; ``None`` keeps torch's default (one per core). Returns the count in use."""
    if threads is not None:
        if isinstance(threads, bool) or not str(threads).isdigit() or int(threads) < 1:
            raise ValueError(f"threads={threads!r} is not valid; use a positive integer (threads=1) "
                             "or threads=null for torch's default of one per core")
        torch.set_num_threads(int(threads))
    return torch.get_num_threads()
