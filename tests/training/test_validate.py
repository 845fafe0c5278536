"""lra/training/validate.py and the sweep summary in-process (fast); tests/training/test_user_errors.py runs the same
checks through run.py as a user meets them."""
from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from attention.registry import CONF_DIR
from lra.badinput import ConfigError, NotWritableError
from lra.training.hydra_callbacks import STATUS_FILE, SweepSummary, summarize
from lra.training.validate import check_config, check_overrides, suggest
from tests.training.test_config import compose_run


def _problem(*overrides: str) -> str:
    with pytest.raises(ConfigError) as info:
        check_config(compose_run(*overrides))
    return str(info.value)


def test_defaults_pass_with_no_warning(tmp_path):
    cfg = compose_run(f"paths.results_dir={tmp_path}/r", f"paths.checkpoint_dir={tmp_path}/c")
    assert check_config(cfg) == []


@pytest.mark.parametrize("override,needle", [
    ("optim.lr=0", "optim.lr=0 is invalid"),
    ("seed=abc", "seed='abc' is invalid"),
    ("trainer.max_steps=0", "untrained model"),
    ("checkpointing.every_n_steps=0", "cannot resume"),
    ("model.dropout=1.0", "model.dropout=1.0 is invalid"),
    ("optim.betas=[0.9]", "two numbers"),
    ("optim.schedule=linera", "did you mean optim.schedule=linear"),
])
def test_bad_values_name_setting_and_fix(override, needle):
    assert needle in _problem(override)


def test_edges_are_allowed(tmp_path):
    cfg = compose_run("model.dropout=0.0", "optim.warmup_steps=0", "checkpointing.every_n_steps=null",
                      "checkpointing.every_minutes=5", f"paths.results_dir={tmp_path}/r", f"paths.checkpoint_dir={tmp_path}/c")
    assert check_config(cfg) == []


def test_warmup_longer_than_run_is_a_warning(tmp_path):
    cfg = compose_run("trainer.max_steps=20", f"paths.results_dir={tmp_path}/r", f"paths.checkpoint_dir={tmp_path}/c")
    (warning,) = check_config(cfg)
    assert "optim.warmup_steps=1000 >= trainer.max_steps=20" in warning


def test_unwritable_checkpoint_dir(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(NotWritableError, match="checkpoint dir .*LRA_CHECKPOINT_DIR"):
        check_config(compose_run(f"paths.results_dir={tmp_path}/r", f"paths.checkpoint_dir={tmp_path}/f/c"))


def test_override_typos_get_the_closest_key():
    with pytest.raises(ConfigError, match=r"did you mean trainer\.max_steps\?"):
        check_overrides(["trainer.max_step=5"], CONF_DIR)
    with pytest.raises(ConfigError, match=r"did you mean task=pathfinder"):
        check_overrides(["task=pathfindr"], CONF_DIR)
    check_overrides(["task=pathfinder", "task.resolution=64", "+anything.new=1", "trainer.max_steps=3"], CONF_DIR)


def test_key_of_one_swept_choice_is_known():
    check_overrides(["-m", "task=listops,pathfinder", "task.resolution=64"], CONF_DIR)


def test_suggest_prefers_siblings():
    assert suggest("optim.lrr", ["optim.lr", "model.lr_scale", "optim.weight_decay"]) == "optim.lr"
    assert suggest("zzz", ["optim.lr"]) is None


def _job(sweep, num, status=None, overrides=()):
    job = sweep / f"{num}_job"
    (job / ".hydra").mkdir(parents=True)
    if status:
        (job / STATUS_FILE).write_text(json.dumps({"num": num, "status": status, "error": "boom\nsecond line",
                                                   "overrides": ["model=tiny", *overrides]}))


def test_sweep_summary_counts_and_exits_non_zero(tmp_path, capsys):
    _job(tmp_path, 0, "finished", ["seed=0"])
    _job(tmp_path, 1, "failed", ["seed=1"])
    _job(tmp_path, 2)  # killed: no status file
    jobs, text = summarize(tmp_path)
    assert [j["status"] for j in jobs] == ["finished", "failed", "failed"]
    assert text.splitlines()[0].startswith("[sweep] 3 jobs: 1 finished, 2 failed")
    assert "failed: job 1 (seed=1): boom" in text and "second line" not in text and "killed" in text
    callback = SweepSummary()
    cfg = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    callback.on_multirun_start(cfg)
    callback.started = 0.0
    with pytest.raises(SystemExit) as info:
        callback.on_multirun_end(cfg)
    assert info.value.code == 1 and "2 failed" in capsys.readouterr().out


def test_sweep_summary_all_finished_exits_normally(tmp_path, capsys):
    _job(tmp_path, 0, "finished")
    callback = SweepSummary()
    cfg = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    callback.on_multirun_start(cfg)
    callback.started = 0.0
    callback.on_multirun_end(cfg)
    assert "1 jobs: 1 finished, 0 failed" in capsys.readouterr().out
