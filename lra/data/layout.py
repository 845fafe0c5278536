"""Where each task's reader looks for the real data, and the files it reads there: the one table that
the DataModules read from and the fetch (``run.py mode=fetch``, :mod:`lra.data.fetch`) writes to.

A folder is ``<data_dir>/<default>`` unless the task's ``task.datamodule.<setting>`` names another.
The defaults follow the archives' own layouts (the LRA release unpacked under ``<data_dir>/lra_release``),
so a hand-unpacked archive is found too. Standard library only: the fetch and the command-line checks
import it without torch or numpy.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

RELEASE = "lra_release"  # the LRA release (lra_release.gz), unpacked under <data_dir>


@dataclass(frozen=True)
class Folder:
    """One reader's folder: the setting that moves it, its default place, and what a complete one holds."""

    setting: str               # task.datamodule.<setting>
    name: str                  # its own name; "{resolution}" is filled in (Pathfinder)
    files: tuple[str, ...]     # files (or sub-folders) a complete folder holds
    parent: str = ""           # under data_dir

    def leaf(self, resolution: Optional[int] = None) -> str:
        """The folder's name, which is also its top folder in the archive that ships it."""
        return self.name.format(resolution=resolution)

    def at(self, data_dir: Path | str, setting: Any = None, resolution: Optional[int] = None) -> Path:
        """Where the reader looks: ``setting`` (the task's folder setting) when given, else the default."""
        if setting:
            return Path(str(setting)).expanduser()
        return Path(data_dir).joinpath(*filter(None, (self.parent, self.leaf(resolution))))

    def default(self, resolution: Optional[int] = None) -> str:
        """The default place, as written under ``<data_dir>`` in messages."""
        return "/".join(filter(None, (self.parent, self.leaf(resolution))))


# text: the IMDb archive unpacked; label i is IMDB_LABELS[i]
IMDB_LABELS = ("neg", "pos")
IMDB = Folder("imdb_dir", "aclImdb", tuple(f"{s}/{label}" for s in ("train", "test") for label in IMDB_LABELS))
# image: CIFAR-10's python-version pickles
CIFAR_FILES = {"train": tuple(f"data_batch_{i}" for i in range(1, 6)), "test": ("test_batch",)}
CIFAR = Folder("cifar_dir", "cifar-10-batches-py", CIFAR_FILES["train"] + CIFAR_FILES["test"])
# retrieval: the AAN pairs of the LRA release
AAN_FILES = {"train": "new_aan_pairs.train.tsv", "val": "new_aan_pairs.eval.tsv", "test": "new_aan_pairs.test.tsv"}
AAN = Folder("aan_dir", "tsv_data", tuple(AAN_FILES.values()), parent=RELEASE)
# listops: the release's ListOps TSVs (generated data is written under the same names)
LISTOPS_FILES = {"train": "basic_train.tsv", "val": "basic_val.tsv", "test": "basic_test.tsv"}
LISTOPS = Folder("official_dir", "listops-1000", tuple(LISTOPS_FILES.values()), parent=RELEASE)
# pathfinder, pathx: one folder per resolution; ``files`` are those of each difficulty folder in it
# (the difficulty folders are named with the generator's settings: lra.data.pathfinder_gen.DIFFICULTIES)
PATHFINDER = Folder("official_dir", "pathfinder{resolution}", ("metadata", "imgs"), parent=RELEASE)
# LRA's train/val/test cut of the Pathfinder images (tfds percent slices [:80%], [80%:90%], [90%:])
PATHFINDER_SPLIT = (0.8, 0.1, 0.1)
PATHX_WARNING = (
    "the LRA release's pathfinder128 (Path-X) folder is reported broken: a ResNet that learns pathfinder32, 64 "
    "and 256 stays at chance on it (google-research/long-range-arena#38). The suite's Path-X is generated "
    "(task=pathx, task.datamodule.source=generate, the default); use the release's only to compare with it")
