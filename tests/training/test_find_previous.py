"""Resume picks the NEWEST unfinished record of an identity (lra/training/resume.py find_previous),
and the newest finished one, by start time, whatever the file names' order: an older unfinished
record is an earlier attempt whose checkpoint a later attempt has already gone past."""
from __future__ import annotations

from lra.records import RunRecord
from lra.training.resume import find_previous

KEY = "abc123"


def record(results, run_id: str, started_at: str, status: str, key: str = KEY) -> None:
    rec = RunRecord(results, mode="train", task="listops", attention="softmax", seed=0, config={}, run_id=run_id)
    rec.data.update(run_key=key, started_at=started_at, status=status, pid=None)
    rec.write()


def test_the_newest_unfinished_and_the_newest_finished_are_found(tmp_path):
    # file names sort the other way round from the start times
    record(tmp_path, "c-oldest", "2026-12-01T08:00:00+00:00", "interrupted")
    record(tmp_path, "b-newest", "2026-12-01T10:00:00+00:00", "failed")
    record(tmp_path, "a-middle", "2026-12-01T09:00:00+00:00", "interrupted")
    record(tmp_path, "z-done-old", "2026-11-30T08:00:00+00:00", "finished")
    record(tmp_path, "y-done-new", "2026-11-30T09:00:00+00:00", "finished")
    record(tmp_path, "x-other", "2026-12-01T11:00:00+00:00", "interrupted", key="other")
    unfinished, finished = find_previous(tmp_path, KEY)
    assert unfinished["run_id"] == "b-newest"
    assert finished["run_id"] == "y-done-new"


def test_nothing_to_resume(tmp_path):
    record(tmp_path, "a", "2026-12-01T08:00:00+00:00", "finished", key="other")
    assert find_previous(tmp_path, KEY) == (None, None)
