"""SMAT, the speed-memory-accuracy trade-off of AdaMRA (eq. 10):

    SMAT = S_norm + (1 - M_norm) + Acc_norm

S = examples per second, M = peak memory, Acc = LRA average, each min-max normalised over the
models compared (scikit-learn's MinMaxScaler: ``(x - min) / (max - min)``; a column with zero range,
e.g. a single model, normalises to 0 as MinMaxScaler does).

The paper adds the normalised values AS PRINTED, rounded to two decimals: its Table 3 gives
BigBird 0.12 + (1 - 0.30) + 0.61 = 1.43 where the unrounded sum is 1.4356. ``round_to=2`` (the
default) does the same, so the published scores are reproduced; ``round_to=None`` gives the exact
sum (it differs from the rounded one by less than 0.015). The report uses the paper's rounding only
for the paper's own rows (where it reproduces Table 3); the suite's rows are exact sums, stored
unrounded (:mod:`lra.report.efficiency`).
"""
from __future__ import annotations

# One model's figures, (name, examples/s, peak MB, accuracy), in two kinds:
SmatPoint = tuple[str, float | None, float | None, float | None]  # a SMAT table row: None = missing, not scored
TradeoffPoint = tuple[str, float, float | None, float]  # a bubble-chart circle: has speed and accuracy; MB None = not drawn


def minmax(values: list[float]) -> list[float]:
    lo, hi = min(values), max(values)
    return [0.0 if hi == lo else (v - lo) / (hi - lo) for v in values]


def smat_scores(
    speed: list[float], memory: list[float], accuracy: list[float], round_to: int | None = 2,
) -> list[dict[str, float]]:
    """Per model: normalised speed, memory and accuracy, and the SMAT score (eq. 10)."""
    if not (len(speed) == len(memory) == len(accuracy)) or not speed:
        raise ValueError("smat_scores needs equally long, non-empty speed/memory/accuracy lists")
    r = (lambda v: round(v, round_to)) if round_to is not None else (lambda v: v)  # noqa: E731
    s, m, a = ([r(v) for v in minmax(x)] for x in (speed, memory, accuracy))
    return [{"s_norm": si, "m_norm": mi, "acc_norm": ai, "smat": r(si + (1.0 - mi) + ai)} for si, mi, ai in zip(s, m, a)]
