"""Retrieval (AAN): the official TSV conventions (no header, 5 TAB fields, quoting disabled, float
label, bytes kept), corrupt rows reported with file:line, two documents per example, run.py."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from lra.badinput import BadInput, BadInputError
from lra.data.bytes import decode
from lra.data.layout import AAN_FILES
from lra.data.retrieval import RetrievalDataModule, read_tsv

FIXTURE = Path(__file__).parents[1] / "fixtures" / "aan_small.tsv"


def test_tsv_quotes_are_plain_characters_and_bad_rows_are_reported():
    bad = BadInput("aan", max_fraction=1.0)
    rows = list(read_tsv(FIXTURE, bad))
    assert [r[0] for r in rows] == [1, 0, 0, 1]  # float labels "1.0" / "0.0" and ints accepted
    assert rows[0][1] == b'We use "quoted phrases and an unbalanced " quote.'
    assert rows[0][2] == b"The cited paper's \"model\" works."
    # quoting disabled: a quote does not protect the TAB, so these are two fields (a CSV reader with
    # quoting would merge them into one and see 4 fields)
    assert rows[1][1:] == (b'"Starts with a quote', b'ends with a quote"')
    assert rows[2][1] == b"bytes \xff\xfe kept as they are" and rows[2][2] == b'doc "two" with CRLF ending'
    assert len(bad.records) == 2
    assert bad.records[0].startswith(f"{FIXTURE}:3: expected 5 TAB-separated fields") and "got 6" in bad.records[0]
    assert bad.records[1].startswith(f"{FIXTURE}:5: label")


def test_fatal_policy_and_bad_fraction():
    with pytest.raises(BadInputError, match=r"aan_small.tsv:3"):
        list(read_tsv(FIXTURE, BadInput("aan", on_error="fatal")))
    bad = BadInput("aan")  # default: skip, fail above 1%
    rows = list(read_tsv(FIXTURE, bad))
    with pytest.raises(BadInputError, match=r"skipped 2 of 6 records .*max_bad_fraction"):
        bad.finish(len(rows) + bad.count)


def _aan_dir(root: Path) -> Path:
    d = root / "tsv_data"
    d.mkdir(parents=True)
    for name in AAN_FILES.values():
        shutil.copy(FIXTURE, d / name)
    return d


def test_two_documents_per_example(tmp_path):
    dm = RetrievalDataModule(str(tmp_path / "data"), max_len=16, batch_size=4, aan_dir=str(_aan_dir(tmp_path)),
                             max_bad_fraction=0.5)
    dm.prepare_data()
    dm.setup()
    ids, lengths, labels = dm.datasets["train"].ids, dm.datasets["train"].lengths, dm.datasets["train"].labels
    assert ids.shape == (4, 2, 16) and lengths.shape == (4, 2) and labels.tolist() == [1, 0, 0, 1]
    assert decode(ids[0, 0]) == b'We use "quoted p' and lengths[0].tolist() == [16, 16]
    assert decode(ids[3, 1]) == b"short" and lengths[3, 1] == 5 and (ids[3, 1, 5:] == 0).all()
    assert decode(ids[2, 0])[:8] == b"bytes \xff\xfe" and ids[2, 0, 6] == 0xFF + 1
    batch = next(iter(dm.val_dataloader()))  # val = the same fixture, in order
    assert batch["ids"].shape == (4, 2, 16) and batch["mask"].shape == (4, 2, 16)
    assert batch["mask"].sum(-1).tolist() == np.asarray(lengths).tolist()


def test_missing_files_fail_before_training_with_steps(tmp_path):
    dm = RetrievalDataModule(str(tmp_path), max_len=16)  # instantiating needs no data (config checks)
    with pytest.raises(FileNotFoundError, match=r"new_aan_pairs.train.tsv.*lra_release.*tsv_data"):
        dm.prepare_data()


@pytest.mark.slow
def test_text_and_retrieval_end_to_end(cli):
    """task=text and task=retrieval (two documents per example, dual head) through run.py, as one
    multirun so the two share the interpreter start-up; data at the default places under data_dir."""
    from tests.data.test_data_text import make_imdb

    data = cli.cwd / "data"
    make_imdb(data, n=10)
    d = data / "lra_release" / "tsv_data"
    d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    for name in AAN_FILES.values():
        lines = [f"{i % 2}.0\ta{i}\tb{i}\tdoc {'x' * int(rng.integers(5, 40))}\tother \"{i}\"" for i in range(24)]
        (d / name).write_text("\n".join(lines) + "\n")
    cli("-m", "task=text,retrieval", "model=tiny", "logger=none", "task.max_len=32", "task.batch_size=8",
        "task.max_steps=2", "task.val_every=2", "task.warmup_steps=1", "trainer.enable_progress_bar=false")
    recs = {r["task"]: r for r in (json.loads(p.read_text()) for p in (cli.cwd / "results" / "runs").glob("*.json"))}
    assert sorted(recs) == ["retrieval", "text"]
    for rec in recs.values():
        assert rec["status"] == "finished" and 0.0 <= rec["metrics"]["test_acc"] <= 1.0, rec.get("error")
    assert recs["retrieval"]["config"]["model"]["dual"] is True and recs["text"]["config"]["model"]["dual"] is False
