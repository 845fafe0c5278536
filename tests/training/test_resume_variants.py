"""Every attention module resumes exactly, with every config that draws randomness in training
(Performer redraws, Reformer rotations, Sinkhorn's Gumbel noise, AdaMRA's random router, ABC_RD's
slots, clustering's hashes) or keeps state across steps (routing centroids, Performer's redraw
counter): ``ONE_PER_MODULE`` and ``DRAWING`` of :mod:`tests.attention_harness`, 19 of the 28 configs.
The other 9 differ from a config here only in sizes or a deterministic feature map, and what a
resume restores for them (parameters, optimiser, RNG, counters) is the same code.

Each config trains 12 steps (2 layers, dropout on; validation at 6 and 12, ``last.ckpt`` every 4,
Performer redrawing every 5 calls) uninterrupted, and again killed in step 10: between two
validations, two redraws and two centroid updates, after the checkpoint of step 8. The same command
resumes it. The two runs must end identical: metrics and learning curve, and in the final
``last.ckpt`` every parameter and buffer, every mixer's seed, training streams and counters (its
extra state), the optimiser state and the global RNG states, all bit for bit."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.attention_harness import DRAWING, ONE_PER_MODULE
from tests.conftest import TINY_LISTOPS
from tests.forkrun import run_all
from tests.training.test_resume import kill_at

pytestmark = pytest.mark.slow
ARGS = [*TINY_LISTOPS, "model.n_layers=2", "model.dropout=0.1", "trainer.max_steps=12", "task.val_every=6",
        "checkpointing.every_n_steps=4", "trainer.deterministic=true", "trainer.enable_progress_bar=false"]
EXTRA = {"performer": ["attention.redraw_interval=5"], "performer_32": ["attention.redraw_interval=5"]}
KILL = "step:10"
CONFIGS = sorted(set(ONE_PER_MODULE) | DRAWING)


def _final(cwd: Path) -> dict:
    (rec,) = [json.loads(p.read_text()) for p in (cwd / "results" / "runs").glob("*.json")]
    assert rec["status"] == "finished", rec.get("error")
    (last,) = (cwd / "checkpoints").glob("*/last.ckpt")
    ckpt = torch.load(last, map_location="cpu", weights_only=False)
    return {"record": rec, "state": ckpt["state_dict"], "optimizer": ckpt["optimizer_states"],
            "rng": ckpt["rng_states"], "step": ckpt["global_step"]}


def _both(name: str, root: Path, data: Path):
    args = [*ARGS, f"attention={name}", *EXTRA.get(name, [])]

    def job(server):
        out = {}
        for kind in ("uninterrupted", "resumed"):
            cwd = root / name / kind
            cwd.mkdir(parents=True)
            env = {"LRA_DATA_DIR": str(data), "LRA_RESULTS_DIR": str(cwd / "results"),
                   "LRA_CHECKPOINT_DIR": str(cwd / "checkpoints")}
            if kind == "resumed":
                killed = server.run([*args, *kill_at(KILL)], cwd, env, check=False)
                assert killed.returncode == -9, killed.stderr[-3000:]
            server.run(args, cwd, env)
            out[kind] = _final(cwd)
        return out

    return job


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root, data = tmp_path_factory.mktemp("variants"), tmp_path_factory.mktemp("data")
    return dict(zip(CONFIGS, run_all([_both(n, root, data) for n in CONFIGS])))


def assert_same(a, b, where: str) -> None:
    """Equal, bit for bit, through nested dicts/lists/tuples of tensors, generator states and numbers."""
    if isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape, where
        assert torch.equal(a, b), f"{where}: differs (max |diff| {(a.double() - b.double()).abs().max().item():.3g})"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), f"{where}: keys {sorted(a)} vs {sorted(b)}"
        for key in a:
            assert_same(a[key], b[key], f"{where}.{key}")
    elif isinstance(a, (list, tuple)):
        assert isinstance(b, (list, tuple)) and len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            assert_same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} vs {b!r}"


@pytest.mark.parametrize("name", CONFIGS)
def test_variant_resumes_exactly(runs, name):
    ref, resumed = runs[name]["uninterrupted"], runs[name]["resumed"]
    assert resumed["record"]["resumed"] is True and resumed["step"] == ref["step"] == 12
    for key in ("best_val_acc", "best_val_step", "val_acc", "test_acc", "test_loss", "train_steps"):
        assert resumed["record"]["metrics"][key] == ref["record"]["metrics"][key], key
    assert resumed["record"]["learning_curve"] == ref["record"]["learning_curve"]
    extra = [k for k in ref["state"] if k.endswith("_extra_state")]
    assert extra, "no mixer extra state in the checkpoint"
    assert_same(ref["state"], resumed["state"], "state_dict")  # parameters, buffers, seeds, draw counts
    assert_same(ref["optimizer"], resumed["optimizer"], "optimizer")
    assert_same(ref["rng"], resumed["rng"], "rng_states")


def test_the_kill_falls_between_redraws_and_centroid_updates(runs):
    """The resumed stretch (steps 9-12) holds a Performer redraw (call 10) and routing updates, so
    dropping a draw count, a counter or a buffer on resume would show."""
    performer = runs["performer"]["uninterrupted"]["state"]
    calls = [v["training_calls"] for k, v in performer.items() if k.endswith("_extra_state")]
    assert calls and all(c == 12 for c in calls)
    draws = [v["draws"] for k, v in runs["reformer"]["uninterrupted"]["state"].items() if k.endswith("_extra_state")]
    assert draws and all(d > 0 for d in draws)  # reformer draws in training: its draw count is checkpointed


DDP = ["trainer=ddp", "trainer.accelerator=cpu", "trainer.devices=2"]
STATEFUL = ["routing", "performer"]  # state every rank must keep equal: all-reduced centroids, redraw counter


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory):
    root, data = tmp_path_factory.mktemp("ddp"), tmp_path_factory.mktemp("data")
    jobs = []
    for name in STATEFUL:
        job = _both(name, root, data)
        jobs.append(lambda server, job=job, name=name: job(_WithArgs(server, DDP)))
    return dict(zip(STATEFUL, run_all(jobs, servers=1)))  # one DDP pair at a time on two cores


class _WithArgs:
    """A run server whose every command gets ``extra`` (here: two gloo processes)."""

    def __init__(self, server, extra: list[str]) -> None:
        self.server, self.extra = server, extra

    def run(self, args, cwd, env=None, check=True):
        return self.server.run([*args, *self.extra], cwd, env, check=check)


@pytest.mark.xdist_group("ddp")  # Lightning's ddp takes a port found free just before (tests/conftest.py)
@pytest.mark.parametrize("name", STATEFUL)
def test_ddp_stateful_variant_resumes_exactly(ddp_runs, name):
    """Both ranks kill themselves in step 10 (after that step's gradient all-reduce); rank 0's
    checkpoint of step 8 holds what both ranks need, since their state is kept equal."""
    ref, resumed = ddp_runs[name]["uninterrupted"], ddp_runs[name]["resumed"]
    assert resumed["record"]["resumed"] is True and resumed["record"]["config"]["trainer"]["devices"] == 2
    assert resumed["record"]["metrics"] == ref["record"]["metrics"]
    assert_same(ref["state"], resumed["state"], "state_dict")
    assert_same(ref["optimizer"], resumed["optimizer"], "optimizer")
