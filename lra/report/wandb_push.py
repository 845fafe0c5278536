"""Push a generated report (tables and plots) to one W&B run (``report.wandb=true``)."""
from __future__ import annotations

import csv
from pathlib import Path
from typing import Any


def push(out_dir: str | Path, files: list[str], project: str, name: str = "report", entity: str | None = None) -> str:
    """Log every CSV table as a ``wandb.Table`` and every PNG as an image; returns the run's directory.

    Runs offline when ``WANDB_MODE=offline`` (sync later with ``wandb sync``); the run is always finished.
    Returns only once the run is on disk: since wandb 0.2x ``run.finish()`` hands the last records to
    the wandb-core service and returns before the offline ``run-*.wandb`` log is flushed (measured with
    0.31.0: right after ``finish()`` the file often held only its 7-byte header, so the tables and
    plots were missing), so the service is shut down too (``wandb.teardown``, where it exists).
    """
    import wandb

    out = Path(out_dir)
    run = wandb.init(project=project, entity=entity, name=name, job_type="report", dir=str(out), reinit=True)
    try:
        payload: dict[str, Any] = {}
        for rel in files:
            path = out / rel
            if path.suffix == ".csv":
                rows = list(csv.reader(path.open(newline="")))
                if rows:
                    payload[f"tables/{path.stem}"] = wandb.Table(columns=rows[0], data=rows[1:])
            elif path.suffix == ".png":
                payload[f"plots/{path.stem}"] = wandb.Image(str(path))
        report_md = out / "report.md"
        if report_md.exists():
            run.summary["report_md"] = report_md.read_text()
        run.log(payload)
        return str(run.dir)
    finally:
        run.finish()
        teardown = getattr(wandb, "teardown", None)  # older wandb flushes in finish() already
        if teardown is not None:
            teardown()
