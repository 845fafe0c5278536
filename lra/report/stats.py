"""The statistics behind the report's intervals, tests and marks.

Choices, written down (the report repeats them in its table titles and notes):

* Interval of an accuracy cell: the t-interval of the seed mean (mean +- t_{0.975, n-1} s / sqrt(n)),
  n >= 2 seeds; one seed has no interval. The training seed is the unit of replication: the test
  examples are the same for every seed, so resampling them says nothing about another training run.
* Seed-level tests need :data:`MIN_SEEDS` (3) seeds per side: with 2 a t-test has one degree of
  freedom, and its p-value rests on a single spread estimate. Paired t (same seed = same
  initialisation stream and data order) when both cells hold the same seeds, else Welch's t over all
  seeds of each side: a test is over the seeds its cells display (:mod:`lra.report.comparisons`). Accuracies move in steps of one test example (100 / n_test points),
  so a spread below one step is rounding, not evidence that the seeds agree: every standard
  deviation is floored at one step (:func:`spread_floor`); without the floor, equal per-seed
  differences give p = 0 and a zero-width interval.
* McNemar's exact two-sided mid-p (Fagerland et al. 2013) compares two trained networks on the same
  test examples, with a paired bootstrap interval: a statement about this pair of runs, never about
  two architectures (two seeds of one architecture differ "significantly" too), so it is reported
  apart and is never corrected with, or marked like, the seed-level tests.
* Several comparisons: Holm's step-down correction over a declared family.
* Across tasks: the mean over tasks of each task's seed mean, with a t-interval on the stratified
  variance (se^2 = sum_k s_k^2 / n_k / K^2, each s_k floored at one test example of task k) and
  Welch-Satterthwaite degrees of freedom (:func:`stratified_t_interval`). With one task it is that
  cell's t-interval. A simulation (tests/report/test_report_stats.py) puts its coverage at 94.5-95.7%
  with 3 or 5 seeds per task and 1 or 5 tasks; the stratified percentile bootstrap it replaces
  covered 74-87% there (with 3 seeds per task it cannot reach past the seeds' range).
  The probability of improvement P(A > B) = mean over tasks of P(x_A > x_B) over all seed pairs
  (ties count 1/2; rliable, Agarwal et al. 2021) is printed without an interval: its stratified
  percentile bootstrap covered 85-93% at 3-5 seeds per side, and with 3 x 3 seed pairs no interval
  is validated here. The seed-level tests are the inference; P(> softmax) describes.
* Accuracy by length: a two-level percentile bootstrap (seeds, then the bucket's test examples).
* Convergence failure: a test accuracy inside the chance band (:func:`chance_band`).
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
MIN_SEEDS = 3  # seeds per side before a seed-level test is run
BOOTSTRAP_METHOD = f"percentile bootstrap, {BOOTSTRAP_SAMPLES} resamples, seed {BOOTSTRAP_SEED}"


def spread_floor(n_test: int) -> float:
    """One test example, in accuracy points: the smallest spread accuracies on ``n_test`` examples can show."""
    if n_test <= 0:
        raise ValueError(f"the spread floor needs a positive number of test examples (got {n_test})")
    return 100.0 / n_test


def t_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float, float]:
    """(mean, low, high) of the mean of ``values`` (n >= 2)."""
    x = np.asarray(values, dtype=float)
    if x.size < 2:
        raise ValueError("a t-interval needs at least two values")
    mean, se = float(x.mean()), float(x.std(ddof=1) / math.sqrt(x.size))
    half = float(_st.t.ppf(0.5 + level / 2, x.size - 1)) * se
    return mean, mean - half, mean + half


@dataclass(frozen=True)
class Comparison:
    kind: str          # "paired t (seeds)" | "Welch t (seeds)" | "McNemar mid-p (examples)"
    n: int             # seed pairs (paired t), the variant's seeds (Welch), or test examples (McNemar)
    diff: float        # variant - baseline, in the units given (accuracy fraction or %)
    low: float
    high: float
    p: float
    n_baseline: int | None = None  # Welch: the baseline's seeds


def _t_result(kind: str, diff: float, se: float, dof: float, level: float, n: int,
              n_baseline: int | None = None) -> Comparison:
    if not se > 0:
        raise ValueError("a t-test needs a positive standard error: pass a spread floor (spread_floor)")
    half = float(_st.t.ppf(0.5 + level / 2, dof)) * se
    p = float(2 * _st.t.sf(abs(diff / se), dof))
    return Comparison(kind, n, diff, diff - half, diff + half, p, n_baseline)


def paired_t(variant: Sequence[float], baseline: Sequence[float], floor: float, level: float = LEVEL) -> Comparison:
    """Paired t-test over seed pairs (same order in both sequences); the standard deviation of the
    differences is at least ``floor`` (see :func:`spread_floor`)."""
    d = np.asarray(variant, dtype=float) - np.asarray(baseline, dtype=float)
    if d.size < 2:
        raise ValueError("a paired t-test needs at least two pairs")
    sd = max(float(d.std(ddof=1)), floor)
    return _t_result("paired t (seeds)", float(d.mean()), sd / math.sqrt(d.size), d.size - 1, level, d.size)


def welch_t(variant: Sequence[float], baseline: Sequence[float], floor: float, level: float = LEVEL) -> Comparison:
    """Welch's unequal-variance t-test over independent seeds; each side's standard deviation is at
    least ``floor``. Degrees of freedom: Welch-Satterthwaite."""
    a, b = np.asarray(variant, dtype=float), np.asarray(baseline, dtype=float)
    if a.size < 2 or b.size < 2:
        raise ValueError("Welch's t-test needs at least two values per side")
    va, vb = (max(float(x.std(ddof=1)), floor) ** 2 / x.size for x in (a, b))
    dof = (va + vb) ** 2 / (va ** 2 / (a.size - 1) + vb ** 2 / (b.size - 1))
    return _t_result("Welch t (seeds)", float(a.mean() - b.mean()), math.sqrt(va + vb), dof, level, a.size, b.size)


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


def stratified_t_interval(strata: Sequence[Sequence[float]], floors: Sequence[float] | None = None,
                          level: float = LEVEL) -> tuple[float, float, float]:
    """(mean over strata of each stratum's mean, low, high): a t-interval on the stratified variance
    with Welch-Satterthwaite degrees of freedom; the Avg column's interval. A percentile bootstrap
    over 3 seeds per task covers 74-84%, this about 95% (see the module notes). ``floors``: each
    stratum's smallest standard deviation (:func:`spread_floor` of its test set; 0 where unknown)."""
    if not strata or any(len(s) < 2 for s in strata):
        raise ValueError("a stratified t-interval needs at least two values in every stratum")
    floors = [0.0] * len(strata) if floors is None else list(floors)
    if len(floors) != len(strata):
        raise ValueError("one spread floor per stratum")
    xs = [np.asarray(s, dtype=float) for s in strata]
    mean = float(np.mean([x.mean() for x in xs]))
    v = [max(float(x.std(ddof=1)), f) ** 2 / x.size for x, f in zip(xs, floors)]  # var of each stratum's mean
    total = sum(v)
    if total == 0:  # every stratum without spread and no floor: nothing to widen by
        return mean, mean, mean
    dof = total ** 2 / sum(vk ** 2 / (x.size - 1) for vk, x in zip(v, xs))
    half = float(_st.t.ppf(0.5 + level / 2, dof)) * math.sqrt(total) / len(xs)
    return mean, mean - half, mean + half


def _improvement(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """P(x > y) over all pairs, ties 1/2, along the last two axes of x[..., n, 1] and y[..., 1, m]."""
    return ((x > y) + 0.5 * (x == y)).mean(axis=(-2, -1))


def probability_of_improvement(variant: Sequence[Sequence[float]], baseline: Sequence[Sequence[float]]) -> float:
    """P(A > B) over tasks (rliable): per task the fraction of (seed of A, seed of B) pairs where A
    scores higher (ties 1/2), averaged over tasks. No interval (see the module notes)."""
    if len(variant) != len(baseline) or not variant:
        raise ValueError("the probability of improvement needs the same tasks on both sides")
    point = [float(_improvement(np.asarray(xs, dtype=float)[:, None], np.asarray(ys, dtype=float)[None, :]))
             for xs, ys in zip(variant, baseline)]
    return float(np.mean(point))


def seeds_examples_bootstrap(correct: np.ndarray, level: float = LEVEL, samples: int = BOOTSTRAP_SAMPLES,
                             seed: int = BOOTSTRAP_SEED) -> tuple[float, float, float]:
    """(accuracy, low, high) of ``correct[seed, example]`` (the same examples for every seed): a
    two-level percentile bootstrap, seeds resampled, then the examples (the same resampled examples
    for every seed of a replicate, since the seeds share one test set). With one seed: examples only."""
    c = np.asarray(correct, dtype=float)
    if c.ndim != 2 or c.size == 0:
        raise ValueError("seeds_examples_bootstrap needs a non-empty [seeds, examples] array")
    rng = np.random.default_rng(seed)
    boot = np.empty(samples)
    chunk = max(1, 2_000_000 // c.size)
    for start in range(0, samples, chunk):
        k = min(chunk, samples - start)
        si = rng.integers(0, c.shape[0], size=(k, c.shape[0]))
        ei = rng.integers(0, c.shape[1], size=(k, c.shape[1]))
        boot[start:start + k] = c[si[:, :, None], ei[:, None, :]].mean(axis=(1, 2))
    lo, hi = np.quantile(boot, [(1 - level) / 2, (1 + level) / 2])
    return float(c.mean()), float(lo), float(hi)


def chance_band(labels: np.ndarray, level: float = LEVEL) -> tuple[float, float]:
    """(chance, upper edge) for a test set: chance = the accuracy of always predicting its most
    frequent label; the upper edge adds the two-sided ``level`` normal quantile of that accuracy's
    sampling error (z sqrt(c (1 - c) / n)). A test accuracy at or below the edge is one a model with
    no skill beyond the majority class could score: a convergence failure."""
    y = np.asarray(labels).ravel()
    if y.size == 0:
        raise ValueError("a chance band needs test labels")
    c = float(np.unique(y, return_counts=True)[1].max() / y.size)
    return c, c + float(_st.norm.ppf(0.5 + level / 2)) * math.sqrt(c * (1 - c) / y.size)


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
