"""``trainer.compile=true``: the network through ``torch.compile``, its recompiles counted and named.

Every variant has one path, with static shapes, no host read and counter-based random draws
(docs/compiled.md), so the compiled network computes what the eager one does. The network is compiled in place
(``nn.Module.compile``: checkpoints keep their keys, so a compiled run resumes an eager one and
back) with ``fullgraph=True`` (a graph break is an error naming its line, not a silent fallback) and
``dynamic=False``: every batch shape gets its own static graph. Training batches have one shape;
evaluation batches are cut to their longest real token rounded up to ``max_len / 8``
(:attr:`lra.data.datamodule.LRADataModule.eval_width_multiple`), so a run compiles a bounded number
of graphs (about 8 widths x train/eval x a last partial batch). More than ``compile_limit``
compiles of the network is a *recompile storm*: the run stops with the reasons Dynamo gave.
"""
from __future__ import annotations

import logging
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback

from lra.badinput import UserError

# Dynamo's "recompiles" artifact logger: one DEBUG record per recompile, with the failed guards.
RECOMPILES_LOGGER = "torch._dynamo.guards.__recompiles"


# Settings under ``trainer.`` that the suite reads and pl.Trainer does not take.
SUITE_TRAINER_KEYS = ("compile", "compile_limit")


def trainer_settings(trainer_cfg: Any) -> tuple[Any, CompileNetwork | None]:
    """``trainer_cfg`` without the suite's keys (what ``pl.Trainer`` is built from), and the
    compile callback when ``trainer.compile`` is on."""
    from omegaconf import OmegaConf

    settings = OmegaConf.to_container(trainer_cfg, resolve=True)
    compile_on = bool(settings.pop("compile", False))
    limit = settings.pop("compile_limit", None)
    return OmegaConf.create(settings), (CompileNetwork(32 if limit is None else int(limit)) if compile_on else None)


class RecompileStorm(UserError, RuntimeError):
    """The network was compiled more often than ``trainer.compile_limit`` allows (the record says
    failed; the user gets the reasons and the fix, not Dynamo's traceback)."""


class _Recompiles(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.reasons: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.reasons.append(record.getMessage())


class CompileNetwork(Callback):
    """Compiles ``pl_module.network`` at setup; :meth:`record_fields` gives the run record's
    ``compile`` entry (graphs compiled, recompiles and their first reasons)."""

    def __init__(self, limit: int = 32) -> None:
        if limit < 1:
            raise ValueError(f"trainer.compile_limit={limit} must be >= 1")
        self.limit = limit
        self.recompiles = _Recompiles()
        self._graphs_before = 0
        self._compiled = False

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if self._compiled:
            return
        from torch._dynamo.utils import counters

        torch._dynamo.config.recompile_limit = self.limit
        torch._dynamo.config.fail_on_recompile_limit_hit = True
        torch._logging.set_logs(recompiles=True)
        logger = logging.getLogger(RECOMPILES_LOGGER)
        logger.addHandler(self.recompiles)
        self._graphs_before = counters["stats"]["unique_graphs"]
        pl_module.network.compile(fullgraph=True, dynamic=False)
        self._compiled = True

    def teardown(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage != "fit":  # the test pass compiles too; keep listening until the run ends
            logging.getLogger(RECOMPILES_LOGGER).removeHandler(self.recompiles)

    def graphs(self) -> int:
        from torch._dynamo.utils import counters

        return counters["stats"]["unique_graphs"] - self._graphs_before

    def storm(self, error: BaseException) -> RecompileStorm | None:
        """The clear error for ``error`` if it is Dynamo's recompile-limit failure, else None."""
        from torch._dynamo.exc import FailOnRecompileLimitHit

        if not isinstance(error, FailOnRecompileLimitHit):
            return None
        reasons = "; ".join(_first_guard(r) for r in self.recompiles.reasons[-3:]) or "not logged"
        return RecompileStorm(
            f"trainer.compile: the network was compiled more than trainer.compile_limit={self.limit} times "
            f"({self.graphs()} graphs); last reasons: {reasons}. Each new batch shape or mode compiles anew: "
            "raise trainer.compile_limit, or run without trainer.compile")

    def record_fields(self) -> dict[str, Any]:
        return {"compile": {"enabled": True, "fullgraph": True, "dynamic": False, "graphs": self.graphs(),
                            "recompiles": len(self.recompiles.reasons), "limit": self.limit,
                            "recompile_reasons": [_first_guard(r) for r in self.recompiles.reasons[:8]]}}


def _first_guard(message: str) -> str:
    """The newest failed guard of a Dynamo recompile message (``tensor 'ids' size mismatch ...``)."""
    lines = [ln.strip() for ln in message.splitlines() if ln.strip().startswith("- ")]
    return lines[0][2:].split(": ", 1)[-1] if lines else message.strip().splitlines()[0]
