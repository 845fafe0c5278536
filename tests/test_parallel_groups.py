"""The README's parallel test command groups what must share a worker (``tests/conftest.py``: tests
of a module-wide fixture, the ``ddp`` and ``inductor`` groups). pytest-xdist's ``--dist loadgroup``
can stop grouping without a word when pytest changes under it (pytest 9.2 with pytest-xdist 3.8:
pytest-dev/pytest-xdist#1386): every shared fixture is then built on both workers and DDP tests race
for ports. A throwaway suite of two groups runs on two workers here and must keep each group on one."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict

import pytest

GROUPED = '''
import pytest

@pytest.mark.xdist_group("first")
@pytest.mark.parametrize("i", range(4))
def test_first(i):
    pass

@pytest.mark.xdist_group("second")
@pytest.mark.parametrize("i", range(4))
def test_second(i):
    pass
'''


@pytest.mark.slow
def test_loadgroup_keeps_each_group_on_one_worker(tmp_path):
    (tmp_path / "test_grouped.py").write_text(GROUPED)
    # a pytest of its own: not this run's options or plugins (PYTEST_ADDOPTS), nor its worker's identity
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_")}
    proc = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadgroup",
                           "-v", "test_grouped.py"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    workers = defaultdict(set)
    for worker, test in re.findall(r"\[(gw\d)\] \[\s*\d+%\] PASSED \S+::(test_\w+)\[", proc.stdout):
        workers[test].add(worker)
    assert sorted(workers) == ["test_first", "test_second"], proc.stdout[-3000:]
    assert all(len(w) == 1 for w in workers.values()), (
        f"--dist loadgroup split the groups over workers ({dict(workers)}): this pytest and pytest-xdist do "
        f"not group together (pytest-dev/pytest-xdist#1386); install the tested pair: "
        f"pip install -c constraints.txt pytest pytest-xdist")
