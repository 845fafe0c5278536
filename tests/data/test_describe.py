"""``python -m lra.data.describe``: a ListOps test-set description built from the data a results folder's
runs used, and the structure it reads from each expression (outermost operator, operator depth)."""
from __future__ import annotations

import json

import numpy as np
import pytest

from lra.data import layout
from lra.data.cache import load_split
from lra.data.describe import describe_folder, main
from lra.data.listops import ListOpsDataModule, operator_depth, outer_operator, read_tsv
from lra.records import description_file, load_descriptions
from lra.report.diagnostics import parse_test_set
from tests.report.fabricate import Results

GEN = {"n_train": 40, "n_val": 8, "n_test": 8, "min_length": 5, "max_length": 40}


@pytest.mark.parametrize("source, op, depth", [
    ("[MAX 1 2 ]", "MAX", 1),
    ("( ( ( [SM 4 ) 3 ) ] )", "SM", 1),                              # the TSV's binarised form
    ("[MIN [MED 1 [MAX 2 3 ] 4 ] 5 [SM 6 7 ] ]", "MIN", 3),
    ("( ( [MED ( ( [MIN 1 ) 2 ) ] ) ] )", "MED", 2),
])
def test_outermost_operator_and_depth(source, op, depth):
    assert outer_operator(source) == op and operator_depth(source) == depth


def test_a_bare_digit_has_no_outermost_operator():
    assert operator_depth("7") == 0
    with pytest.raises(ValueError, match="no outermost operator"):
        outer_operator("7")


def _folder(tmp_path, **data_fields):
    """A results folder with one ListOps record whose config names the tiny generated data."""
    res = Results(tmp_path / "results", n_test=8)
    changes = {"task__datamodule__generator": GEN, "task__max_len": 48, "task__datamodule__max_len": 48}
    rec = res.train("softmax", 0, changes=changes, **data_fields)
    rec["config"]["task"]["datamodule"].update({"_target_": "lra.data.listops.ListOpsDataModule", "source": "generate",
                                                "tokenization": "lra"})
    res.write(rec)
    return res


def test_the_description_is_the_test_split_of_the_runs_data(tmp_path, capsys):
    res = _folder(tmp_path)
    [path] = describe_folder(res.root, tmp_path / "data")
    dm = ListOpsDataModule(str(tmp_path / "data"), max_len=48, generator=GEN)
    assert path == description_file(res.root, "listops", dm.fingerprint)     # named by the data's fingerprint
    d = json.loads(path.read_text())
    test = list(read_tsv(dm.tsv_dir() / layout.LISTOPS_FILES["test"]))
    train = list(read_tsv(dm.tsv_dir() / layout.LISTOPS_FILES["train"]))
    _, lengths, labels = load_split(dm.cache_dir, "test")
    assert d["operator"] == [outer_operator(s) for s, _ in test] and d["depth"] == [operator_depth(s) for s, _ in test]
    assert d["label"] == labels.tolist() == [t for _, t in test] and d["length"] == lengths.tolist()
    assert sum(map(sum, d["train_label_counts"].values())) == 40
    for op, counts in d["train_label_counts"].items():
        assert counts == np.bincount([t for s, t in train if outer_operator(s) == op], minlength=10).tolist()
    assert d["settings"] == {"max_len": 48, "source": "generate", "tokenization": "lra",
                             "generator": dict(sorted({**dm.gen}.items()))}
    [(name, content)] = load_descriptions(res.root, "listops")[0]
    assert parse_test_set(name, content).n == 8                          # what the report reads back
    before = path.read_bytes()
    main([str(res.root), "--data-dir", str(tmp_path / "data")])           # the command again: the same bytes
    assert path.read_bytes() == before
    assert "0 record(s) carry this fingerprint, 1 ListOps record(s) carry none" in capsys.readouterr().out


def test_a_folder_without_listops_runs_is_a_user_error(tmp_path, capsys):
    res = Results(tmp_path / "results")
    res.train("softmax", 0, task="text")
    with pytest.raises(SystemExit) as exit_:
        main([str(res.root), "--data-dir", str(tmp_path / "data")])
    assert exit_.value.code == 2
    assert "no ListOps run record (task=listops) to describe" in capsys.readouterr().err
