"""Expected user errors, and the corrupt-record policy shared by the readers of external data
(AAN TSVs, Pathfinder PNGs, IMDb files).

:class:`UserError` is the one type of every mistake a user can fix (an unknown name, an invalid
value, missing or corrupt data, a checkpoint that does not fit, an unwritable folder): every command line (``run.py``, its sweep
callbacks, ``python -m lra.data.fetch``) ends on one through :func:`exit_user_error`, which prints its
message alone, as one paragraph, and exits with :data:`EXIT_USER_ERROR` (``HYDRA_FULL_ERROR=1``
shows the traceback); any other exception is a bug and keeps its traceback.
The subclasses also derive from the builtin type a caller would expect (``ValueError``,
``FileNotFoundError``, ``PermissionError``), so ``except ValueError`` keeps working.

Each bad record is reported with where it is (``file:line`` or file name) and why. ``on_error="skip"``
(the default) drops it and counts it; the read fails once more than ``max_fraction`` of the records
were bad (default 1%), since then the data is more likely broken than merely dirty. ``"fatal"``
fails on the first one.
"""
from __future__ import annotations

import gc
import os
import sys
from typing import Callable, NoReturn

POLICIES = ("skip", "fatal")


EXIT_USER_ERROR = 2


class UserError(Exception):
    """A mistake the user can fix; the message names the problem and the fix."""


class ConfigError(UserError, ValueError):
    """An unknown name or an invalid value in the configuration."""


class DataMissingError(UserError, FileNotFoundError):
    """External data, a checkpoint or another input file that is not where the configuration says."""


class NotWritableError(UserError, PermissionError):
    """A folder the run must write to cannot be created or written."""


class BadInputError(UserError, ValueError):
    """Corrupt data: bad records, unreadable files, a checkpoint that does not fit the model."""


class DivergedError(UserError, FloatingPointError):
    """The loss became NaN/inf: an outcome of the settings (the learning rate, most often), recorded
    as ``diverged``; the user needs the step and the fix, not Lightning's traceback."""


def full_error_wanted() -> bool:
    """``HYDRA_FULL_ERROR=1``: show the traceback of user errors too."""
    return os.environ.get("HYDRA_FULL_ERROR", "") not in ("", "0")


def exit_user_error(error: UserError) -> NoReturn:
    """The one way a command line ends on a user error: ``error: <message>`` as one paragraph on
    stderr, exit status :data:`EXIT_USER_ERROR`; under ``HYDRA_FULL_ERROR=1`` the error itself, with
    its traceback. ``SystemExit``, not a return value: raised in a Hydra callback, any other
    exception would only be a warning to Hydra."""
    if full_error_wanted():
        raise error
    print(f"error: {error}", file=sys.stderr, flush=True)
    gc.freeze()  # exit without the final collection of whatever was imported (seconds under load once torch is in)
    raise SystemExit(EXIT_USER_ERROR)


class BadInput:
    def __init__(self, what: str, on_error: str = "skip", max_fraction: float = 0.01, show: int = 5,
                 log: Callable[[str], None] | None = print) -> None:
        if on_error not in POLICIES:
            raise ConfigError(f"unknown on_error={on_error!r}; valid: {', '.join(POLICIES)}")
        if not 0.0 <= max_fraction <= 1.0:
            raise ConfigError(f"max_bad_fraction={max_fraction} must lie in [0, 1]")
        self.what, self.on_error, self.max_fraction, self.show, self.log = what, on_error, max_fraction, show, log
        self.records: list[str] = []

    @property
    def count(self) -> int:
        return len(self.records)

    def report(self, where: str, why: str) -> None:
        """One bad record; raises under ``fatal``."""
        message = f"{where}: {why}"
        if self.on_error == "fatal":
            raise BadInputError(f"{self.what}: corrupt record {message} (set on_error=skip to skip and count such records)")
        self.records.append(message)

    def finish(self, total: int) -> None:
        """Summarise (``total`` = records read, bad ones included); fail above ``max_fraction``."""
        if not self.records:
            return
        examples = "; ".join(self.records[: self.show])
        frac = self.count / max(total, 1)
        summary = f"{self.what}: skipped {self.count} of {total} records ({frac:.2%}), e.g. {examples}"
        if frac > self.max_fraction:
            raise BadInputError(f"{summary}. That is more than max_bad_fraction={self.max_fraction:.2%}: "
                                "the data looks broken; check the files (or raise max_bad_fraction)")
        if self.log:
            self.log(f"[warning] {summary}")
