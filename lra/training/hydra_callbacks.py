"""Hydra callbacks of the suite: a sweep fails fast on an unusable results folder, and always ends with
a finished/skipped/failed summary and a non-zero exit status when any job failed (a job whose
configuration had already finished is "skipped", not counted as finished again).

Every job of a multirun leaves ``job_status.json`` in its output folder (:func:`record_job_outcome`,
called by ``run.py``); the summary reads those files, so it works with every launcher (in-process,
joblib workers, SLURM nodes that share the sweep folder). A job folder without one (the job was
killed, or crashed the interpreter) counts as failed.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback
from omegaconf import DictConfig

from lra.badinput import UserError, exit_user_error
from lra.files import ensure_writable, write_json

STATUS_FILE = "job_status.json"
EXIT_SWEEP_FAILED = 1


OK_STATUSES = ("finished", "skipped")  # skipped: the configuration had already finished (resume=auto)


def record_job_outcome(status: str, error: str | None = None) -> None:
    """Write this multirun job's outcome (``finished`` | ``skipped`` | ``failed``) into its Hydra output folder."""
    from hydra.core.hydra_config import HydraConfig

    hc = HydraConfig.get()
    write_json(Path(hc.runtime.output_dir) / STATUS_FILE,
               {"num": hc.job.num, "status": status, "error": error, "overrides": list(hc.overrides.task)})


class EnsureResultsDir(Callback):
    """Create the results dir before a sweep starts: sweepers keep state there (Optuna's sqlite
    study), and an unwritable path ends the sweep at once, naming it, instead of failing every job."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        try:
            ensure_writable(config.paths.results_dir, "results dir")
        except UserError as e:
            exit_user_error(e)  # SystemExit ends the whole multirun; any other exception is only a warning to Hydra


def summarize(sweep_dir: Path, since: float = 0.0) -> tuple[list[dict[str, Any]], str]:
    """The outcomes of the jobs under ``sweep_dir`` started at or after ``since``, and a summary text."""
    jobs: list[dict[str, Any]] = []
    for hydra_dir in sorted(Path(sweep_dir).rglob(".hydra")):
        job_dir = hydra_dir.parent
        if job_dir == Path(sweep_dir) or hydra_dir.stat().st_mtime < since - 1:
            continue
        status_file = job_dir / STATUS_FILE
        if status_file.is_file():
            jobs.append({**json.loads(status_file.read_text()), "dir": str(job_dir)})
        else:
            jobs.append({"num": None, "status": "failed", "dir": str(job_dir),
                         "error": "no job_status.json: the job was killed or crashed before it ended",
                         "overrides": []})
    jobs.sort(key=lambda j: (j["num"] is None, j["num"] if j["num"] is not None else 0, j["dir"]))
    failed = [j for j in jobs if j["status"] not in OK_STATUSES]
    skipped = sum(j["status"] == "skipped" for j in jobs)
    listed = [set(j["overrides"]) for j in jobs if j.get("overrides")]
    shared = set.intersection(*listed) if len(listed) > 1 else set()  # common to every job: not worth repeating
    lines = [f"[sweep] {len(jobs)} jobs: {len(jobs) - len(failed) - skipped} finished, "
             + (f"{skipped} skipped (already finished), " if skipped else "") + f"{len(failed)} failed ({sweep_dir})"]
    for j in failed:
        first = (j.get("error") or "").splitlines()[0] if j.get("error") else "unknown error"
        own = " ".join(o for o in j.get("overrides") or [] if o not in shared)  # what this job's sweep chose
        lines.append(f"[sweep]   failed: job {j['num'] if j['num'] is not None else '?'} "
                     f"({own or Path(j['dir']).name}): {first[:300]}")
    return jobs, "\n".join(lines)


class SweepSummary(Callback):
    """At the end of a multirun print finished/failed per job; exit non-zero when any job failed."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        self.started = time.time()
        self.sweep_dir = Path(str(config.hydra.sweep.dir))  # resolved once: ${now:...} is cached from here

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        sweep_dir = getattr(self, "sweep_dir", None) or Path(str(config.hydra.sweep.dir))
        jobs, text = summarize(sweep_dir, getattr(self, "started", 0.0))
        print(text, flush=True)
        if any(j["status"] not in OK_STATUSES for j in jobs):
            raise SystemExit(EXIT_SWEEP_FAILED)
