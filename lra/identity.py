"""Experiment identity: the one definition of "the same experiment", for resume and the report.

Every setting of a run's config falls in one class of :data:`SETTINGS` (the longest matching
prefix decides; ``*_dir`` leaves anywhere are neutral; a top-level section the table does not name
is neutral, so a new logger, output or report setting can never make the same experiment look new):

* ``neutral``: where results go, what is logged, how fast it runs (paths, loggers, callbacks,
  checkpointing, threads, workers, progress bars, every ``*_dir``). In no identity; overriding one
  keeps a run in its protocol.
* ``execution``: the device the run used. In the identity (numbers differ by device), but a CPU run
  of a protocol is still the protocol.
* ``variant``: the attention variant. Defines the experiment; the protocol is the same for every
  variant, so it is not protocol-defining.
* ``seed``: the run's seed, and the settings that follow it by default (``task.datamodule.seed`` is
  ``${seed}``): equal to the run's own seed they are taken out of the seedless identity; a fixed
  value stays in (another experiment). Decided per run, from that run's config alone.
* ``protocol``: the training recipe (task, model, optimiser, trainer, protocol name). Defines the
  experiment and the protocol: a run differing from its protocol's runs here is a custom run.

:func:`run_key` is the resume key: its hash must not change for existing configs (tests pin it).
What the code does is part of the experiment too: runs of one key are the same experiment only when
their behavioural fingerprints agree (:func:`behaviour_difference`; measured by
:mod:`lra.training.fingerprint`), so an edited variant is a new experiment and a refactor that keeps
every number is not.
No torch, no omegaconf at import: the report imports this module too.
"""
from __future__ import annotations

import copy
import hashlib
import json
from typing import Any, Mapping

NEUTRAL, EXECUTION, VARIANT, SEED, PROTOCOL = "neutral", "execution", "variant", "seed", "protocol"

# One table: dotted setting (or section) -> class. The longest matching prefix wins.
SETTINGS: dict[str, str] = {
    # what defines the experiment (the top-level sections kept in the identity)
    "mode": PROTOCOL, "protocol": PROTOCOL, "task": PROTOCOL, "model": PROTOCOL, "optim": PROTOCOL, "trainer": PROTOCOL,
    "attention": VARIANT, "attention_name": VARIANT,
    "pretrain": PROTOCOL,  # self-pretraining (conf/pretrain/): in the identity only when present
    "seed": SEED, "task.datamodule.seed": SEED,
    # where the run executes: in the identity, not in the protocol
    "trainer.accelerator": EXECUTION, "trainer.devices": EXECUTION, "trainer.num_nodes": EXECUTION,
    "trainer.strategy": EXECUTION,
    # where and how visibly things run; every ``*_dir`` leaf too (see :func:`setting_class`)
    "paths": NEUTRAL, "logger": NEUTRAL, "callbacks": NEUTRAL, "checkpointing": NEUTRAL, "hydra": NEUTRAL,
    "report": NEUTRAL, "bench": NEUTRAL, "fetch": NEUTRAL, "threads": NEUTRAL, "resume": NEUTRAL, "ckpt_path": NEUTRAL,
    "trainer.enable_progress_bar": NEUTRAL, "trainer.enable_model_summary": NEUTRAL, "trainer.default_root_dir": NEUTRAL,
    "trainer.log_every_n_steps": NEUTRAL, "trainer.compile_limit": NEUTRAL, "task.datamodule.num_workers": NEUTRAL,
}
# Leaves that follow the run's seed by default (``${seed}`` in conf/task/*.yaml); other ``seed``
# leaves (a data generator's) are fixed settings of the task.
SEED_FOLLOWING = tuple(k for k, c in SETTINGS.items() if c == SEED and k != "seed")
# The top-level sections hashed by the resume key, in the order they were always hashed.
# ``pretrain`` is absent from every config without +pretrain=..., so their keys are unchanged.
IDENTITY = ("mode", "task", "attention_name", "attention", "model", "optim", "protocol", "seed", "trainer", "pretrain")
# Switches that change the numbers only when on (a compiled run rounds differently; the retired
# ``model.graph_safe`` drew counter-based randoms before every run did): off or absent, they are
# left out, so the keys of runs from before they existed, and after one was retired, hold.
OFF_BY_DEFAULT = (("trainer", "compile"), ("model", "graph_safe"))
# Settings that once existed, and what replaced them: an old command gets this one line.
RETIRED = {
    "model.graph_safe": "model.graph_safe is gone (issue 62): every attention variant has one path, with static shapes "
                        "and counter-based random draws, run eagerly by default and compiled with trainer.compile=true; "
                        "drop the setting",
}


def drop_retired(config: dict) -> dict:
    """A stored run config (a record's ``config``) without the settings of :data:`RETIRED`, so that
    the model of an old record builds with today's code; what such a setting chose is now the only
    behaviour. The record itself is left as it is."""
    config = copy.deepcopy(config)
    for dotted in RETIRED:
        *parents, leaf = dotted.split(".")
        node = config
        for key in parents:
            node = node.get(key) if isinstance(node, dict) else None
        if isinstance(node, dict):
            node.pop(leaf, None)
    return config


# Command-line choices of what is compared (a config group or the seed): ``attention=linear`` keeps
# a run in its protocol, ``attention.rates=...`` (a sub-key) does not.
SELECTORS = ("attention", "task", "seed", "experiment", "protocol", "mode", "ablation", "smat_job", "trainer")


def setting_class(dotted: str) -> str:
    """The class of one setting (a dotted path) in :data:`SETTINGS`."""
    if dotted.rsplit(".", 1)[-1].endswith("_dir"):
        return NEUTRAL
    parts = dotted.split(".")
    for i in range(len(parts), 0, -1):
        found = SETTINGS.get(".".join(parts[:i]))
        if found is not None:
            return found
    return NEUTRAL


def _plain(value: Any) -> Any:
    """A plain copy of a config node (an OmegaConf node is resolved; a dict is deep-copied)."""
    if hasattr(value, "_get_node") or type(value).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf

        return OmegaConf.to_container(value, resolve=True)
    return copy.deepcopy(value)


def _drop_neutral(node: dict[str, Any], prefix: str) -> None:
    for key in list(node):
        dotted = f"{prefix}{key}"
        if setting_class(dotted) == NEUTRAL:
            del node[key]
        elif isinstance(node[key], dict):
            _drop_neutral(node[key], dotted + ".")


def identity(cfg: Mapping[str, Any]) -> dict[str, Any]:
    """The settings that define the experiment, seed included (hashed by :func:`run_key`)."""
    ident = {k: _plain(v) for k in IDENTITY if (v := cfg.get(k)) is not None}
    _drop_neutral(ident, "")
    for node, key in OFF_BY_DEFAULT:
        section = ident.get(node)
        if isinstance(section, dict) and not section.get(key, True):
            section.pop(key)
    return ident


def run_key(cfg: Mapping[str, Any]) -> str:
    """The resume key: a hash of :func:`identity` (byte-identical for existing configs)."""
    return hashlib.sha1(json.dumps(identity(cfg), sort_keys=True, default=str).encode()).hexdigest()[:16]


def flatten(node: Any, prefix: str = "") -> dict[str, Any]:
    """{'optim.lr': 0.003, ...}: dotted paths of the leaves (lists are leaves)."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for k, v in node.items():
            out.update(flatten(v, f"{prefix}{k}."))
        return out
    return {prefix[:-1]: node}


def seed_following(ident: Mapping[str, Any]) -> set[str]:
    """The settings of THIS run that follow its own seed: a :data:`SEED_FOLLOWING` leaf equal to the
    run's seed. Decided from the run's config alone, so one run that fixes its data seed cannot
    change how any other run is pooled."""
    flat = flatten(dict(ident))
    return {p for p in SEED_FOLLOWING if p in flat and flat[p] == flat.get("seed")}


def seedless(ident: Mapping[str, Any], following: set[str]) -> dict[str, Any]:
    """The flattened identity without the seed and the settings that follow it: what a cell pools on."""
    return {p: v for p, v in flatten(dict(ident)).items() if p != "seed" and p not in following}


def protocol_settings(flat: Mapping[str, Any]) -> dict[str, Any]:
    """The protocol-defining part of a flattened (seedless) identity: what every variant of one
    protocol and task shares."""
    return {p: v for p, v in flat.items() if setting_class(p) == PROTOCOL}


def config_hash(flat: Mapping[str, Any]) -> str:
    """The 8-hex config hash the report prints beside a cell."""
    return hashlib.sha1(json.dumps(dict(flat), sort_keys=True, default=str).encode()).hexdigest()[:8]


def override_key(override: str) -> str:
    return override.split("=", 1)[0].strip()


def is_neutral_override(override: str) -> bool:
    """A command-line override that keeps a run in its protocol: a choice of what is compared
    (:data:`SELECTORS`), or a neutral or execution setting. ``+key`` and ``~key`` never are."""
    key = override_key(override)
    if key.startswith(("+", "~")):
        return False
    if key in SELECTORS:
        return True
    return setting_class(key.replace("/", ".")) in (NEUTRAL, EXECUTION)


# Behavioural fingerprints agree when every stored number does within float tolerance: a thread
# count or a fused kernel moves float32 values by about 1e-7 relative; a changed mask, sign or scale
# moves the losses and logits by 1e-3 or more.
BEHAVIOUR_RTOL, BEHAVIOUR_ATOL = 1e-4, 1e-5


def behaviour_difference(one: Mapping[str, Any] | None, other: Mapping[str, Any] | None) -> str | None:
    """None when two behavioural fingerprints agree, else the first difference in words
    ('training loss of step 1: 2.20 against 2.31', ``one``'s value first). A missing fingerprint (a
    record from before them) is not a difference: nothing says it differs."""
    if not one or not other:
        return None
    if one.get("version") != other.get("version"):
        return f"fingerprint version {one.get('version')} against {other.get('version')}"
    for field, what in (("losses", "training loss"), ("logits", "logit")):
        a, b = list(one.get(field) or []), list(other.get(field) or [])
        if len(a) != len(b):
            return f"{len(a)} against {len(b)} {what}s"
        for i, (x, y) in enumerate(zip(a, b)):
            if not abs(x - y) <= BEHAVIOUR_ATOL + BEHAVIOUR_RTOL * max(abs(x), abs(y)):
                where = f"of step {i + 1}" if field == "losses" else f"{i}"
                return f"{what} {where}: {x:.6g} against {y:.6g}"
    inner = behaviour_difference(one.get("pretraining"), other.get("pretraining"))  # a fine-tune's start
    return None if inner is None else f"its self-pretraining's {inner}"
