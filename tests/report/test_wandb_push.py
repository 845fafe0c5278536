"""The report's W&B push returns only once its run is on disk (``lra/report/wandb_push.py``).

With wandb 0.31 ``run.finish()`` returns before the offline transaction log is flushed; the push must
also shut the service down (``wandb.teardown``). A stand-in ``wandb`` module records the calls, so
this is checked deterministically (the real offline run in ``test_report.py`` only fails sometimes
without it); a stand-in without ``teardown`` stands for older wandb.
"""
from __future__ import annotations

import sys
import types

import pytest

from lra.report.wandb_push import push


class _Run:
    def __init__(self, calls: list[str], tmp) -> None:
        self.calls, self.dir, self.summary = calls, str(tmp), {}

    def log(self, payload: dict) -> None:
        self.calls.append("log:" + ",".join(sorted(payload)))

    def finish(self) -> None:
        self.calls.append("finish")


def _fake_wandb(calls: list[str], tmp, with_teardown: bool) -> types.ModuleType:
    mod = types.ModuleType("wandb")
    mod.init = lambda **kw: calls.append("init") or _Run(calls, tmp)
    mod.Table = lambda columns, data: ("table", tuple(columns), len(data))
    mod.Image = lambda path: ("image", path)
    if with_teardown:
        mod.teardown = lambda: calls.append("teardown")
    return mod


@pytest.mark.parametrize("with_teardown", [True, False], ids=["current", "older"])
def test_push_flushes_run_before_returning(tmp_path, monkeypatch, with_teardown):
    (tmp_path / "acc.csv").write_text("model,acc\nsoftmax,0.5\n")
    calls: list[str] = []
    monkeypatch.setitem(sys.modules, "wandb", _fake_wandb(calls, tmp_path, with_teardown))
    assert push(tmp_path, ["acc.csv"], project="p") == str(tmp_path)
    expected = ["init", "log:tables/acc", "finish"] + (["teardown"] if with_teardown else [])
    assert calls == expected


def test_push_tears_down_even_when_logging_fails(tmp_path, monkeypatch):
    (tmp_path / "bad.csv").write_text("a\n1\n")
    calls: list[str] = []
    fake = _fake_wandb(calls, tmp_path, True)
    fake.Table = lambda columns, data: (_ for _ in ()).throw(RuntimeError("boom"))
    monkeypatch.setitem(sys.modules, "wandb", fake)
    with pytest.raises(RuntimeError, match="boom"):
        push(tmp_path, ["bad.csv"], project="p")
    assert calls == ["init", "finish", "teardown"]
