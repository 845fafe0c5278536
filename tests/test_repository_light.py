"""The repository stays light (issue 65): a new checkpoint anywhere in the tree is ignored by git, so it
enters history only when added deliberately (``git add -f``), and the README says how to clone without
the replaced checkpoints already in history."""
from __future__ import annotations

import shutil
import subprocess

import pytest

from tests.conftest import ROOT


@pytest.mark.parametrize("path", ["best-100.ckpt", "results/xiong2021-listops-cpu/checkpoints/run/last.ckpt",
                                  "results/approximation-cpu/runs/x.ckpt", "attention/x.ckpt", "deep/er/last.ckpt"])
def test_a_new_checkpoint_is_ignored_everywhere(path):
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.skip("not a git checkout")
    proc = subprocess.run(["git", "check-ignore", "--no-index", "-q", path], cwd=ROOT, capture_output=True, timeout=30)
    assert proc.returncode == 0, f"{path} is not ignored: .gitignore keeps *.ckpt out (git add -f to add one deliberately)"
