"""``python -m lra.data.describe <results folder>``: the test-set description a ListOps report needs.

A prediction file holds, per test example, the prediction, the label and the length, not what the
report's diagnostics split by (:mod:`lra.report.diagnostics`): the outermost operator and the tree
depth, and the training set's labels per outermost operator (the operator-only classifier). This
command reads them from the data the folder's runs used, and writes them into the folder, where
the report (which reads no data) finds them: ``<folder>/testsets/listops-<data fingerprint>.json``
(:func:`lra.records.write_description`). Commit it with the records; a fresh clone with no data
directory then rebuilds the report byte for byte.

Which data: every ListOps datamodule setting the folder's records name (generator, max_len,
tokenization; not the run seed, batch sizes or the data folder), one description each, built (or
generated first, deterministically from its seed) under ``--data-dir`` (default ``LRA_DATA_DIR``,
else ``data``). The file is named by the built cache's fingerprint (:func:`lra.data.cache.fingerprint`),
the ``data_fingerprint`` runs record; the report uses it only for runs whose fingerprint is that
one, or, for older records without one, whose prediction files' labels and lengths are the
description's, example for example.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

from lra.badinput import BadInputError, DataMissingError, UserError, exit_user_error
from lra.data import layout
from lra.data.cache import load_split
from lra.data.listops import ListOpsDataModule, operator_depth, outer_operator, read_tsv
from lra.records import load_records, write_description

COMMAND = "python -m lra.data.describe"
TARGET = "lra.data.listops.ListOpsDataModule"
NUM_CLASSES = 10
# the datamodule settings that change the data (the rest: seed, batch sizes, workers, data folder)
DATA_KEYS = ("max_len", "source", "tokenization", "official_dir", "generator")


def describe_listops(datamodule: ListOpsDataModule) -> dict[str, Any]:
    """The description of a built ListOps cache's test split (``prepare_data()`` must have run)."""
    tsv_dir = datamodule.tsv_dir()
    train = list(read_tsv(tsv_dir / layout.LISTOPS_FILES["train"]))
    test = list(read_tsv(tsv_dir / layout.LISTOPS_FILES["test"]))
    _, lengths, labels = load_split(datamodule.cache_dir, "test")
    if [t for _, t in test] != [int(x) for x in labels]:
        raise BadInputError(f"{tsv_dir}: the test TSV's labels differ from the cache's ({datamodule.cache_dir}); "
                            "remove that cache folder and build it again")
    train_ops = [outer_operator(s) for s, _ in train]
    counts: dict[str, list[int]] = {}
    for op, (_, label) in zip(train_ops, train):
        counts.setdefault(op, [0] * NUM_CLASSES)[label] += 1
    settings: dict[str, Any] = {"max_len": datamodule.max_len, "source": datamodule.source,
                                "tokenization": datamodule.tokenization}
    if datamodule.source == "generate":
        settings["generator"] = dict(sorted(datamodule.gen.items()))
    return {
        "task": "listops",
        "split": "test",
        "data_fingerprint": datamodule.fingerprint,
        "settings": settings,
        "built_by": f"{COMMAND} <results folder>",
        "about": "per test example in split order: outermost operator, operator depth (operators on the longest "
                 "root-to-leaf path), label, stored length; train_label_counts: the training set's labels "
                 "(0-9) counted per outermost operator",
        "n": len(test),
        "train_label_counts": dict(sorted(counts.items())),
        "operator": [outer_operator(s) for s, _ in test],
        "depth": [operator_depth(s) for s, _ in test],
        "label": [int(x) for x in labels],
        "length": [int(x) for x in np.asarray(lengths)],
    }


def listops_settings(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The distinct ListOps data settings (:data:`DATA_KEYS`) the records' configs name, in a stable order."""
    found: dict[str, dict[str, Any]] = {}
    for rec in records:
        dm = ((rec.get("config") or {}).get("task") or {}).get("datamodule") or {}
        if rec.get("task") != "listops" or dm.get("_target_") != TARGET:
            continue
        kwargs = {k: dm[k] for k in DATA_KEYS if k in dm}
        found.setdefault(json.dumps(kwargs, sort_keys=True, default=str), kwargs)
    return [found[k] for k in sorted(found)]


def describe_folder(results_dir: str | Path, data_dir: str | Path) -> list[Path]:
    """Build (generating where needed) the data of every ListOps setting of the folder's records and
    write its description there; the paths written."""
    records, _ = load_records(results_dir)
    settings = listops_settings(records)
    if not settings:
        raise DataMissingError(f"{Path(results_dir) / 'runs'}: no ListOps run record (task=listops) to describe the "
                               f"test set of; pass a results folder holding ListOps runs")
    written = []
    for kwargs in settings:
        datamodule = ListOpsDataModule(str(data_dir), **kwargs)
        datamodule.check_sources()
        datamodule.prepare_data()
        description = describe_listops(datamodule)
        fp = description["data_fingerprint"]
        path = write_description(results_dir, description)
        same = sum(r.get("data_fingerprint") == fp for r in records)
        unknown = sum(r.get("task") == "listops" and r.get("data_fingerprint") is None for r in records)
        print(f"{path}: {description['n']} test examples of data {fp} ({datamodule.cache_dir}); "
              f"{same} record(s) carry this fingerprint, {unknown} ListOps record(s) carry none (the report "
              "matches those by their test labels and lengths)", flush=True)
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> list[Path]:
    parser = argparse.ArgumentParser(prog=COMMAND, description=__doc__.split("\n\n")[0])
    parser.add_argument("results_dir", help="a results folder with ListOps records under runs/")
    parser.add_argument("--data-dir", default=os.environ.get("LRA_DATA_DIR", "data"),
                        help="where the data is built or found (default: LRA_DATA_DIR, else ./data)")
    args = parser.parse_args(argv)
    try:
        return describe_folder(args.results_dir, args.data_dir)
    except UserError as e:
        exit_user_error(e)


if __name__ == "__main__":
    main(sys.argv[1:])
