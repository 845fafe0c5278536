"""ListOps: label semantics, generator bounds and determinism, the official TSV format, tokenisers."""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from lra.data.cache import FINGERPRINT, is_complete
from lra.data.listops import (VOCAB, VOCAB_SIZE, ListOpsDataModule, apply_op, encode, evaluate, generate,
                         generate_one, read_tsv, tokenize, write_tsv)


@pytest.mark.parametrize("expr,value", [
    ("[MAX 4 3 ]", 4),
    ("[MIN 4 3 7 ]", 3),
    ("[MED 1 2 3 ]", 2),
    ("[MED 1 2 ]", 1),            # even count: mean 1.5, truncated
    ("[MED 3 4 8 9 ]", 6),        # (4 + 8) / 2
    ("[MED 0 9 ]", 4),            # 4.5 -> 4
    ("[SM 9 8 7 ]", 4),           # 24 mod 10
    ("[MAX 2 9 [MIN 4 7 ] 0 ]", 9),
    ("[SM [MED 1 5 ] [MAX 7 1 ] ]", 0),  # 3 + 7 = 10 -> 0
    ("( ( ( [MAX 4 ) 3 ) ] )", 4),  # binarised release form
    ("7", 7),
])
def test_label_semantics(expr, value):
    assert evaluate(expr) == value


def test_apply_op_rejects_unknown():
    with pytest.raises(ValueError, match="unknown ListOps operator"):
        apply_op("[FOO", [1, 2])


def test_generated_label_matches_evaluation_and_length_counts_tokens():
    rng = random.Random("t")
    checked = 0
    while checked < 50:
        ex = generate_one(rng, max_length=300)
        if ex is None:
            continue
        source, label, length = ex
        assert evaluate(source) == label
        assert len(tokenize(source)) == length
        checked += 1


def test_length_bounds_are_strict():
    rows = generate(300, seed=3, min_length=20, max_length=40, workers=1, chunk_draws=2000)
    lengths = [len(tokenize(s)) for s, _ in rows]
    assert min(lengths) > 20 and max(lengths) < 40
    assert len({s for s, _ in rows}) == len(rows)  # deduplicated


@pytest.mark.slow
def test_generation_is_deterministic_and_worker_independent():
    a = generate(200, seed=5, min_length=10, max_length=80, workers=1, chunk_draws=500)
    b = generate(200, seed=5, min_length=10, max_length=80, workers=1, chunk_draws=500)
    c = generate(3000, seed=5, min_length=10, max_length=80, workers=2, chunk_draws=500)
    d = generate(200, seed=6, min_length=10, max_length=80, workers=1, chunk_draws=500)
    assert a == b
    assert c[:200] == a
    assert a != d


def test_binarised_source_matches_official_form():
    rng = random.Random("form")
    source = next(ex[0] for ex in iter(lambda: generate_one(rng, max_length=50), 0) if ex is not None and ex[2] > 3)
    assert source.startswith("(") and source.endswith(")")
    assert source.count("(") == source.count(")")


def test_tsv_round_trip(tmp_path):
    rows = generate(30, seed=1, min_length=5, max_length=50, workers=1, chunk_draws=500)
    path = tmp_path / "basic_train.tsv"
    write_tsv(path, rows)
    assert path.read_text().splitlines()[0] == "Source\tTarget"
    assert list(read_tsv(path)) == rows


def test_crlf_file(tmp_path):
    path = tmp_path / "basic_val.tsv"
    path.write_bytes(b"Source\tTarget\r\n( ( ( [MAX 4 ) 3 ) ] )\t4\r\n( ( ( [SM 5 ) 6 ) ] )\t1\r\n")
    rows = list(read_tsv(path))
    assert rows == [("( ( ( [MAX 4 ) 3 ) ] )", 4), ("( ( ( [SM 5 ) 6 ) ] )", 1)]
    assert tokenize(rows[0][0]) == ["[MAX", "4", "3", "X"]


def test_malformed_row_names_file_and_line(tmp_path):
    path = tmp_path / "basic_test.tsv"
    path.write_text("Source\tTarget\n( [MAX 4 ] )\t4\nbroken row without target\n")
    with pytest.raises(ValueError, match=r"basic_test.tsv:3: malformed row"):
        list(read_tsv(path))


def test_tokenisation_modes():
    src = "( ( ( [MAX 4 ) ( ( ( [MIN 2 ) 9 ) ] ) ) ] )"
    assert tokenize(src, "lra") == ["[MAX", "4", "[MIN", "2", "9", "X", "X"]
    assert tokenize(src, "paper") == ["MAX", "4", "MIN", "2", "9"]
    ids, lengths = encode([src], max_len=4, mode="lra")
    assert lengths.tolist() == [4]
    assert ids[0].tolist() == [VOCAB["[MAX"], VOCAB["4"], VOCAB["[MIN"], VOCAB["2"]]
    ids, lengths = encode([src], max_len=8, mode="paper")
    assert ids[0, 5:].tolist() == [0, 0, 0] and lengths.tolist() == [5]
    assert int(ids.max()) < VOCAB_SIZE
    with pytest.raises(ValueError, match="tokenization"):
        tokenize(src, "bogus")


def _dm(tmp_path, **kw):
    gen = {"n_train": 40, "n_val": 8, "n_test": 8, "min_length": 5, "max_length": 40}
    return ListOpsDataModule(str(tmp_path / "data"), max_len=kw.pop("max_len", 48), batch_size=4, generator=gen, **kw)


def test_datamodule_batches_and_cache_key(tmp_path):
    dm = _dm(tmp_path)
    dm.prepare_data()
    dm.setup()
    batch = next(iter(dm.train_dataloader()))
    assert batch["ids"].shape == (4, 48) and batch["mask"].dtype == torch.bool
    assert (batch["ids"][~batch["mask"]] == 0).all() and (batch["ids"][batch["mask"]] > 0).all()
    assert len(dm.datasets["train"]) == 40 and len(dm.datasets["test"]) == 8
    other = _dm(tmp_path, tokenization="paper")
    assert other.cache_dir != dm.cache_dir  # preprocessing settings name the cache
    assert _dm(tmp_path, max_len=32).cache_dir != dm.cache_dir
    assert is_complete(dm.cache_dir)


def test_cache_fingerprint_is_kept_at_the_build_and_says_what_the_arrays_hold(tmp_path):
    dm = _dm(tmp_path)
    dm.prepare_data()
    kept = (dm.cache_dir / FINGERPRINT).read_text().strip()
    assert dm.fingerprint == kept and len(kept) == 16
    again = _dm(tmp_path / "again")
    again.prepare_data()
    assert again.fingerprint == kept                       # the seeded generator, built again elsewhere
    (dm.cache_dir / FINGERPRINT).unlink()                  # a cache from before fingerprints: computed on use
    assert dm.fingerprint == kept and (dm.cache_dir / FINGERPRINT).is_file()
    labels = np.load(dm.cache_dir / "train_labels.npy")
    labels[7] = (labels[7] + 1) % 10
    np.save(dm.cache_dir / "train_labels.npy", labels)     # one label of 40 changed
    (dm.cache_dir / FINGERPRINT).unlink()
    assert dm.fingerprint != kept


def test_interrupted_build_leaves_no_complete_cache(tmp_path, monkeypatch):
    dm = _dm(tmp_path)

    def boom(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr("lra.data.listops.encode", boom)
    with pytest.raises(KeyboardInterrupt):
        dm.prepare_data()
    assert not dm.cache_dir.exists()
    leftovers = [p.name for p in dm.cache_dir.parent.iterdir() if p.name.startswith(".")]
    assert not [p for p in leftovers if "building" in p]
    monkeypatch.undo()
    dm.prepare_data()  # a later run builds it properly
    assert is_complete(dm.cache_dir)


def test_official_source_missing_files_message(tmp_path):
    dm = _dm(tmp_path, source="official")
    with pytest.raises(FileNotFoundError, match=r"basic_train.tsv.*lra_release"):
        dm.prepare_data()


def test_official_files_are_read(tmp_path):
    official = tmp_path / "release" / "listops-1000"
    rows = generate(20, seed=2, min_length=5, max_length=30, workers=1, chunk_draws=500)
    for name in ("basic_train.tsv", "basic_val.tsv", "basic_test.tsv"):
        write_tsv(official / name, rows)
    dm = _dm(tmp_path, source="official", official_dir=str(official))
    dm.prepare_data()
    dm.setup()
    assert dm.datasets["val"].labels.tolist() == [t for _, t in rows]
