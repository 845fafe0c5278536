"""How much of a ListOps test accuracy does the outermost operator alone explain? For every
prediction file of this folder: accuracy and predicted classes per outermost operator (MAX, MIN,
MED, SM), next to a classifier that sees only that operator and answers the training set's most
frequent label for it.

    python results/xiong2021-listops-cpu/probes/outer_operator.py [results folder]

A diagnostic for the README of this folder, not part of the suite. It reads the test and training
sets through the suite's own ListOps datamodule (``experiment=xiong2021 task=listops``; generated on
first use), and stops if a prediction file's labels differ from that test set in any row (a check
that it reads the set the runs were tested on).
"""
import json
import re
import sys
from collections import Counter
from pathlib import Path

import numpy as np
from hydra import compose, initialize_config_dir
from hydra.utils import instantiate

from lra.data import layout
from lra.data.listops import read_tsv

ROOT = Path(__file__).resolve().parents[3]
OPERATOR = re.compile(r"\[(MAX|MIN|MED|SM)\b")


def outer_operator(source: str) -> str:
    """The first operator in reading order is the outermost: every other one sits inside its brackets."""
    found = OPERATOR.search(source)
    if found is None:
        raise ValueError(f"no operator in {source[:60]!r}")
    return found.group(1)


def split(tsv_dir: Path, name: str) -> tuple[np.ndarray, np.ndarray]:
    rows = list(read_tsv(tsv_dir / layout.LISTOPS_FILES[name]))
    return np.array([outer_operator(s) for s, _ in rows]), np.array([t for _, t in rows])


def main(folder: Path) -> None:
    with initialize_config_dir(config_dir=str(ROOT / "conf"), version_base=None):
        cfg = compose("config", overrides=["experiment=xiong2021", "task=listops"])
    datamodule = instantiate(cfg.task.datamodule)
    datamodule.prepare_data()
    train_ops, train_labels = split(datamodule.tsv_dir(), "train")
    ops, labels = split(datamodule.tsv_dir(), "test")
    names = sorted(set(ops))
    mode = {op: Counter(train_labels[train_ops == op].tolist()).most_common(1)[0][0] for op in names}
    baseline = np.array([mode[op] for op in ops]) == labels
    print(f"test examples per outermost operator: {', '.join(f'{op} {(ops == op).sum()}' for op in names)}")
    print(f"outermost operator only (the training set's most frequent label per operator: "
          f"{', '.join(f'{op} -> {mode[op]}' for op in names)}): {100 * baseline.mean():.2f}%  "
          + "  ".join(f"{op} {100 * baseline[ops == op].mean():.1f}" for op in names))
    ceiling = sum(Counter(labels[ops == op].tolist()).most_common(1)[0][1] for op in names) / len(labels)
    print(f"the most any operator-only classifier scores on this test set (its own most frequent label per operator): "
          f"{100 * ceiling:.2f}%")
    print(f"\n{'run':<34} {'test %':>7}  " + "  ".join(f"{op + ' acc':>8}" for op in names)
          + "  predicted classes per operator (class: count, top 3)")
    for path in sorted(folder.glob("runs/*.preds.npz")):
        preds = np.load(path)
        if len(preds["label"]) != len(labels) or (preds["label"] != labels).any():
            sys.exit(f"{path}: its labels differ from the test set read here; not the set the run was tested on")
        pred, correct = preds["pred"], preds["correct"].astype(bool)
        record = json.loads(path.with_name(path.name.replace(".preds.npz", ".json")).read_text())
        run = f"{record['config']['attention_name']} s{record['config']['seed']}"
        per_op = "  ".join(f"{100 * correct[ops == op].mean():>8.1f}" for op in names)
        classes = "; ".join(f"{op} " + ",".join(f"{c}:{n}" for c, n in Counter(pred[ops == op].tolist()).most_common(3))
                            for op in names)
        print(f"{run:<34} {100 * correct.mean():>7.2f}  {per_op}  {classes}")


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[1])
