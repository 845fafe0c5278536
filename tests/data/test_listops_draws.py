"""A small ListOps request draws only what it needs (the stream is read lazily), keeps exactly the
prefix a large parallel request gives, and long data work prints count/total progress lines."""
from __future__ import annotations

import lra.data.listops as listops
from lra.data.progress import Progress


def test_small_request_stops_drawing_at_the_last_needed_expression(monkeypatch):
    draws = []
    real = listops.generate_one

    def counting(*args, **kwargs):
        draws.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(listops, "generate_one", counting)
    rows = listops.generate(40, seed=2, min_length=5, max_length=60, workers=1, chunk_draws=5000)
    assert len(rows) == 40 and len(draws) < 1000  # ~480: not the whole 5000-draw chunk
    draws.clear()
    monkeypatch.setattr(listops, "generate_one", real)
    big = listops.generate(2100, seed=2, min_length=5, max_length=60, workers=2, chunk_draws=600)
    assert big[:40] == rows  # the same stream: a request's split does not depend on its size


def test_progress_lines_say_count_total_and_rate(capsys, monkeypatch):
    clock = iter([0.0, 5.0, 12.0, 13.0, 30.0])
    monkeypatch.setattr("lra.data.progress.time.perf_counter", lambda: next(clock))
    shown = Progress("[listops] generating", 1000, "expressions", every_s=10)
    shown.update(100)  # t=5: too soon
    shown.update(240)  # t=12: a line
    shown.update(300)  # t=13: too soon after the last line
    shown.finish()     # t=30
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines == ["[listops] generating: 240/1000 expressions (20/s, eta 38s)",
                     "[listops] generating: 300/1000 expressions in 30s (10/s)"]
