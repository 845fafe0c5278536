"""``trainer.compile_limit=0`` is refused, never read as the default 32: by the config check before
any work (lra/checks/config.py) and by the compile callback itself (lra/training/compile.py)."""
from __future__ import annotations

import pytest
from omegaconf import OmegaConf

from lra.badinput import ConfigError
from lra.checks.config import RULES
from lra.training.compile import trainer_settings


def test_the_callback_refuses_zero_and_keeps_a_given_limit():
    with pytest.raises(ValueError, match=r"trainer.compile_limit=0 must be >= 1"):
        trainer_settings(OmegaConf.create({"compile": True, "compile_limit": 0}))
    _, callback = trainer_settings(OmegaConf.create({"compile": True, "compile_limit": 5}))
    assert callback.limit == 5
    _, callback = trainer_settings(OmegaConf.create({"compile": True, "compile_limit": None}))
    assert callback.limit == 32


def test_the_config_check_refuses_zero():
    from lra.checks import config as checks

    (rule,) = [r for r in RULES if r.key == "trainer.compile_limit"]
    assert rule.problem(0) and rule.problem(-1) and rule.problem(1) is None
    cfg = OmegaConf.create({"mode": "train", "trainer": {"compile_limit": 0}})
    with pytest.raises(ConfigError, match=r"trainer.compile_limit=0 is invalid: it must be a whole number >= 1"):
        checks.check_config(cfg)
