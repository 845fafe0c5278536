"""Every attention x task pair composes and instantiates (new YAML files are covered automatically)."""
from __future__ import annotations

import pytest
from hydra import compose, initialize_config_dir
from hydra.core.hydra_config import HydraConfig
from hydra.utils import instantiate
from omegaconf import OmegaConf, open_dict

from attention.registry import CONF_DIR, config_names

PAIRS = [(a, t) for a in config_names("attention") for t in config_names("task")]


def compose_run(*overrides: str):
    """The config run.py would see, with the hydra: resolvers usable outside a Hydra app."""
    with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
        cfg = compose("config", overrides=["paths.output_dir=outputs/test", *overrides], return_hydra_config=True)
    HydraConfig.instance().set_config(cfg)
    with open_dict(cfg):
        del cfg["hydra"]
    return cfg


@pytest.mark.slow
@pytest.mark.parametrize("attention,task", PAIRS)
def test_pair_composes_and_instantiates(attention, task, tmp_path):
    cfg = compose_run(f"attention={attention}", f"task={task}", f"paths.data_dir={tmp_path}")
    resolved = OmegaConf.to_container(cfg, resolve=True)
    assert resolved["attention_name"] == attention
    assert resolved["task"]["name"] == task
    assert cfg.model.max_len == cfg.task.max_len
    mixer = instantiate(cfg.attention)
    assert callable(mixer)
    dm = instantiate(cfg.task.datamodule)
    assert dm.max_len == cfg.task.max_len and dm.batch_size == cfg.task.batch_size


def test_defaults_are_softmax_listops_csv():
    cfg = compose_run()
    assert cfg.attention_name == "softmax" and cfg.task.name == "listops" and "csv" in cfg.logger
    assert cfg.mode == "train" and cfg.model.n_layers == 2 and cfg.model.d_model == 64


def test_data_dir_from_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("LRA_DATA_DIR", str(tmp_path / "elsewhere"))
    assert compose_run().paths.data_dir == str(tmp_path / "elsewhere")
