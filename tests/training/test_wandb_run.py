"""The W&B run of a suite run (lra/training/wandb_run.py): group = the experiment (seeds together,
variants apart), a unique readable name, an id derived from the suite's run id (a resume continues
it), the user's own settings kept. The offline end-to-end proof: tests/training/test_newcomer.py
(a run killed and resumed logs to one W&B id) and tests/training/test_sweeps.py (seeds, one group)."""
from __future__ import annotations

from hydra import compose, initialize_config_dir

from lra import CONF_DIR
from lra.training.wandb_run import MAX_ID, experiment_group, run_name, wandb_id, wandb_settings

RUN_ID = "20261201T212956-train-listops-softmax-s0-3f2712"


def composed(*overrides: str):
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["logger=wandb", "paths.output_dir=/out", *overrides])
    cfg.attention_name = next((o.split("=")[1] for o in overrides if o.startswith("attention=")), "softmax")
    return cfg


def test_group_is_the_experiment_name_unique_id_from_the_run_id():
    base = composed()
    settings = wandb_settings(base, base.logger.wandb, RUN_ID)
    assert settings == {"id": RUN_ID, "name": "softmax_listops_xiong2021_s0_3f2712", "group": experiment_group(base)}
    assert base.logger.wandb.resume == "allow"   # the same id continues the same W&B run
    assert experiment_group(base).startswith("softmax-listops-xiong2021-")
    assert experiment_group(composed("seed=1")) == experiment_group(base)             # seeds group together
    assert experiment_group(composed("attention=linear")) != experiment_group(base)   # variants never
    assert experiment_group(composed("optim.lr=0.01")) != experiment_group(base)      # nor other settings
    assert run_name(composed("seed=1"), RUN_ID.replace("s0", "s1")) != settings["name"]


def test_a_resume_gets_the_same_id_and_the_users_settings_stay():
    cfg = composed("logger.wandb.group=mine", "logger.wandb.name=first")
    assert wandb_settings(cfg, cfg.logger.wandb, RUN_ID) == {"id": RUN_ID}
    assert wandb_settings(cfg, cfg.logger.wandb, RUN_ID) == wandb_settings(cfg, cfg.logger.wandb, RUN_ID)


def test_ids_are_what_wandb_accepts():
    assert wandb_id("a/b:c") == "a-b-c"
    long = "x" * 100
    assert len(wandb_id(long)) == MAX_ID and wandb_id(long) != wandb_id("x" * 99)


def test_offline_files_go_under_the_results_folder():
    cfg = composed("paths.results_dir=/somewhere/results")
    assert cfg.logger.wandb.save_dir == "/somewhere/results"
    assert cfg.logger.wandb.job_type == "train" and composed("mode=test").logger.wandb.job_type == "test"
