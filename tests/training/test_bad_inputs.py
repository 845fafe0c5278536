"""Bad settings fail with a message naming the offending value and the fix."""
from __future__ import annotations

import pytest
from hydra.errors import InstantiationException
from hydra.utils import instantiate

from lra.training.train import build_network
from run import checked_dispatch
from tests.training.test_config import compose_run


def _error(fn, *overrides: str) -> str:
    cfg = compose_run(*overrides)
    with pytest.raises((ValueError, InstantiationException)) as info:
        fn(cfg)
    return str(info.value)


def test_heads_must_divide_width():
    msg = _error(build_network, "model.n_heads=3")
    assert "model.n_heads=3" in msg and "d_model=64" in msg and "divisors" in msg


@pytest.mark.parametrize("key", ["max_len", "batch_size"])
def test_non_positive_sizes(key, tmp_path):
    msg = _error(lambda c: instantiate(c.task.datamodule), f"task.{key}=0", f"paths.data_dir={tmp_path}")
    assert f"task.{key}=0" in msg and "positive" in msg


def test_non_positive_model_sizes():
    msg = _error(build_network, "model.d_model=0", "model.n_heads=1")
    assert "d_model=0" in msg


def test_unknown_mode():
    msg = _error(checked_dispatch, "mode=tran")
    assert "mode='tran'" in msg and "train, test, bench, report" in msg


def test_unknown_pooling():
    msg = _error(build_network, "model.pool=max")
    assert "model.pool='max'" in msg and "mean" in msg and "cls" in msg


def test_invalid_resume_value(tmp_path):
    msg = _error(checked_dispatch, "resume=maybe", f"paths.results_dir={tmp_path}")
    assert "resume='maybe'" in msg and "resume=auto" in msg


def test_unknown_schedule():
    from lra.training.train import build_module

    msg = _error(build_module, "optim.schedule=exp")
    assert "optim.schedule='exp'" in msg and "linear" in msg
