"""The report pools runs only when their code behaves alike (their behavioural fingerprints agree,
lra/report/cells.py), and its cells list every commit their stretches ran on."""
from __future__ import annotations

from lra.report.cells import accuracy_groups
from lra.report.screening import screen
from tests.report.fabricate import Results

A = {"version": 1, "losses": [2.3, 1.8], "logits": [0.5, -0.25]}
A_NOISE = {"version": 1, "losses": [2.3 + 1e-7, 1.8], "logits": [0.5, -0.25 - 1e-7]}  # another thread count
B = {"version": 1, "losses": [2.3, 1.9], "logits": [0.5, -0.25]}  # an edit that changed the numbers


def rows(res: Results) -> dict:
    runs, ledger = screen(res.root, "test_acc")
    return {(g.custom, k): c["listops"] for g in accuracy_groups(runs, ledger) for k, c in g.rows.items()}, ledger


def test_agreeing_fingerprints_pool_and_a_record_without_one_joins_them(tmp_path):
    res = Results(tmp_path)
    res.train("softmax", 0, 80, fingerprint=A, data_fingerprint="d")
    res.train("softmax", 1, 84, fingerprint=A_NOISE, data_fingerprint="d")
    res.train("softmax", 2, 88)  # from before fingerprints
    cells, _ = rows(res)
    assert [c.n for c in cells.values()] == [3]


def test_code_that_behaves_differently_is_another_cell_even_for_the_same_seed(tmp_path):
    res = Results(tmp_path)
    old = [res.train("softmax", s, k, fingerprint=A, data_fingerprint="d") for s, k in ((0, 80), (1, 84))]
    new = res.train("softmax", 0, 40, fingerprint=B, data_fingerprint="d")  # edited code, seed 0 again
    cells, ledger = rows(res)
    assert not ledger.excluded  # not a superseded duplicate: another experiment
    main = cells[(False, ("softmax", ()))]
    assert sorted(r.run_id for r in main.runs.values()) == sorted(r["run_id"] for r in old)
    ((custom, key), other), = [(k, c) for k, c in cells.items() if k[0]]
    assert [r.run_id for r in other.runs.values()] == [new["run_id"]]
    assert "code that behaves differently (training loss of step 2: 1.9 against 1.8, the row's)" in key[1][-1]


def test_a_cell_lists_the_commits_of_every_stretch(tmp_path):
    res = Results(tmp_path)
    segments = [{"git_commit": "1111111111aa"}, {"git_commit": "2222222222bb", "dirty": True, "diff_sha1": "abcdef0123"}]
    res.train("softmax", 0, 80, commit="1111111111aa", efficiency={"wall": {"segments": segments}})
    res.train("softmax", 1, 84, commit="3333333333cc")
    (cell,), _ = rows(res)[0].values(), None
    assert cell.commits == ["1111111111", "2222222222+abcdef01", "3333333333"]
    md, files, _ = res.report()
    assert "(3 commits)" in md
    (cells_csv,) = [text for name, text in files.items() if name.startswith("tables/cells_") and name.endswith(".csv")]
    assert "1111111111;2222222222+abcdef01;3333333333" in cells_csv


def test_a_new_record_without_its_data_fingerprint_is_excluded(tmp_path):
    res = Results(tmp_path)
    res.train("softmax", 0, 80, fingerprint=A, run_id="no-data")
    res.train("softmax", 1, 80, fingerprint={**A, "backfilled": {"commits": {}}}, run_id="backfilled")
    cells, ledger = rows(res)
    assert {e.file: e.reason for e in ledger.excluded}.get("no-data.json", "").endswith("names the data it trained on")
    assert [r.run_id for c in cells.values() for r in c.runs.values()] == ["backfilled"]
