"""Adding a variant is one Python file and one YAML (issue 62 item 3): the README's skeleton (its
"Adding a variant" section: a module with its spec, a YAML) and a plain copy of
``conf/attention/softmax.yaml`` under a new name are written into a scratch copy of the repository
(tracked files; without git, the folders the mutation check copies), with no other edit, and the
tests a new variant meets there (those parametrised by variant name, and those over every config)
run in a fresh process: they must pass. A variant whose spec lacks a field fails with one line
naming the field and the file, in the tests and in the approximation map."""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

NEW = ("cosine", "softmax_copy")   # the README's skeleton and the plain copy of softmax.yaml
# The tests a new variant meets, narrowed by -k to the new names and to the tests over every config
# (about 50 s with the copy, on one loaded core; the whole fast loop in such a copy was run green once).
TESTS = ("tests/attention/test_specs.py", "tests/attention/test_settings_fuzz.py", "tests/bench/test_approximation.py",
         "tests/attention/test_attention_contract.py", "tests/attention/test_padding.py",
         "tests/attention/test_determinism.py", "tests/attention/test_fuzz_attention.py",
         "tests/training/test_pretraining.py", "tests/attention/test_pooling_reach.py",
         "tests/attention/test_attention_bf16.py")
SELECT = " or ".join([*NEW, "every_config", "grid_tables", "incomplete_spec"])
COPIED = ("attention", "models", "lra", "tests", "conf", "docs", "run.py", "pyproject.toml", "README.md")


def skeleton(readme: Path = ROOT / "README.md") -> dict[str, str]:
    """The README's "Adding a variant" blocks by the path their first line names."""
    section = readme.read_text().split("\n## Adding a variant\n", 1)[1].split("\n## ", 1)[0]
    files = {}
    for body in re.findall(r"```(?:python|yaml)\n(.*?)```", section, re.S):
        files[body.splitlines()[0].lstrip("# ").split()[0]] = body
    return files


def scratch_copy(dest: Path) -> None:
    """The repository's tracked files (results/ left out: no test here reads it) copied to ``dest``."""
    try:
        out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True).stdout
        tracked = [p for p in out.decode().split("\0") if p and not p.startswith("results/")]
    except (OSError, subprocess.CalledProcessError):   # a copy without git (the mutation check's)
        tracked = [str(p.relative_to(ROOT)) for name in COPIED for p in ((ROOT / name).rglob("*")
                   if (ROOT / name).is_dir() else [ROOT / name]) if p.is_file() and "__pycache__" not in p.parts]
    for rel in tracked:
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


def _run(cwd: Path, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(cwd), "OMP_NUM_THREADS": "1", "PYTHONDONTWRITEBYTECODE": "1",
           "WANDB_MODE": "offline"}
    return subprocess.run([sys.executable, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    dest = tmp_path_factory.mktemp("repo")
    scratch_copy(dest)
    files = skeleton()
    assert set(files) == {"attention/cosine.py", "conf/attention/cosine.yaml"}, sorted(files)
    for rel, text in files.items():
        (dest / rel).write_text(text)
    shutil.copy2(ROOT / "conf" / "attention" / "softmax.yaml", dest / "conf" / "attention" / "softmax_copy.yaml")
    return dest


def test_a_new_variant_and_a_copied_config_pass_their_tests_with_no_other_edit(repo):
    proc = _run(repo, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-o", "addopts=", "-m", "not slow",
                *TESTS, "-k", SELECT)
    tail = "\n".join((proc.stdout + proc.stderr).splitlines()[-40:])
    assert proc.returncode == 0, tail
    ran = re.search(r"(\d+) passed", proc.stdout)
    assert ran and int(ran.group(1)) >= 40, tail
    for name in NEW:   # the new names were among them
        assert _run(repo, "-m", "pytest", "-q", "--co", "-p", "no:cacheprovider", "-o", "addopts=",
                    "tests/attention/test_specs.py", "-k", name).stdout.count(f"[{name}]") >= 2, name


def test_a_spec_without_knobs_fails_with_one_line_naming_the_field_and_the_file(repo):
    module = repo / "attention" / "cosine.py"
    original = module.read_text()
    module.write_text(re.sub(r"knobs=\(\), ", "", original, count=1))
    try:
        line = "attention/cosine.py: CosineAttention.spec lacks 'knobs' (the approximation map's budget axes; () for none)"
        proc = _run(repo, "-m", "pytest", "-q", "-n", "0", "-p", "no:cacheprovider", "-o", "addopts=",
                    "tests/attention/test_specs.py::test_spec_is_complete")
        assert proc.returncode == 1 and line in proc.stdout, proc.stdout[-2000:]
        proc = _run(repo, "-m", "lra.bench", "--protocol", "approximation", "--variants", "cosine", "--no-time")
        assert proc.returncode == 2 and line in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    finally:
        module.write_text(original)
