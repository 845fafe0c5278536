"""The README and the results pages stay short and their commands stay runnable (issue 65): every
``python run.py ...`` they show (in a bash block or in backticks) composes into a config, so a renamed
setting or preset fails here, not in a newcomer's shell; the two blocks ``.ci/run`` reads verbatim are
where it reads them."""
from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
from omegaconf import OmegaConf

from tests.conftest import ROOT
from attention.registry import CONF_DIR
from tests.training.test_config import compose_run

PAGES = [ROOT / "README.md", *sorted((ROOT / "results").glob("*/README.md"))]
LIMITS = {"README.md": 210}  # lines; a results page: RESULTS_LIMIT
RESULTS_LIMIT = 160


EXAMPLE = "attention=cosine"  # the README's skeleton variant, which a reader adds: not in conf/


def commands(page: Path) -> list[str]:
    """The run.py commands of a page: lines of its bash blocks and backticked spans, without comments;
    placeholders (``<name>``, ``[seed=<s>]``, ``$a``) and the skeleton variant left out."""
    text = page.read_text()
    found = []
    for block in re.findall(r"```bash\n(.*?)```", text, re.S):
        found += [ln.split(" #")[0].strip().rstrip("&").strip() for ln in block.splitlines()]
    found += re.findall(r"`(python run\.py[^`]*)`", text)
    return sorted({c for c in found if c.startswith("python run.py") and not any(x in c for x in "<[$")
                   and EXAMPLE not in c})


def first_job(args: list[str]) -> list[str]:
    """The overrides the first job of a sweep sees (each list's first value)."""
    return [re.sub(r"^([^=]+=)([^,\[]+),.*$", r"\1\2", a) for a in args if a != "-m"]


CASES = [(p, c) for p in PAGES for c in commands(p)]


def test_the_pages_have_commands_and_stay_short():
    assert len(CASES) > 20
    for page in PAGES:
        lines = page.read_text().count("\n")
        limit = LIMITS.get(str(page.relative_to(ROOT)), RESULTS_LIMIT)
        assert lines <= limit, f"{page.relative_to(ROOT)}: {lines} lines (at most about {limit}): move journal text to git history or docs/"


def test_ci_reads_the_install_and_test_blocks():
    text = (ROOT / "README.md").read_text()
    for heading, needle in (("## Install", "pip install"), ("## Test", "pytest")):
        section = text.split(f"\n{heading}\n", 1)[1].split("\n## ", 1)[0]
        block = re.search(r"```bash\n(.*?)```", section, re.S)
        assert block and needle in block.group(1), heading
    assert "git clone --depth 1" in text  # the shallow clone that skips the replaced checkpoints


@pytest.mark.slow  # about 0.3 s each (a Hydra compose)
@pytest.mark.parametrize("page,command", CASES, ids=[f"{p.parent.name}:{c[14:60]}" for p, c in CASES])
def test_every_command_on_the_pages_composes(page, command, tmp_path):
    """What run.py checks before any work (setting names and every sweep choice), then the first job's
    config, resolved (a fetch command: its task names, then its first task's config)."""
    from lra.checks.overrides import check_overrides
    from lra.data.fetch import TASKS

    args = shlex.split(command)[2:]
    if args and args[0].startswith("--"):
        return  # --help
    if "mode=fetch" in args:  # task= names what to fetch (all, or tasks); run_overrides would download
        (value,) = [a.split("=", 1)[1] for a in args if a.startswith("task=")]
        assert value == "all" or set(value.split(",")) <= set(TASKS), command
        args = [a for a in args if not a.startswith("task=")] + [f"task={'listops' if value == 'all' else value.split(',')[0]}"]
    check_overrides(args, CONF_DIR)
    cfg = compose_run(*first_job(args), f"paths.data_dir={tmp_path}")
    OmegaConf.to_container(cfg, resolve=True)  # every interpolation resolves
