"""Every results folder a report test builds also has its exports checked cell by cell (issue 34,
case 7): Markdown, LaTeX and CSV must be renderings of the same table model."""
from __future__ import annotations

from pathlib import Path

import pytest

from lra.report.build import build_tables
from tests.report.exports import check_exports


def results_folders(root: Path) -> list[Path]:
    return sorted(p.parent for p in root.rglob("runs") if p.is_dir() and any(p.glob("*.json")))


@pytest.fixture(autouse=True)
def exports_agree(tmp_path: Path):
    yield
    for folder in results_folders(tmp_path):
        tables = build_tables(folder, plots=False)[0]
        for table in tables:
            check_exports(table)
