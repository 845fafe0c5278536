"""Which runs fill a training protocol's table, and which are "custom".

A protocol (``protocol=xiong2021``, ``quick``, ``lra2020``; set by the experiment presets) fixes the
training recipe: steps, learning rate, schedule, batch, backbone size, sequence length, data sizes.
A run whose command line changed any of that is not a run of the protocol, whatever its
``protocol`` field says (the README's quick look ``trainer.max_steps=20`` is not a xiong2021 result).

Two mechanisms, both from the one table of :mod:`lra.identity`:

* The command line: the record keeps the run's Hydra overrides (``overrides``); an override is
  *neutral* when its key only picks what is compared (variant, task, seed, preset) or where/how the
  run executes (paths, loggers, devices, resume, progress bars, workers, threads, every ``*_dir``).
  Every other override - including any ``+key`` addition or ``~key`` deletion - is
  protocol-defining, and the run goes to the custom table of its protocol with those overrides listed.
* The config itself (a YAML edit leaves no override): :mod:`lra.report.cells` compares each run's
  protocol-defining settings with those of the protocol's reference runs on the task.
"""
from __future__ import annotations

from typing import Any

from lra.identity import is_neutral_override


def is_neutral(override: str) -> bool:
    """The identity table's rule (:func:`lra.identity.is_neutral_override`): one list, not two."""
    return is_neutral_override(override)


# Added config groups that name a row rather than change a protocol: ``+pretrain=mlm`` makes the
# row "<attention> +SPT(mlm)" (lra.report.cells.spt_label); its settings (pretrain.mask_ratio=...) do change it.
ROW_GROUPS = ("+pretrain",)


def protocol_overrides(rec: dict[str, Any]) -> tuple[str, ...]:
    """The run's protocol-defining overrides, sorted (empty: a run of its protocol). Screening has
    checked that ``overrides`` is a list of strings."""
    return tuple(sorted(o for o in rec.get("overrides") or ()
                        if not is_neutral(str(o)) and str(o).split("=", 1)[0].strip() not in ROW_GROUPS))
