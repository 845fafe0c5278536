"""Retrieval (LRA ACL Anthology Network citation pairs): TSV reader, byte tokenisation, DataModule.

Files (the LRA release, ``lra_release/tsv_data/``): ``new_aan_pairs.{train,eval,test}.tsv`` (147,086 /
18,090 / 17,437 pairs) -> train / val / test. Each line: ``label<TAB>id1<TAB>id2<TAB>text1<TAB>text2``,
no header. The official pipeline reads them with ``make_csv_dataset(field_delim='\\t',
use_quote_delim=False, header=False)`` and a float label, so:

* quotes are ordinary characters (no quoting, no escaping, no multi-line fields);
* every line must split on TAB into exactly 5 fields: a TAB inside a text gives 6+ fields, which the
  official parser rejects ("Expect 5 fields"); here such a row is a corrupt row, reported with its
  file and line and skipped (or fatal, see :class:`lra.badinput.BadInput`);
* the label is parsed as a float, then int; anything but 0/1 is a corrupt row.

Lines are split on ``\\n`` (a trailing ``\\r`` is dropped) and read as bytes, so texts that are not
valid UTF-8 keep their bytes. Tokens: bytes + 1 (0 = pad), each document truncated to ``max_len``
(4000). Both documents are stored: ids ``[M, 2, max_len]``, lengths ``[M, 2]``; batches carry
``ids [B, 2, N]`` and the model encodes both with one encoder (dual head ``[u, v, u*v, u-v]``).
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np

from lra.data import bytes as byte_tok
from lra.data import layout
from lra.badinput import BadInput, BadInputError, DataMissingError
from lra.data.cache import save_split
from lra.data.datamodule import CachedDataModule


def parse_line(line: bytes) -> tuple[int, bytes, bytes]:
    """One TSV line (without its newline) -> (label, text1, text2); ValueError says what is wrong."""
    fields = line.split(b"\t")
    if len(fields) != 5:
        raise ValueError(f"expected 5 TAB-separated fields (label id1 id2 text1 text2), got {len(fields)}")
    try:
        value = float(fields[0])
    except ValueError:
        raise ValueError(f"label {fields[0][:20]!r} is not a number") from None
    if value not in (0.0, 1.0):
        raise ValueError(f"label {value} is not 0 or 1")
    return int(value), fields[3], fields[4]


def read_tsv(path: Path, bad: BadInput) -> Iterator[tuple[int, bytes, bytes]]:
    """Good rows of one AAN TSV; bad rows go to ``bad`` with ``file:line``. Empty lines are ignored."""
    with open(path, "rb") as f:
        for n, raw in enumerate(f, 1):
            line = raw.rstrip(b"\n").rstrip(b"\r")
            if not line.strip():
                continue
            try:
                yield parse_line(line)
            except ValueError as e:
                bad.report(f"{path}:{n}", str(e))


def count_lines(path: Path) -> int:
    with open(path, "rb") as f:
        return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b"")) + 1


class RetrievalDataModule(CachedDataModule):
    task_name = "retrieval"

    def __init__(
        self,
        data_dir: str,
        max_len: int = 4000,
        batch_size: int = 32,
        aan_dir: str | None = None,
        on_error: str = "skip",
        max_bad_fraction: float = 0.01,
        **kwargs: Any,
    ) -> None:
        super().__init__(data_dir, max_len, batch_size, **kwargs)
        BadInput("aan", on_error, max_bad_fraction)  # validates the policy early
        self.aan_dir = layout.AAN.at(self.data_dir, aan_dir)
        self.on_error, self.max_bad_fraction = on_error, float(max_bad_fraction)

    def check_sources(self) -> None:
        """Called by ``prepare_data`` (before any training step) when the cache must be built; not at
        construction, so configs compose and instantiate on machines without the data."""
        missing = [f for f in layout.AAN.files if not (self.aan_dir / f).is_file()]
        if missing:
            raise DataMissingError(
                f"AAN retrieval files missing in {self.aan_dir}: {', '.join(missing)}. Get them with: python run.py "
                f"mode=fetch task=retrieval (reads the LRA release lra_release.gz, about 7.7 GB, as it downloads and "
                f"keeps only these three files; no TensorFlow). Or download lra_release.gz from the Long Range Arena "
                f"release (google-research/long-range-arena), unpack it and point task.datamodule.aan_dir at its "
                f"'{layout.AAN.leaf()}' folder (default: <data_dir>/{layout.AAN.default()})")

    def settings(self) -> dict[str, Any]:
        return {"format": 1, "max_len": self.max_len, "path": str(self.aan_dir.resolve()),
                "on_error": self.on_error, "max_bad_fraction": self.max_bad_fraction}

    def build(self, directory: Path) -> None:
        self.check_sources()
        for split, name in layout.AAN_FILES.items():
            path = self.aan_dir / name
            bad = BadInput(f"AAN {name}", self.on_error, self.max_bad_fraction)
            capacity = count_lines(path)
            # built in a scratch memory map: the full train split is 2.3 GB of int16
            scratch = directory / f".{split}_scratch.npy"
            ids = np.lib.format.open_memmap(scratch, mode="w+", dtype=np.int16, shape=(capacity, 2, self.max_len))
            lengths = np.zeros((capacity, 2), np.int32)
            labels = np.zeros(capacity, np.int64)
            m = 0
            for label, text1, text2 in read_tsv(path, bad):
                byte_tok.encode_into(ids, lengths, (m, 0), text1)
                byte_tok.encode_into(ids, lengths, (m, 1), text2)
                labels[m] = label
                m += 1
            bad.finish(m + bad.count)
            if m == 0:
                raise BadInputError(f"{path}: no usable row (check the file, or point task.datamodule.aan_dir at the release's tsv_data folder)")
            save_split(directory, split, ids[:m], lengths[:m], labels[:m])
            del ids
            scratch.unlink()
            print(f"[retrieval] {split}: {m} pairs from {path} ({bad.count} corrupt rows skipped)")
