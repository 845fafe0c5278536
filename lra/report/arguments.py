"""The report's settings, checked before anything is read or created: a mistyped ``report.metric``, a
``report.compare`` naming one variant or one without runs, and an empty or mistyped results folder
(``report.results_dir`` or one of ``report.also``) are user errors (``run.py`` prints one paragraph and exits 2), never an empty report with exit 0.

:func:`check_report_config` is the one check of these settings; :func:`lra.report.build.run_report`
runs it first thing (after run.py's general checks, :mod:`lra.checks`, which leave the report's folders
alone). ``report.out_dir`` is by default the results folder itself, so a mistyped folder is reported,
not made: it is checked for writing only once it is known to hold run records. A separate
``report.out_dir`` is a folder of its own, checked (and created) first.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

from lra.badinput import ConfigError, DataMissingError
from lra.files import ensure_writable
from lra.records import load_records, record_files
from lra.report.cells import row_name
from lra.report.screening import METRICS


def check_metric(metric: Any) -> str:
    if metric not in METRICS:
        raise ConfigError(f"report.metric={metric!r} is not a metric of the run records; valid: {', '.join(METRICS)} "
                          f"(e.g. report.metric=test_acc)")
    return str(metric)


def check_compare_shape(compare: Any) -> tuple[str, str] | None:
    """None, or the two distinct row names of ``report.compare``: variants, or a self-pretrained row
    against its from-scratch one (``'report.compare=["adamra +SPT(mlm)",adamra]'``)."""
    if compare is None:
        return None
    names = [str(compare)] if isinstance(compare, (str, int, float)) else [str(c) for c in compare]
    if len(names) != 2 or names[0] == names[1] or not all(names):
        raise ConfigError(f"report.compare={names} must name two different variants, e.g. report.compare=[adamra,linear] "
                          "(every variant is already tested against softmax)")
    return names[0], names[1]


def check_results_dir(results_dir: Any) -> Path:
    path = Path(str(results_dir)).expanduser()
    fix = ("point LRA_RESULTS_DIR (or report.results_dir) at the folder your runs wrote (it holds runs/*.json), "
           "or train first, e.g. python run.py experiment=quick attention=softmax task=listops")
    if not path.is_dir():
        raise DataMissingError(f"results folder {path} does not exist; {fix}")
    if not record_files(path):
        raise DataMissingError(f"results folder {path} holds no run records (no {path / 'runs'}/*.json); {fix}")
    return path


def check_also(also: Any, results_dir: Path) -> list[Path]:
    """The folders of ``report.also``: each a results folder with records, none the report's own
    folder and none named twice (their records would be counted twice)."""
    if also is None:
        return []
    names = [str(also)] if isinstance(also, (str, Path)) else [str(a) for a in also]
    folders, seen = [], {results_dir.resolve()}
    for name in names:
        path = Path(name).expanduser()
        if path.resolve() in seen:
            raise ConfigError(f"report.also={names} names {name} twice or names the report's own folder "
                              f"({results_dir}); list each other results folder once, e.g. "
                              "'report.also=[results/xiong2021-listops-cpu]'")
        if not path.is_dir() or not record_files(path):
            raise DataMissingError(f"report.also: {path} is not a results folder with run records (no {path / 'runs'}/*.json); "
                                   "name folders that runs wrote, e.g. 'report.also=[results/xiong2021-listops-cpu]'")
        seen.add(path.resolve())
        folders.append(path)
    return folders


def check_compare_names(pair: tuple[str, str] | None, results_dir: Path, also: Sequence[Path] = ()) -> None:
    if pair is None:
        return
    records = [r for folder in (results_dir, *also) for r in load_records(folder)[0]]
    have = sorted({row_name(r) for r in records if r.get("mode") == "train" and r.get("status") == "finished"})
    missing = [n for n in pair if n not in have]
    if missing:
        raise ConfigError(f"report.compare=[{pair[0]},{pair[1]}] names {', '.join(missing)}, which no finished training "
                          f"record in {results_dir}{' or report.also' if also else ''} has; variants with finished runs: {', '.join(have) or 'none'}")


def check_report_config(cfg: Any) -> None:
    """Every report setting a user can get wrong (see the module docstring)."""
    rc = cfg.report
    check_metric(rc.get("metric"))
    pair = check_compare_shape(rc.get("compare"))
    out, results = rc.get("out_dir"), rc.get("results_dir")
    own = out is not None and results is not None and Path(str(out)).expanduser().resolve() != Path(str(results)).expanduser().resolve()
    if own:
        ensure_writable(Path(str(out)), "report out dir")  # a folder of its own: creating it is what the user asked
    folder = check_results_dir(results)
    if out is not None and not own:
        ensure_writable(folder, "report out dir")  # the results folder: the report writes there too
    check_compare_names(pair, folder, check_also(rc.get("also"), folder))
