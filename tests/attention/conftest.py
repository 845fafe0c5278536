"""Prints the settings grid's size and time when its tests ran (tests/attention/test_reference_grid.py)."""
from __future__ import annotations

from typing import Iterator

import pytest

from attention.graph_safe import graph_safe
from tests.attention.settings_grid import TIMES, every_config, grid


def pytest_terminal_summary(terminalreporter) -> None:  # noqa: ANN001 - pytest's hook
    if not TIMES:
        return
    ran = sum(len(t) for t in TIMES.values())
    total = sum(len(grid(c)) for c in every_config())
    secs = sum(sum(t) for t in TIMES.values())
    slowest = sorted(TIMES, key=lambda c: -sum(TIMES[c]))[:3]
    terminalreporter.write_line(
        f"settings grid: {ran} point runs ({total} points, each eager and graph-safe) over {len(TIMES)} configs in {secs:.1f} s "
        f"(slowest: {', '.join(f'{c} {len(TIMES[c])} points {sum(TIMES[c]):.1f} s' for c in slowest)})")


@pytest.fixture(params=["eager", "graph_safe"])
def attention_mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs a test twice: as is, and with every attention forward graph-safe (no host read,
    counter-based random draws: what ``torch.compile`` traces). Reference test modules opt in with
    ``pytestmark = pytest.mark.usefixtures("attention_mode")``."""
    with graph_safe(request.param == "graph_safe"):
        yield request.param
