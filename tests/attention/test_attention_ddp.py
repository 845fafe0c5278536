"""Every config trains under DDP (``trainer=ddp``: two gloo processes on CPU) exactly as one process
trains on the global batch: gradients of two steps, parameters, buffers (routing's centroids,
performer's redrawn features) and the mixers' random streams, in float64.

One process pair trains every case (starting a pair costs seconds; one per config would cost
minutes). Memformer with MRBP crashed here before its checkpointing became non-reentrant ("Expected
to mark a variable ready only once"). Variants that draw randomness per example (ABC_RD's slots,
AdaMRA's random router, Sinkhorn's Gumbel noise) draw the same stream on every rank, as dropout
does under Lightning's DDP (every rank seeded alike): for them the reference runs each half of the
global batch from the same state and averages (:func:`tests.ddp_harness.train_steps_per_rank`).
"""
from __future__ import annotations

import json
import socket

import pytest
import torch
import torch.multiprocessing as mp

from attention.registry import variant_names
from tests.conftest import TINY_LISTOPS
from tests.ddp_harness import ddp_rank, global_batches, train_steps, train_steps_per_rank

PER_EXAMPLE_RANDOM = {"abc_rd", "adamra_random_router", "sinkhorn"}
CASES = [(n, n, {}) for n in variant_names()]
CASES = [(i, n, {"redraw_interval": 1} if n.startswith("performer") else o) for i, n, o in CASES]  # a redraw per step
CASES += [("memformer-mrbp", "memformer", {"mrbp": True}),
          ("memformer-per_layer-mrbp", "memformer", {"memory": "per_layer", "mrbp": True})]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


pytestmark = pytest.mark.xdist_group("ddp")  # gloo on a port found free just before (tests/conftest.py)


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory):
    """The pair's results directory, every case trained once."""
    out = tmp_path_factory.mktemp("ddp")
    mp.start_processes(ddp_rank, args=(_free_port(), CASES, str(out)), nprocs=2, join=True, start_method="fork")
    return out


def _same(got, expected, what: str) -> None:
    if isinstance(expected, dict):
        assert got.keys() == expected.keys(), f"{what}: {sorted(got)} != {sorted(expected)}"
        for k in expected:
            _same(got[k], expected[k], f"{what}.{k}")
    elif isinstance(expected, (list, tuple)):
        assert len(got) == len(expected), what
        for i, (g, e) in enumerate(zip(got, expected)):
            _same(g, e, f"{what}[{i}]")
    elif isinstance(expected, torch.Tensor):
        torch.testing.assert_close(got, expected, rtol=1e-9, atol=1e-12, msg=what)
    else:
        assert got == expected, what


@pytest.mark.slow
@pytest.mark.parametrize(("case_id", "name", "overrides"), CASES, ids=[c[0] for c in CASES])
def test_ddp_equals_one_process_on_the_global_batch(ddp_runs, case_id, name, overrides):
    ranks = []
    for rank in range(2):
        err = ddp_runs / f"{case_id}.rank{rank}.err"
        assert not err.exists(), f"rank {rank} failed:\n{err.read_text()}"
        ranks.append(torch.load(ddp_runs / f"{case_id}.rank{rank}.pt", weights_only=False))
    reference = train_steps_per_rank if name in PER_EXAMPLE_RANDOM else train_steps
    expected = reference(name, overrides, global_batches())
    for rank, got in enumerate(ranks):
        _same(got, expected, f"{case_id} rank {rank}")
    assert any(g.abs().max() > 0 for g in expected["grads"][1].values())


@pytest.mark.slow  # one DDP run through run.py: two processes, ~35 s on the shared 2-core machine
def test_memformer_mrbp_trains_through_run_py_under_ddp(cli):
    """The whole path (Lightning's DDP strategy, two gloo ranks, MRBP over two segments of 32 tokens)
    finishes and writes its record; the reentrant checkpoint crashed here at the first backward."""
    cli("attention=memformer", "attention.mrbp=true", *TINY_LISTOPS, "trainer=ddp", "trainer.accelerator=cpu",
        "trainer.devices=2", "trainer.max_steps=2", "task.val_every=2", "trainer.enable_progress_bar=false",
        timeout=600)
    (path,) = (cli.cwd / "results" / "runs").glob("*.json")
    rec = json.loads(path.read_text())
    assert rec["status"] == "finished" and rec["metrics"]["train_steps"] == 2
    assert rec["config"]["attention"]["mrbp"] is True and rec["config"]["trainer"]["devices"] == 2
