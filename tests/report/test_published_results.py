"""The result folders shipped in ``results/``: their committed report is exactly what
``python run.py mode=report`` builds from their committed records, byte for byte. A report-code change
that alters a published table fails here until the folder's report is rebuilt and committed with it."""
from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import ROOT

PUBLISHED = sorted(p.parent for p in (ROOT / "results").glob("*/report.md"))
# Folders whose report also reads another folder's records (report.also), as their README's command says
ALSO = {"xiong2021-spt-listops-cpu": ["xiong2021-listops-cpu"]}


def report_files(folder: Path) -> dict[str, bytes]:
    """What a report writes (report.md, excluded.csv, tables/, plots/), by path relative to ``folder``."""
    paths = [folder / "report.md", folder / "excluded.csv", *(folder / "tables").glob("*"), *(folder / "plots").glob("*")]
    return {str(p.relative_to(folder)): p.read_bytes() for p in paths if p.is_file()}


def test_results_ships_a_published_folder():
    assert [p.name for p in PUBLISHED] == ["approximation-cpu", "efficiency-h200", "linear-unnormalised-listops-cpu",
                                          "xiong2021-listops-cpu", "xiong2021-listops-h200", "xiong2021-spt-listops-cpu"]


@pytest.mark.slow
@pytest.mark.parametrize("folder", PUBLISHED, ids=lambda p: p.name)
def test_the_committed_report_is_rebuilt_byte_for_byte(folder, tmp_path, cli):
    also = [f"report.also=[{','.join(str(folder.parent / a) for a in ALSO[folder.name])}]"] if folder.name in ALSO else []
    cli("mode=report", f"report.results_dir={folder}", f"report.out_dir={tmp_path}", *also)
    built, committed = report_files(tmp_path), report_files(folder)
    assert sorted(built) == sorted(committed)
    differ = [name for name in built if built[name] != committed[name]]
    assert not differ, (f"{folder.name}: rebuild the report (python run.py mode=report paths.results_dir=results/{folder.name}"
                       f"{''.join(' ' + a for a in also)}); differs: {differ}")
