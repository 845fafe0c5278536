"""The single entry point of the suite.

    python run.py attention=adamra task=listops                 # train + test (mode=train)
    python run.py -m attention=softmax,linear task=listops,image # a sweep
    python run.py mode=bench attention=adamra                    # efficiency harness
    python run.py mode=report                                    # tables + plots from results/
    python run.py mode=check attention=mine                      # the attention contract on one variant
    python run.py mode=fetch task=text                           # download + verify + prepare real data
    python run.py --help                                         # modes, presets, choices, first steps

A mistake the user can fix (:class:`lra.badinput.UserError`: unknown name, invalid value, missing or
corrupt data, bad checkpoint, unwritable folder) is found before any work where it can be, by the
stages of :mod:`lra.checks` in their order (1. the command line, in :func:`cli`; 2. the composed
config and 3. the build, in :func:`checked_dispatch`), and printed alone, as one paragraph, with exit
status 2 (:func:`lra.badinput.exit_user_error`); ``HYDRA_FULL_ERROR=1`` shows its traceback. Any other
exception is a bug and keeps its traceback.
"""
from __future__ import annotations

import gc
import logging
import os
import signal
import sys
from typing import Any

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.types import RunMode
from omegaconf import DictConfig

from lra import CONF_DIR
from lra.badinput import UserError, exit_user_error
from lra.checks.build import check_build
from lra.checks.config import PropertiesFailed, check_config
from lra.checks.overrides import check_overrides
from lra.checks.variant_settings import check_variant_settings

log = logging.getLogger("run")


def dispatch(cfg: DictConfig) -> Any:
    """Run the mode that :func:`lra.checks.config.check_config` accepted (fetch never gets here)."""
    if cfg.mode in ("train", "test"):
        from lra.training.train import run

        if cfg.get("pretrain") is not None and cfg.mode == "train":  # +pretrain=...: its own run first
            from lra.training.pretrain import pretrain_stage

            pretrain_stage(cfg)  # run, resumed or found finished (lra/training/pretrain.py)
        return run(cfg)
    if cfg.mode == "bench":
        from lra.bench.cli import run_bench

        return run_bench(cfg)  # checks its own settings first (lra.bench.harness.check_settings)
    if cfg.mode == "check":
        from lra.checks.variant import run_check

        return run_check(cfg)  # the attention contract on one variant; exit status 1 on a failed property
    if cfg.mode == "report":
        from lra.report.build import run_report

        return run_report(cfg)  # checks its own settings first (lra.report.arguments), then pools by lra.identity
    raise AssertionError(f"mode={cfg.mode!r} passed check_config but has no dispatch")


def checked_dispatch(cfg: DictConfig) -> Any:
    """Check everything that can be checked without the data (stages 2 and 3 of lra.checks), then run."""
    check_config(cfg)
    if cfg.mode in ("train", "test", "bench", "check"):
        check_variant_settings(cfg)  # the attention's settings against its class's signature (torch)
    if cfg.mode in ("train", "test"):
        check_build(cfg)
    return dispatch(cfg)


@hydra.main(version_base="1.3", config_path="conf", config_name="config")
def main(cfg: DictConfig) -> float | None:
    """Returns the best validation accuracy of a training run: the objective of sweepers (Optuna)."""
    multirun = HydraConfig.get().mode == RunMode.MULTIRUN
    try:
        result = checked_dispatch(cfg)
    except PropertiesFailed as e:  # mode=check: the table said which and why
        if not multirun:
            raise SystemExit(1) from None
        from lra.training.hydra_callbacks import record_job_outcome

        log.error("job %s: %s", HydraConfig.get().job.num, e)
        record_job_outcome("failed", str(e))
        return None
    except Exception as e:
        from lra.training.wandb_check import explain

        e = explain(e) or e  # W&B failing when its run starts: the same one paragraph, with the offline hint
        if not multirun:
            if isinstance(e, UserError):
                exit_user_error(e)
            raise
        # In a sweep one failing job must not stop the others: its record and job_status say "failed".
        from lra.training.hydra_callbacks import record_job_outcome

        num = HydraConfig.get().job.num
        if isinstance(e, UserError):
            log.error("job %s failed: %s", num, e)
        else:
            log.exception("job %s failed; the sweep goes on", num)
        record_job_outcome("failed", str(e) if isinstance(e, UserError) else f"{type(e).__name__}: {e}")
        # the worst accuracy, so an Optuna study records the trial instead of aborting on NaN
        return float("-inf") if cfg.get("mode") == "train" else None
    if multirun:
        from lra.training.hydra_callbacks import record_job_outcome

        skipped = isinstance(result, dict) and result.get("skipped")  # this configuration had already finished
        record_job_outcome("skipped" if skipped else "finished")
    if cfg.mode == "train" and isinstance(result, dict):
        best = result.get("best_val_acc")
        return float("-inf") if best is None else float(best)
    return None


def fetch_cli(argv: list[str]) -> None:
    """``mode=fetch``: downloads, not a run, so no Hydra run or output folder (lra/data/fetch.py)."""
    from lra.data.fetch import run_overrides

    try:
        run_overrides(argv, CONF_DIR, check_overrides)
    except UserError as e:
        exit_user_error(e)
    except KeyboardInterrupt as e:
        print(f"run.py: {str(e) or 'interrupted'}", file=sys.stderr)
        sys.exit(130)


def cli(argv: list[str] | None = None) -> None:
    """``python run.py ARGS``: check the command line's names, then hand over to Hydra."""
    argv = sys.argv[1:] if argv is None else argv
    from lra.training.usage import usage, wants_help

    if wants_help(argv):  # ours: modes, presets, first commands (Hydra's is --hydra-help)
        print(usage(CONF_DIR))
        return
    if "mode=fetch" in argv:
        return fetch_cli(argv)
    from lra.training.quiet import quiet_third_party

    quiet_third_party()  # known third-party noise, each with its reason; never the suite's own warnings
    try:
        check_overrides(argv, CONF_DIR)  # stage 1 of lra.checks
    except UserError as e:
        exit_user_error(e)
    try:
        main()
    except KeyboardInterrupt as e:  # Ctrl-C/SIGTERM: one line (the record says the rest), no traceback
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # decided: a further press must not cut the line or the exit
        print(f"run.py: {str(e) or 'interrupted'}", file=sys.stderr)
        gc.freeze()  # no final collection of torch's object graph at exit: measured 3.6 s of a 3.7 s exit under load
        sys.exit(130)


if __name__ == "__main__":
    cli()
