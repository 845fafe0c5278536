"""Periodic progress lines for long data work (generation, caching): ``count/total``, rate and ETA,
at most every ``every_s`` seconds, so a first run never sits silent for minutes."""
from __future__ import annotations

import time


def human(seconds: float) -> str:
    """``3h 05m``, ``4m 12s``, ``9s``."""
    seconds = int(round(max(seconds, 0.0)))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h {m:02d}m" if h else f"{m}m {s:02d}s" if m else f"{s}s"


class Progress:
    """``update(done)`` prints ``<label>: done/total unit (rate/s, eta ...)`` when ``every_s`` passed."""

    def __init__(self, label: str, total: int, unit: str, every_s: float = 10.0) -> None:
        self.label, self.total, self.unit, self.every_s = label, total, unit, every_s
        self.start = self.last = time.perf_counter()
        self.done = 0
        self.lines = 0

    def update(self, done: int) -> None:
        self.done = done
        now = time.perf_counter()
        if now - self.last >= self.every_s and done < self.total:
            self.last = now
            self._say(now, f", eta {human((self.total - done) / self._rate(now))}" if done else "")

    def finish(self) -> None:
        self._say(time.perf_counter(), "", final=True)

    def _rate(self, now: float) -> float:
        return self.done / max(now - self.start, 1e-9)

    def _say(self, now: float, tail: str, final: bool = False) -> None:
        took = f" in {human(now - self.start)}" if final else ""
        print(f"{self.label}: {self.done}/{self.total} {self.unit}{took} ({self._rate(now):.0f}/s{tail})",
              flush=True)
        self.lines += 1
