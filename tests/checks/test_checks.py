"""lra/checks/ in-process (fast); tests/training/test_user_errors.py runs the same checks through
run.py as a user meets them."""
from __future__ import annotations

import re

import pytest

from attention.registry import CONF_DIR
from lra.badinput import ConfigError, NotWritableError
from lra.checks.config import MODES, check_config
from lra.checks.overrides import check_overrides, suggest
from lra.training.usage import MODE_HELP
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


@pytest.mark.parametrize("arg", ["model.graph_safe=true", "+model.graph_safe=false"])
def test_a_retired_setting_gets_the_one_line_that_says_what_replaced_it(arg):
    with pytest.raises(ConfigError, match=r"^model\.graph_safe is gone \(issue 62\): every attention variant has one "
                                          r"path.*drop the setting$"):
        check_overrides([arg], CONF_DIR)


def test_key_of_one_swept_choice_is_known():
    check_overrides(["-m", "task=listops,pathfinder", "task.resolution=64"], CONF_DIR)


def test_suggest_prefers_siblings():
    assert suggest("optim.lrr", ["optim.lr", "model.lr_scale", "optim.weight_decay"]) == "optim.lr"
    assert suggest("zzz", ["optim.lr"]) is None


def test_the_modes_agree_and_fetch_is_refused_through_hydra():
    """conf/config.yaml's comment, --help and the check list the same modes; mode=fetch runs before
    Hydra (run.py), so one that reached Hydra (quoted, swept, in a preset) is a user error."""
    comment = re.search(r"^mode: \w+ +# (.*?) \(", (CONF_DIR / "config.yaml").read_text(), re.M).group(1)
    assert tuple(comment.split(" | ")) == tuple(MODE_HELP) == MODES
    assert "mode=fetch starts no run" in _problem("mode=fetch")
