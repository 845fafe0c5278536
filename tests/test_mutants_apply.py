"""Every mutant of ``python -m tests.mutation`` still applies: its snippet occurs exactly once in its
file. A refactor that moves the planted line would otherwise leave the mutation check broken until
someone runs it (two mutants were found so on 2026-12-01)."""
from __future__ import annotations

import pytest

from tests.mutants import all_mutants
from tests.mutation import ROOT

MUTANTS = all_mutants()


def test_mutant_names_are_unique():
    names = [m.name for m in MUTANTS]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)


@pytest.mark.parametrize("file", sorted({m.file for m in MUTANTS}))
def test_every_mutant_of_a_file_applies(file):
    text = (ROOT / file).read_text()
    stale = [f"{m.name} ({text.count(m.old)} occurrences)" for m in MUTANTS if m.file == file and text.count(m.old) != 1]
    assert not stale, f"{file}: each snippet must occur exactly once; update tests/mutants/ for: {', '.join(stale)}"
