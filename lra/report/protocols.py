"""Which runs fill a training protocol's table, and which are "custom".

A protocol (``protocol=xiong2021``, ``quick``, ``lra2020``; set by the experiment presets) fixes the
training recipe: steps, learning rate, schedule, batch, backbone size, sequence length, data sizes.
A run whose command line changed any of that is not a run of the protocol, whatever its
``protocol`` field says (the README's quick look ``trainer.max_steps=20`` is not a xiong2021 result).

Mechanism (chosen over diffing the resolved config against the protocol's defaults, which needs
the config tree of the run's code version): the record keeps the Hydra override list of the run
(``overrides``, written at train time); an override is *neutral* when its key only picks what is
compared (variant, task, seed, preset) or where/how the run executes (paths, loggers, devices,
resume, progress bars, worker count, torch threads). Every other override - including any ``+key`` addition or
``~key`` deletion - is protocol-defining, and the run goes to the custom table of its protocol with
those overrides listed. A record without ``overrides`` (older records, runs outside Hydra) counts
as a protocol run: nothing says otherwise.
"""
from __future__ import annotations

from typing import Any

# a group choice (``attention=linear``) is neutral; its sub-keys (``attention.rates=...``,
# ``task.max_len=...``) change the variant or the recipe and are not
NEUTRAL_EXACT = (
    "attention", "task", "seed", "experiment", "protocol", "mode", "resume", "ckpt_path", "smat_job", "ablation", "threads",
    "trainer", "trainer.accelerator", "trainer.devices", "trainer.num_nodes", "trainer.strategy",
    "trainer.enable_progress_bar", "trainer.enable_model_summary", "trainer.log_every_n_steps",
    "trainer.default_root_dir", "trainer.compile_limit", "task.datamodule.num_workers", "task.datamodule.data_dir",
    "task.datamodule.official_dir",
)
# whole subtrees (``<key>.`` and config groups ``<key>/``): where results go, logging, measurement
NEUTRAL_TREES = ("paths", "logger", "callbacks", "checkpointing", "hydra", "report", "bench")


def _key(override: str) -> str:
    return override.split("=", 1)[0].strip()


def is_neutral(override: str) -> bool:
    key = _key(override)
    if key.startswith(("+", "~")):
        return False
    return key in NEUTRAL_EXACT or any(key == k or key.startswith((k + ".", k + "/")) for k in NEUTRAL_TREES)


def protocol_overrides(rec: dict[str, Any]) -> tuple[str, ...]:
    """The run's protocol-defining overrides, sorted (empty: a run of its protocol)."""
    return tuple(sorted(o for o in rec.get("overrides") or () if not is_neutral(str(o))))
