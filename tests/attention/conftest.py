"""``attention_mode``: the reference tests run eager and graph-safe. (The settings grid's summary line is
printed by ``tests/conftest.py``, which also sees the parallel workers' times.)"""
from __future__ import annotations

from typing import Iterator

import pytest

from attention.graph_safe import graph_safe


@pytest.fixture(params=["eager", "graph_safe"])
def attention_mode(request: pytest.FixtureRequest) -> Iterator[str]:
    """Runs a test twice: as is, and with every attention forward graph-safe (no host read,
    counter-based random draws: what ``torch.compile`` traces). Reference test modules opt in with
    ``pytestmark = pytest.mark.usefixtures("attention_mode")``."""
    with graph_safe(request.param == "graph_safe"):
        yield request.param
