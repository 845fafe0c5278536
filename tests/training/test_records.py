"""Run records are written atomically and never overwrite another run's record."""
from __future__ import annotations

import json

import pytest

from lra.files import write_json
from lra.records import RunRecord, load_records


def _record(tmp_path, **kw):
    return RunRecord(tmp_path / "results", mode="train", task="listops", attention="softmax", seed=0, config={"a": 1}, **kw)


def test_record_lifecycle(tmp_path):
    rec = _record(tmp_path)
    path = rec.write()
    assert json.loads(path.read_text())["status"] == "running"
    rec.update(metrics={"test_acc": 0.5})
    rec.finish()
    data = json.loads(path.read_text())
    assert data["status"] == "finished" and data["metrics"]["test_acc"] == 0.5
    assert data["stamp"]["torch"] and data["finished_at"]
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".")]  # no temp files left


def test_never_overwrites_another_record(tmp_path):
    a = _record(tmp_path, run_id="same")
    a.write()
    b = _record(tmp_path, run_id="same")
    with pytest.raises(FileExistsError):
        b.write()
    assert json.loads(a.path.read_text())["config"] == {"a": 1}


def test_unique_ids_for_concurrent_runs(tmp_path):
    paths = {_record(tmp_path).write() for _ in range(5)}
    assert len(paths) == 5


def test_unknown_status_rejected(tmp_path):
    with pytest.raises(ValueError, match="unknown run status"):
        _record(tmp_path).finish("weird")


def test_malformed_records_are_named_and_skipped(tmp_path):
    _record(tmp_path).finish()
    runs = tmp_path / "results" / "runs"
    (runs / "broken.json").write_text("{not json")
    write_json(runs / "partial.json", {"run_id": "x"})
    records, problems = load_records(tmp_path / "results")
    assert len(records) == 1
    assert any(p.startswith("broken.json") for p in problems) and any(p.startswith("partial.json") for p in problems)


def test_unwritable_results_dir_names_path(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    with pytest.raises(PermissionError, match=str(blocker / "results")):
        RunRecord(blocker / "results", mode="train", task="t", attention="a", seed=0, config={})


@pytest.mark.parametrize("exc,status", [(FloatingPointError("nan at step 3"), "diverged"),
                                        (KeyboardInterrupt("stopped by SIGTERM"), "interrupted"),
                                        (RuntimeError("boom"), "failed")])
def test_outcome_records_how_work_ended(tmp_path, exc, status):
    rec = _record(tmp_path)
    rec.write()
    with pytest.raises(type(exc)):
        with rec.outcome():
            raise exc
    data = json.loads(rec.path.read_text())
    assert data["status"] == status and str(exc) in data["error"] and data["finished_at"]
