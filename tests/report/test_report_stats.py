"""The report's statistics (lra/report/stats.py) against independent computations: scipy's whole-test
functions (ttest_1samp, ttest_rel, linregress), binomial sums written out by hand, Holm by hand."""
from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats as st

from lra.report import stats


def test_t_interval_matches_scipy():
    x = [31.0, 35.5, 29.25, 40.0]
    mean, lo, hi = stats.t_interval(x)
    ci = st.ttest_1samp(x, 0.0).confidence_interval(0.95)
    assert (mean, lo, hi) == pytest.approx((np.mean(x), ci.low, ci.high), rel=1e-12)
    with pytest.raises(ValueError, match="at least two"):
        stats.t_interval([1.0])


def test_seeds_examples_bootstrap():
    correct = np.zeros(1000, dtype=bool)
    correct[:700] = True
    acc, lo, hi = stats.seeds_examples_bootstrap(correct[None, :])  # one seed: the examples alone
    half = 1.959964 * math.sqrt(0.7 * 0.3 / 1000)  # Wald, what the bootstrap approximates at this n
    assert acc == 0.7 and lo == pytest.approx(0.7 - half, abs=0.006) and hi == pytest.approx(0.7 + half, abs=0.006)
    assert stats.seeds_examples_bootstrap(correct[None, :]) == (acc, lo, hi)  # fixed generator: same report
    # three seeds that disagree: wider than the examples alone, centred on the mean over seeds
    three = np.stack([np.roll(correct, 0), np.where(np.arange(1000) < 500, True, False), np.roll(correct, 3)])
    acc3, lo3, hi3 = stats.seeds_examples_bootstrap(three)
    assert acc3 == pytest.approx(three.mean()) and hi3 - lo3 > hi - lo


def test_floored_tests_match_scipy_above_the_floor_and_hold_at_zero_spread():
    a, b = [40.0, 42.5, 39.0, 45.0], [37.0, 41.0, 36.5, 40.0]
    ref = st.ttest_ind(a, b, equal_var=False)
    w = stats.welch_t(a, b, floor=0.2)
    ci = ref.confidence_interval(0.95)
    assert w.p == pytest.approx(ref.pvalue, rel=1e-10) and (w.low, w.high) == pytest.approx((ci.low, ci.high), rel=1e-10)
    # equal differences: the floor (one example) sets the spread; no p = 0, no zero-width interval
    r = stats.paired_t([40.2, 41.2, 42.2], [40.0, 41.0, 42.0], floor=0.2)
    assert r.p == pytest.approx(2 * st.t.sf(math.sqrt(3), 2), rel=1e-9) and r.high - r.low > 0.5
    w0 = stats.welch_t([41.0, 41.0, 41.0], [40.0, 40.0, 40.0], floor=0.2)
    se = math.sqrt(2 * 0.04 / 3)
    assert w0.p == pytest.approx(2 * st.t.sf(1 / se, 4), rel=1e-9)
    assert stats.spread_floor(500) == 0.2
    with pytest.raises(ValueError, match="spread floor"):
        stats.paired_t([1.0, 2.0], [1.0, 2.0], floor=0.0)


def test_stratified_t_interval_by_hand_and_probability_of_improvement():
    # one task: exactly the seed mean's t-interval (scipy)
    one = [40.0, 42.0, 47.0]
    ci = st.ttest_1samp(one, 0.0).confidence_interval(0.95)
    assert stats.stratified_t_interval([one]) == pytest.approx((np.mean(one), ci.low, ci.high), rel=1e-12)
    # two tasks by hand: se^2 = (s1^2/n1 + s2^2/n2) / 4, Welch-Satterthwaite dof
    tasks = [[40.0, 42.0, 44.0], [60.0, 61.0, 62.0, 63.0]]
    v1, v2 = 4.0 / 3, (5.0 / 3) / 4
    dof = (v1 + v2) ** 2 / (v1 ** 2 / 2 + v2 ** 2 / 3)
    half = st.t.ppf(0.975, dof) * math.sqrt(v1 + v2) / 2
    assert stats.stratified_t_interval(tasks) == pytest.approx(((42.0 + 61.5) / 2, 51.75 - half, 51.75 + half), rel=1e-12)
    # the floor: equal seeds are rounding, the interval is not zero-wide (one example of 500: 0.2 points)
    m, lo, hi = stats.stratified_t_interval([[50.0, 50.0, 50.0]], floors=[0.2])
    assert hi - lo == pytest.approx(2 * st.t.ppf(0.975, 2) * 0.2 / math.sqrt(3), rel=1e-12)
    with pytest.raises(ValueError, match="two values"):
        stats.stratified_t_interval([[1.0]])
    # P(A > B) by hand: task 1 all 9 pairs above, task 2: 3 of 4 above, 1 tie (1/2) -> (1 + 3.5/4) / 2
    p = stats.probability_of_improvement([[5.0, 6.0, 7.0], [1.0, 2.0]], [[1.0, 2.0, 3.0], [1.0, 0.0]])
    assert p == pytest.approx((1.0 + 3.5 / 4) / 2)
    assert stats.probability_of_improvement([[1.0, 2.0]], [[1.0, 2.0]]) == 0.5


COVERAGE_TRIALS = 4000  # Monte-Carlo sd of a 95% coverage: sqrt(.95 * .05 / 4000) = 0.34 points
TASK_SDS = (0.5, 1.0, 2.0, 3.0, 5.0)  # tasks differ in spread across seeds, as LRA's do


@pytest.mark.slow
@pytest.mark.parametrize("seeds", [3, 5])
@pytest.mark.parametrize("n_tasks", [1, 5])
def test_across_task_interval_covers_95_percent(seeds, n_tasks, capsys):
    """Coverage of the Avg interval under normal seed noise. Goal 93-97%: with 4000 trials the
    estimate's own sd is 0.34 points, so the bounds sit ~6 sd from 95% (the true coverages here are
    95.0-95.5%, by 200 000 trials); the percentile bootstrap it replaced (74-87%) fails by > 20 sd."""
    rng = np.random.default_rng(34)
    sds = np.array(TASK_SDS[:n_tasks] if n_tasks > 1 else (2.0,))
    means = np.linspace(40.0, 80.0, n_tasks)
    noise = rng.normal(size=(COVERAGE_TRIALS, n_tasks, seeds)) * sds[:, None]
    truth = means.mean()
    hits = 0
    for trial in noise:
        _, lo, hi = stats.stratified_t_interval(list(means[:, None] + trial))
        hits += lo <= truth <= hi
    coverage = hits / COVERAGE_TRIALS
    with capsys.disabled():
        print(f"\nacross-task 95% interval, {n_tasks} task(s) x {seeds} seeds: coverage {coverage:.1%} "
              f"({COVERAGE_TRIALS} trials)")
    assert 0.93 <= coverage <= 0.97


def test_chance_band():
    labels = np.array([0] * 60 + [1] * 40)
    chance, edge = stats.chance_band(labels)
    assert chance == 0.6 and edge == pytest.approx(0.6 + 1.959964 * math.sqrt(0.24 / 100), rel=1e-6)


def _midp_by_hand(b: int, c: int) -> float:
    n, k = b + c, min(b, c)
    below = sum(math.comb(n, i) for i in range(k)) / 2 ** n
    return min(1.0, 2 * below + math.comb(n, k) / 2 ** n)


@pytest.mark.parametrize("b,c", [(10, 3), (3, 10), (0, 6), (7, 7), (25, 12), (0, 0)])
def test_mcnemar_midp_matches_binomial_sums(b, c):
    assert stats.mcnemar_midp(b, c) == pytest.approx(_midp_by_hand(b, c) if b + c else 1.0, rel=1e-12)


def test_paired_examples_counts_discordant_pairs_only():
    rng = np.random.default_rng(3)
    v, base = rng.random(300) < 0.6, rng.random(300) < 0.5
    r = stats.paired_examples(v, base)
    b, c = int((v & ~base).sum()), int((~v & base).sum())
    assert r.p == pytest.approx(_midp_by_hand(b, c), rel=1e-12) and r.n == 300
    assert r.diff == pytest.approx(v.mean() - base.mean()) and r.low < r.diff < r.high
    se = math.sqrt(np.var(v.astype(float) - base, ddof=1) / 300)  # the bootstrap interval ~ diff +- 1.96 se
    assert r.high - r.low == pytest.approx(2 * 1.96 * se, rel=0.15)
    with pytest.raises(ValueError, match="equally many"):
        stats.paired_examples(v, base[:10])


def test_paired_t_matches_scipy_ttest_rel():
    a, b = [40.0, 42.5, 39.0, 45.0], [37.0, 41.0, 36.5, 40.0]
    r = stats.paired_t(a, b, floor=0.2)  # the differences' sd (1.4) is above the floor
    ref = st.ttest_rel(a, b)
    ci = ref.confidence_interval(0.95)
    assert r.p == pytest.approx(ref.pvalue, rel=1e-10) and (r.low, r.high) == pytest.approx((ci.low, ci.high), rel=1e-10)
    assert r.diff == pytest.approx(np.mean(np.subtract(a, b))) and r.n == 4


def test_holm_by_hand():
    # sorted: 0.01*4 = 0.04, 0.03*3 = 0.09, 0.04*2 = 0.08 -> running max 0.09, 0.5*1 = 0.5
    assert stats.holm([0.01, 0.04, 0.03, 0.5]) == pytest.approx([0.04, 0.09, 0.09, 0.5])
    assert stats.holm([0.6, 0.7]) == [1.0, 1.0]  # capped
    assert stats.holm([]) == []


def test_power_law_fit_matches_linregress():
    n = np.array([256, 512, 1024, 2048])
    y = 0.003 * n ** 1.7 * np.array([1.05, 0.97, 1.02, 0.99])
    fit = stats.fit_power_law(n, y)
    ref = st.linregress(np.log(n), np.log(y))
    half = st.t.ppf(0.975, 2) * ref.stderr
    assert fit.alpha == pytest.approx(ref.slope, rel=1e-12) and fit.a == pytest.approx(math.exp(ref.intercept), rel=1e-10)
    assert (fit.low, fit.high) == pytest.approx((ref.slope - half, ref.slope + half), rel=1e-10)
    two = stats.fit_power_law([1000, 4000], [10.0, 160.0])
    assert two.alpha == pytest.approx(2.0) and two.low is None
    with pytest.raises(ValueError, match="two different lengths"):
        stats.fit_power_law([512, 512], [1.0, 2.0])


def test_length_buckets_at_quartiles():
    lengths = np.arange(1, 101)  # quartiles 1, 25.75, 50.5, 75.25, 100 -> rounded 1, 26, 50, 75, 100
    edges = stats.length_buckets(lengths)
    assert edges.tolist() == [1, 26, 50, 75, 100]
    b = stats.bucket_of(lengths, edges)
    assert np.bincount(b).tolist() == [25, 24, 25, 26]  # [1,26) [26,50) [50,75) [75,100]
    assert stats.bucket_of(np.array([100, 25, 26]), edges).tolist() == [3, 0, 1]
    assert stats.length_buckets(np.full(10, 7)).tolist() == [7, 7]  # one length: one bucket
