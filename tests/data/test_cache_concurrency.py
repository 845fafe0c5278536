"""Two processes preparing the same dataset at once: one builds, the other waits; both read the
same complete cache and no temporary directory is left behind."""
from __future__ import annotations

import multiprocessing as mp

import numpy as np
import pytest

from lra.data.cache import is_complete
from lra.data.listops import ListOpsDataModule

GEN = {"n_train": 300, "n_val": 20, "n_test": 20, "min_length": 5, "max_length": 60}


def _prepare(data_dir: str, queue) -> None:
    dm = ListOpsDataModule(data_dir, max_len=64, generator=GEN)
    dm.prepare_data()
    dm.setup()
    queue.put(np.asarray(dm.datasets["train"].labels).tolist())


@pytest.mark.slow
def test_concurrent_prepare_is_safe(tmp_path):
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_prepare, args=(str(tmp_path), queue)) for _ in range(2)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=240) for _ in procs]
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert results[0] == results[1] and len(results[0]) == 300
    dm = ListOpsDataModule(str(tmp_path), max_len=64, generator=GEN)
    assert is_complete(dm.cache_dir)
    leftovers = [p.name for p in (tmp_path / "listops").iterdir() if ".building-" in p.name]
    assert leftovers == []
