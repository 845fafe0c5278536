"""The W&B run of one suite run (``logger=wandb``), as W&B's users look at it.

* ``group``: the experiment identity, ``<attention>-<task>-<protocol>-<config hash>`` (the hash is the
  report's cell hash: :func:`lra.identity.config_hash` of the seedless identity), so W&B's group view
  averages the seeds of one experiment and never two variants;
* ``job_type``: the mode (conf/logger/wandb.yaml);
* ``name``: ``<attention>_<task>_<protocol>_s<seed>_<run id's suffix>``, unique and readable;
* ``id``: derived from the suite's run id, with ``resume="allow"``, so a resumed run (same record)
  continues the same W&B run, online, or offline under the same id for ``wandb sync``;
* the config carries the record's path and run id (``suite/record``, ``suite/run_id``): a W&B run
  leads back to its JSON record;
* offline files go under the results folder (``<results_dir>/wandb/offline-run-*``).

Settings the user gave (``logger.wandb.group=...``) are kept; only the ones left null are derived.
"""
from __future__ import annotations

import hashlib
import re
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lra.identity import IDENTITY, config_hash, identity, seed_following, seedless

TARGET = "pytorch_lightning.loggers.WandbLogger"
MAX_ID = 64          # W&B run ids: at most 64 characters, no "/\#?%:"


def is_wandb(node: Any) -> bool:
    return isinstance(node, DictConfig) and str(node.get("_target_", "")).endswith("WandbLogger")


def wandb_id(run_id: str) -> str:
    """The W&B run id of suite run ``run_id``: the run id itself where W&B accepts it."""
    clean = re.sub(r"[^A-Za-z0-9_.-]", "-", run_id)
    if len(clean) <= MAX_ID:
        return clean
    digest = hashlib.sha1(run_id.encode()).hexdigest()[:12]
    return f"{clean[:MAX_ID - 13]}-{digest}"


def experiment_group(cfg: DictConfig) -> str:
    resolved = {k: OmegaConf.to_container(v, resolve=True) if isinstance(v, DictConfig) else v
                for k in IDENTITY if (v := cfg.get(k)) is not None}
    ident = identity(resolved)
    cell = config_hash(seedless(ident, seed_following(ident)))
    return f"{cfg.attention_name}-{cfg.task.name}-{cfg.get('protocol')}-{cell}"


def run_name(cfg: DictConfig, run_id: str) -> str:
    return f"{cfg.attention_name}_{cfg.task.name}_{cfg.get('protocol')}_s{cfg.seed}_{run_id.rsplit('-', 1)[-1]}"


def wandb_settings(cfg: DictConfig, node: DictConfig, run_id: str) -> dict[str, Any]:
    """What to pass to the WandbLogger ``node`` besides its own settings: the derived ones it left null."""
    derived = {"id": wandb_id(run_id), "name": run_name(cfg, run_id), "group": experiment_group(cfg), "resume": "allow"}
    return {k: v for k, v in derived.items() if node.get(k) is None}


def record_link(record_path: str, run_id: str) -> dict[str, str]:
    """The config entries that lead from a W&B run back to its JSON record."""
    return {"suite/record": record_path, "suite/run_id": run_id}
