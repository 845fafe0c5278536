"""The single entry point of the suite.

    python run.py attention=adamra task=listops                 # train + test (mode=train)
    python run.py -m attention=softmax,linear task=listops,image # a sweep
    python run.py mode=bench attention=adamra                    # efficiency harness
    python run.py mode=report                                    # tables + plots from results/
"""
from __future__ import annotations

import logging
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

log = logging.getLogger("run")
MODES = ("train", "test", "bench", "report")


def dispatch(cfg: DictConfig):
    if cfg.mode not in MODES:
        raise ValueError(f"unknown mode={cfg.mode!r}; valid modes: {', '.join(MODES)}")
    if cfg.mode in ("train", "test"):
        from lra.train import run

        return run(cfg)
    if cfg.mode == "bench":
        from lra.bench import run_bench

        return run_bench(cfg)
    from lra.report import run_report

    return run_report(cfg)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    """Returns the best validation accuracy of a training run: the objective of sweepers (Optuna)."""
    try:
        result = dispatch(cfg)
    except Exception:
        # In a sweep one failing job must not stop the others: its record says "failed".
        if HydraConfig.get().mode == RunMode.MULTIRUN:
            log.exception("job %s failed; the sweep goes on", HydraConfig.get().job.num)
            # the worst accuracy, so an Optuna study records the trial instead of aborting on NaN
            return float("-inf") if cfg.mode == "train" else None
        raise
    if cfg.mode == "train" and isinstance(result, dict):
        best = result.get("best_val_acc")
        return float("-inf") if best is None else float(best)
    return None


if __name__ == "__main__":
    try:
        main()
    except KeyboardInterrupt as e:  # Ctrl-C/SIGTERM: one line (the record says the rest), no traceback
        print(f"run.py: {e or 'interrupted'}", file=sys.stderr)
        sys.exit(130)
