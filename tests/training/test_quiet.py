"""Known third-party noise is filtered in one place (lra/training/quiet.py), each entry with its
reason, and only that: a short run prints no third-party deprecation warning, the suite's own
warnings still show. And the forecast prices a step at what it costs the run (lra/training/forecast.py)."""
from __future__ import annotations

import logging
import warnings
from types import SimpleNamespace

import pytest

from lra.training.forecast import RunForecast
from lra.training.quiet import KNOWN, quiet_third_party
from tests.conftest import TINY_LISTOPS

NOISE = ("deprecated", "LeafSpec", "litlogger", "weights_only", "on_before_batch_transfer", "not resumable")


def test_every_known_entry_has_a_reason_and_is_filtered(caplog):
    quiet_third_party()
    assert all(len(k.reason) > 40 for k in KNOWN)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        quiet_third_party()  # after "always": the known ones are ignored all the same
        warnings.warn("`isinstance(treespec, LeafSpec)` is deprecated, use ...", FutureWarning)
        warnings.warn("You have overridden `on_before_batch_transfer` in `LightningModule` but have passed in a "
                      "`LightningDataModule`. It will use the implementation from `LightningModule` instance.")
        warnings.warn("some other library's deprecation", DeprecationWarning)
    assert [str(w.message) for w in seen] == ["some other library's deprecation"]
    with caplog.at_level(logging.INFO):
        logging.getLogger("pytorch_lightning.utilities.rank_zero").info("💡 Tip: For seamless cloud logging, ...")
        logging.getLogger("pytorch_lightning.utilities.rank_zero").info("GPU available: False, used: False")
        logging.getLogger("lra.training.train").warning("the suite's own warning")
    assert [r.getMessage() for r in caplog.records] == ["GPU available: False, used: False", "the suite's own warning"]


def test_a_step_costs_what_it_costs_the_run(monkeypatch):
    """Timed from one step's end (or the validation's) to the next one's: loading the batch counts,
    the validation does not."""
    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr("lra.training.forecast.time", SimpleNamespace(perf_counter=lambda: clock.now))
    f = RunForecast("quick", skip=0)
    trainer = SimpleNamespace(global_step=0, sanity_checking=False, state=SimpleNamespace(fn="fit"))
    for start, end in ((0.0, 1.0), (3.0, 4.0)):          # 2 s of data loading before the second step
        clock.now = start
        f.on_train_batch_start(trainer)
        clock.now = end
        f.on_train_batch_end(trainer)
    clock.now = 4.0
    f.on_validation_start(trainer, None)
    clock.now = 10.0
    f.on_validation_end(trainer, None)
    for start, end in ((10.5, 11.0),):                   # after the validation: from its end
        clock.now = start
        f.on_train_batch_start(trainer)
        clock.now = end
        f.on_train_batch_end(trainer)
    assert list(f.step_times) == [1.0, 3.0, 1.0] and f.val_seconds == 6.0


@pytest.mark.slow  # one forked run.py: about 3 s
def test_a_short_run_prints_no_third_party_noise(cli):
    out = cli(*TINY_LISTOPS, "trainer.max_steps=4", "task.val_every=2", "checkpointing.every_n_steps=2",
              "optim.warmup_steps=0", "trainer.log_every_n_steps=1")
    text = out.stdout + out.stderr
    assert "run record:" in text
    assert not [n for n in NOISE if n in text], text[-3000:]
