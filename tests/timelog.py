"""Where the suite's time goes: one line per test, appended to ``$LRA_TEST_TIMELOG`` as it ends.

    LRA_TEST_TIMELOG=/tmp/times.tsv PYTEST_ADDOPTS="-p tests.timelog" python -m pytest -n 2 --dist loadgroup tests
    sort -t$'\\t' -k3 -rn /tmp/times.tsv | head -30     # the 30 costliest tests in CPU

Columns: start (Unix time), wall seconds, CPU seconds, worker, node id. CPU is the test's own plus
that of the child processes it reaped while it ran, so it hardly depends on the machine's load (wall
does); a module-wide fixture is charged to the test that built it. Processes that outlive a test
(Inductor's compile workers, a run server reaped at module teardown) are charged when reaped, or not
at all: compare the sum with the whole run's ``/usr/bin/time``.
"""
from __future__ import annotations

import os
import resource
import time

import pytest

_started: dict[str, tuple[float, float, float]] = {}


def _cpu() -> float:
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    _started[item.nodeid] = (time.time(), time.perf_counter(), _cpu())


@pytest.hookimpl(trylast=True)
def pytest_runtest_logfinish(nodeid: str, location: tuple) -> None:
    start, wall, cpu = _started.pop(nodeid, (None, 0.0, 0.0))
    if start is None:
        return
    line = (f"{start:.3f}\t{time.perf_counter() - wall:.3f}\t{_cpu() - cpu:.3f}\t"
            f"{os.environ.get('PYTEST_XDIST_WORKER', '-')}\t{nodeid}\n")
    with open(os.environ["LRA_TEST_TIMELOG"], "a") as log:
        log.write(line)
