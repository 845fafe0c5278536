"""Experiment presets compose with every task, and a fast_dev_run of each runs."""
from __future__ import annotations

import json

import pytest

from attention.registry import config_names
from lra.checks.config import ablation_owner
from tests.conftest import TINY_LISTOPS, run_cli
from tests.training.test_config import compose_run

EXPERIMENTS = config_names("experiment")
TASKS = config_names("task")


@pytest.mark.slow
@pytest.mark.parametrize("experiment", EXPERIMENTS)
@pytest.mark.parametrize("task", TASKS)
def test_preset_composes(experiment, task):
    cfg = compose_run(f"experiment={experiment}", f"task={task}")
    assert cfg.protocol and cfg.model.max_len == cfg.task.max_len


def test_lra2020_per_task_protocol():
    listops = compose_run("experiment=lra2020", "task=listops")
    assert (listops.model.n_layers, listops.model.d_model, listops.model.pool) == (4, 512, "cls")
    assert listops.optim.schedule == "rsqrt" and listops.optim.betas == [0.9, 0.98]
    image = compose_run("experiment=lra2020", "task=image")
    assert (image.model.n_layers, image.model.d_model, image.model.dropout) == (1, 128, 0.3)
    assert image.optim.schedule == "cosine" and image.task.batch_size == 256


def test_ablation_rows_are_named():
    cfg = compose_run("experiment=adamra_ablation", "ablation=adamra_t5_elu")
    assert cfg.attention_name == "adamra_t5_elu" and cfg.attention.feature_map == "elu"
    assert cfg.attention._target_.endswith("AdaMRAAttention")


def test_port_ablations_are_recorded_under_their_own_names():
    """A port's model must never land in the paper model's row; the ablation selects its variant."""
    cfg = compose_run("experiment=xiong2021", "task=listops", "+ablation=linear_unnormalised")
    assert cfg.attention_name == "linear_unnormalised" and cfg.attention.normaliser == "sqrt_len"
    assert cfg.attention._target_ == "attention.linear.LinearAttention"
    plain = compose_run("experiment=xiong2021", "task=listops", "attention=linear")
    assert plain.attention_name == "linear" and "normaliser" not in plain.attention   # eq. 6, the default
    port = compose_run("experiment=xiong2021", "task=listops", "+ablation=performer_port")
    assert port.attention_name == "performer_port" and port.attention._target_ == "attention.performer.PerformerAttention"
    assert (port.attention.scaling, port.attention.padded_keys, port.attention.nb_features, port.attention.eps,
            port.attention.redraw_interval) == ("twice", "zero_keys", 256, 1e-4, 0)    # the port's settings
    plain = compose_run("experiment=xiong2021", "task=listops", "attention=performer_32")
    assert "scaling" not in plain.attention and "padded_keys" not in plain.attention  # FAVOR+, the defaults


def test_every_ablation_names_the_variant_it_belongs_to():
    """What the config check holds an ``attention=`` override to (lra.checks.config.ablation_owner)."""
    owners = {name: ablation_owner(name) for name in config_names("ablation")}
    assert all(owner in config_names("attention") for owner in owners.values()), owners
    assert owners["linear_unnormalised"] == "linear" and owners["adamra_t5_elu"] == "adamra"
    assert owners["performer_port"] == "performer"


def test_unknown_experiment_lists_valid_ones(tmp_path):
    proc = run_cli(["experiment=xiong"], tmp_path, check=False)  # Hydra's own error: a fresh interpreter is cheap
    assert proc.returncode != 0 and "Available options" in proc.stderr and "xiong2021" in proc.stderr


TRAIN_PRESETS = {"xiong2021": "xiong2021", "lra2020": "lra2020", "adamra_ablation": "xiong2021", "quick": "quick"}
TINY_DATA = [o for o in TINY_LISTOPS if not o.startswith("model=")]  # keep each preset's own model


@pytest.mark.slow
@pytest.mark.parametrize("experiment", [p for p in TRAIN_PRESETS if p in EXPERIMENTS])
def test_preset_fast_dev_run(cli, experiment):
    cli(f"experiment={experiment}", "task=listops", *TINY_DATA, "trainer.fast_dev_run=true")
    (path,) = (cli.cwd / "results" / "runs").glob("*.json")
    rec = json.loads(path.read_text())
    assert rec["status"] == "finished" and rec["protocol"] == TRAIN_PRESETS[experiment]
    assert rec["metrics"]["train_steps"] == 1


@pytest.mark.slow
@pytest.mark.parametrize("experiment,extra", [("efficiency", []), ("smat", ["smat_job=bench"])])
def test_bench_preset_dry_run(cli, experiment, extra):
    cli(f"experiment={experiment}", *extra, "attention=softmax", "bench.lengths=[32,64]", "bench.batch_size=2",
        "bench.repeats=1", "bench.min_time_s=0", "bench.warmup=0", "bench.isolate=false")
    (path,) = (cli.cwd / "results" / "runs").glob("*.json")
    rec = json.loads(path.read_text())
    assert rec["status"] == "finished" and rec["mode"] == "bench"
    assert [r["length"] for r in rec["efficiency"]["bench"]["results"]] == [32, 64]


def test_smat_preset_covers_bench_and_five_tasks():
    cfg = compose_run("experiment=smat", "smat_job=retrieval")
    assert cfg.mode == "train" and cfg.task.name == "retrieval" and cfg.protocol == "xiong2021"
    assert compose_run("experiment=smat").mode == "bench"
