"""The statistics behind the report's intervals and significance marks.

Choices, written down:

* Interval of an accuracy cell: with n >= 2 seeds, the t-interval of the seed mean
  (mean +- t_{0.975, n-1} s / sqrt(n)); with one seed, a percentile bootstrap over the test examples
  (B = 2000 resamples, fixed generator seed, so the same records give the same report).
* Variant against baseline: with >= 2 seeds run by both, a paired t-test over the seed pairs (same
  seed = same initialisation stream and data order), difference = mean of the per-seed differences.
  With one seed, McNemar's test on the same test examples, exact two-sided mid-p (Fagerland et al.
  2013: better calibrated than the exact test, which is conservative), and a paired bootstrap
  interval of the accuracy difference.
* Several comparisons: Holm's step-down correction (controls the family-wise error rate without
  assuming independence); the family is every comparison of one report table.
* Scaling: ``y = a N^alpha`` fitted by least squares on (log N, log y); alpha's 95% interval is the
  slope's t-interval with n - 2 degrees of freedom (none with two lengths).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import stats as _st

BOOTSTRAP_SAMPLES = 2000
BOOTSTRAP_SEED = 0
LEVEL = 0.95


def t_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float, float]:
    """(mean, low, high) of the mean of ``values`` (n >= 2)."""
    x = np.asarray(values, dtype=float)
    if x.size < 2:
        raise ValueError("a t-interval needs at least two values")
    mean, se = float(x.mean()), float(x.std(ddof=1) / math.sqrt(x.size))
    half = float(_st.t.ppf(0.5 + level / 2, x.size - 1)) * se
    return mean, mean - half, mean + half


def bootstrap_interval(correct: np.ndarray, level: float = LEVEL, samples: int = BOOTSTRAP_SAMPLES,
                       seed: int = BOOTSTRAP_SEED) -> tuple[float, float, float]:
    """(accuracy, low, high): percentile bootstrap over the test examples."""
    c = np.asarray(correct, dtype=float)
    if c.size == 0:
        raise ValueError("bootstrap over an empty set of test examples")
    idx = np.random.default_rng(seed).integers(0, c.size, size=(samples, c.size))
    boot = c[idx].mean(axis=1)
    lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    return float(c.mean()), float(lo), float(hi)


@dataclass(frozen=True)
class Comparison:
    kind: str          # "paired t (seeds)" | "McNemar mid-p (examples)"
    n: int             # seed pairs or test examples
    diff: float        # variant - baseline, in the units given (accuracy fraction or %)
    low: float
    high: float
    p: float


def paired_t(variant: Sequence[float], baseline: Sequence[float], level: float = LEVEL) -> Comparison:
    """Paired t-test over seed pairs (same order in both sequences)."""
    d = np.asarray(variant, dtype=float) - np.asarray(baseline, dtype=float)
    if d.size < 2:
        raise ValueError("a paired t-test needs at least two pairs")
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    if sd == 0.0:
        return Comparison("paired t (seeds)", d.size, mean, mean, mean, 1.0 if mean == 0 else 0.0)
    se = sd / math.sqrt(d.size)
    half = float(_st.t.ppf(0.5 + level / 2, d.size - 1)) * se
    p = float(2 * _st.t.sf(abs(mean / se), d.size - 1))
    return Comparison("paired t (seeds)", d.size, mean, mean - half, mean + half, p)


def mcnemar_midp(b: int, c: int) -> float:
    """Two-sided mid-p McNemar test on the discordant pairs: ``b`` examples only the variant got
    right, ``c`` only the baseline. p = 2 P(X < min) + P(X = min), X ~ Bin(b + c, 1/2), capped at 1."""
    n, k = b + c, min(b, c)
    if n == 0:
        return 1.0
    p = 2 * _st.binom.cdf(k, n, 0.5) - _st.binom.pmf(k, n, 0.5)
    return float(min(1.0, p))


def paired_examples(variant_correct: np.ndarray, baseline_correct: np.ndarray, level: float = LEVEL,
                    samples: int = BOOTSTRAP_SAMPLES, seed: int = BOOTSTRAP_SEED) -> Comparison:
    """McNemar mid-p on the same test examples, with a paired bootstrap interval of the accuracy
    difference (the same resampled examples for both)."""
    v, b = np.asarray(variant_correct, dtype=bool), np.asarray(baseline_correct, dtype=bool)
    if v.shape != b.shape or v.size == 0:
        raise ValueError(f"paired examples need equally many test examples (got {v.size} and {b.size})")
    d = v.astype(float) - b.astype(float)
    idx = np.random.default_rng(seed).integers(0, d.size, size=(samples, d.size))
    lo, hi = np.quantile(d[idx].mean(axis=1), [(1 - level) / 2, (1 + level) / 2])
    p = mcnemar_midp(int((v & ~b).sum()), int((~v & b).sum()))
    return Comparison("McNemar mid-p (examples)", d.size, float(d.mean()), float(lo), float(hi), p)


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm-adjusted p-values, in the input order: sorted ascending, p_(i) * (m - i) with a running
    maximum, capped at 1."""
    m = len(pvalues)
    order = sorted(range(m), key=lambda i: pvalues[i])
    adjusted, running = [0.0] * m, 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (m - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


@dataclass(frozen=True)
class PowerFit:
    a: float
    alpha: float
    low: float | None   # alpha's 95% interval; None with two points
    high: float | None
    n: int


def fit_power_law(lengths: Sequence[float], values: Sequence[float], level: float = LEVEL) -> PowerFit:
    """Least squares of log y = log a + alpha log N (positive values only, >= 2 lengths)."""
    x, y = np.log(np.asarray(lengths, dtype=float)), np.log(np.asarray(values, dtype=float))
    if x.size < 2 or np.ptp(x) == 0:
        raise ValueError("a power-law fit needs at least two different lengths")
    xm, ym = x.mean(), y.mean()
    sxx = float(((x - xm) ** 2).sum())
    alpha = float(((x - xm) * (y - ym)).sum() / sxx)
    a = float(math.exp(ym - alpha * xm))
    if x.size < 3:
        return PowerFit(a, alpha, None, None, x.size)
    resid = y - (ym + alpha * (x - xm))
    se = math.sqrt(float((resid ** 2).sum()) / (x.size - 2) / sxx)
    half = float(_st.t.ppf(0.5 + level / 2, x.size - 2)) * se
    return PowerFit(a, alpha, alpha - half, alpha + half, x.size)


def length_buckets(lengths: np.ndarray, n_buckets: int = 4) -> np.ndarray:
    """Bucket edges at the quantiles of the real lengths (duplicates merged): ``k + 1`` edges; an
    example of length L is in bucket i when edges[i] <= L < edges[i+1] (the last bucket includes its
    upper edge)."""
    q = np.quantile(np.asarray(lengths, dtype=float), np.linspace(0, 1, n_buckets + 1))
    edges = np.unique(np.round(q))
    return edges if edges.size > 1 else np.array([edges[0], edges[0]])


def bucket_of(lengths: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """Bucket index per example (see :func:`length_buckets`)."""
    return np.clip(np.searchsorted(edges, np.asarray(lengths, dtype=float), side="right") - 1, 0, len(edges) - 2)
