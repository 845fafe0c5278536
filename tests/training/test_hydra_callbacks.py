"""The Hydra callbacks of a sweep in-process (fast): the finished/skipped/failed summary and its exit
status (lra/training/hydra_callbacks.py)."""
from __future__ import annotations

import json

import pytest
from omegaconf import OmegaConf

from lra.training.hydra_callbacks import STATUS_FILE, SweepSummary, summarize


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
