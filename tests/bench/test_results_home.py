"""One home for where records go (lra/files.py FOLDERS): run.py's paths (conf/config.yaml) and
``python -m lra.bench`` with every protocol read the same table, so ``$LRA_RESULTS_DIR`` is honoured
everywhere and nothing lands in the repository's results/ unasked."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from lra import CONF_DIR, ROOT
from lra.files import FOLDERS, default_dir

TINY_APPROXIMATION = ["--protocol", "approximation", "--variants", "local", "--lengths", "32", "--inputs", "gauss-flat",
                      "--draws", "1", "--tv-draws", "1", "--tv-max-len", "32", "--no-time"]


def files_under(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def test_run_py_paths_read_the_same_table() -> None:
    paths = OmegaConf.load(CONF_DIR / "config.yaml").paths
    for key, (env, fallback) in FOLDERS.items():
        assert OmegaConf.to_container(paths)[key] == f"${{oc.env:{env},{fallback}}}", key


def test_default_dir_honours_the_environment(monkeypatch, tmp_path) -> None:
    monkeypatch.delenv("LRA_RESULTS_DIR", raising=False)
    assert default_dir("results_dir") == Path("results")
    monkeypatch.setenv("LRA_RESULTS_DIR", str(tmp_path))
    assert default_dir("results_dir") == tmp_path


def test_approximation_writes_only_under_lra_results_dir(monkeypatch, tmp_path) -> None:
    from lra.bench import approximation

    results, cwd = tmp_path / "results-here", tmp_path / "cwd"
    cwd.mkdir()
    monkeypatch.chdir(cwd)
    monkeypatch.setenv("LRA_RESULTS_DIR", str(results))
    repo_before = files_under(ROOT / "results")
    threads = torch.get_num_threads()
    try:
        assert approximation.main(TINY_APPROXIMATION) == 0
    finally:
        torch.set_num_threads(threads)
    written = files_under(tmp_path)
    assert written and all(p.is_relative_to(results / "runs") for p in written), written
    assert files_under(ROOT / "results") == repo_before


@pytest.mark.slow  # a fresh interpreter (imports): about 4 s
def test_python_m_lra_bench_approximation_honours_lra_results_dir(tmp_path) -> None:
    results, cwd = tmp_path / "empty", tmp_path / "cwd"
    results.mkdir()
    cwd.mkdir()
    env = {**os.environ, "LRA_RESULTS_DIR": str(results), "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "lra.bench", *TINY_APPROXIMATION], cwd=cwd, env=env, check=True,
                   capture_output=True, timeout=300)
    written = files_under(tmp_path)
    assert len(written) == 1 and written[0].parent == results / "runs", written
