"""The one place third-party log noise is filtered, each entry with its reason (``run.py`` installs
them before Hydra starts). Only other packages' messages are named here, by their exact text: the
suite's own warnings are never filtered, and a new third-party warning still shows until it is
judged and listed.
"""
from __future__ import annotations

import logging
import warnings
from dataclasses import dataclass


@dataclass(frozen=True)
class Known:
    """A third-party message, matched at its start (``warnings``: a regular expression)."""

    source: str          # "warnings" or a logger's name
    text: str
    reason: str
    category: type[Warning] = Warning


KNOWN: tuple[Known, ...] = (
    Known("warnings", r"`isinstance\(treespec, LeafSpec\)` is deprecated",
          "torch 2.13 deprecates constructing LeafSpec, which Lightning's own _pytree still does at every "
          "fit and test (twice per run): a deprecation inside Lightning, nothing a user can act on",
          FutureWarning),
    Known("warnings", r"You have overridden `on_before_batch_transfer` in `LightningModule` but have passed in a "
                      r"`LightningDataModule`",
          "on purpose: models/module.py reads whether a batch has padding while its mask is still on the host; "
          "Lightning says it will use that implementation, which is what the suite wants"),
    Known("warnings", r".*your dataloader is not resumable",
          "the training stream does resume exactly (StepStreamSampler starts at the restored step); Lightning "
          "cannot see that and warns on every resume"),
    Known("pytorch_lightning.utilities.rank_zero", "💡 Tip: For seamless cloud logging",
          "Lightning's advertisement for its hosted logger (litlogger), printed at every Trainer start"),
)


class _DropKnown(logging.Filter):
    def __init__(self, prefixes: tuple[str, ...]) -> None:
        super().__init__()
        self.prefixes = prefixes

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.getMessage()).startswith(self.prefixes)


def quiet_third_party() -> None:
    """Install the filters of :data:`KNOWN` (idempotent)."""
    for known in KNOWN:
        if known.source == "warnings":
            warnings.filterwarnings("ignore", message=known.text, category=known.category)
    by_logger: dict[str, list[str]] = {}
    for known in KNOWN:
        if known.source != "warnings":
            by_logger.setdefault(known.source, []).append(known.text)
    for name, prefixes in by_logger.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropKnown) for f in logger.filters):
            logger.addFilter(_DropKnown(tuple(prefixes)))
