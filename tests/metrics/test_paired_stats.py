"""Paired statistics (jbkv_cli/metrics/paired.py, distributions.py) against hand computations
and against scipy.stats on fixed data. scipy is installed by declared dependencies
(scikit-image, lpips require it); jbkv's own implementation uses ``math`` alone, so scipy is an
independent check here."""

from __future__ import annotations

import math
import random

import pytest
from scipy import stats

from jbkv_cli.metrics.distributions import t_cdf, t_ppf, t_test_power
from jbkv_cli.metrics.paired import holm, paired_summary, videos_needed, wilcoxon_p, with_holm


def test_hand_computed_three_pairs():
    """d = 1, 2, 3: mean 2, s = 1, SE 1/√3, t = 2√3 with 2 df, whose CDF has the closed form
    F(t) = ½ + t / (2√(2 + t²)): p = 1 − t/√(2 + t²) = 1 − √(12/14); the 0.975 quantile
    q = 0.95 √(2 / (1 − 0.95²)); W+ = 6 is the largest of 2³ equally likely sums: p = 2/8."""
    s = paired_summary([1.0, 2.0, 3.0])
    assert s["mean"] == 2.0 and s["sd"] == pytest.approx(1.0)
    assert s["se"] == pytest.approx(1 / math.sqrt(3))
    assert s["t"] == pytest.approx(2 * math.sqrt(3))
    assert s["p_t"] == pytest.approx(1 - math.sqrt(12 / 14), rel=1e-12)
    q = 0.95 * math.sqrt(2 / (1 - 0.95**2))
    assert s["ci95"] == pytest.approx([2 - q / math.sqrt(3), 2 + q / math.sqrt(3)], rel=1e-12)
    assert (s["p_wilcoxon"], s["wilcoxon_method"]) == (0.25, "exact")


def test_hand_computed_wilcoxon_with_a_tie_and_a_zero():
    """d = 0, 1, −1, 2: the zero is dropped; |d| = 1, 1, 2 rank 1.5, 1.5, 3; W+ = 1.5 + 3 = 4.5.
    Of the 8 sign flips, W+ ≥ 4.5 for {4.5, 4.5, 6} -> 3/8, W+ ≤ 4.5 for 7 of 8: p = 6/8."""
    assert wilcoxon_p([0.0, 1.0, -1.0, 2.0]) == (0.75, "exact-ties")


def test_holm_hand_computed():
    """m = 3 tests: 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 = 0.04 -> max so far 0.06; None is
    not a test and does not count."""
    assert holm([0.01, 0.04, 0.03, None]) == pytest.approx([0.03, 0.06, 0.06, None])
    assert holm([0.5, 0.9]) == [1.0, 1.0]
    rows = [paired_summary([1.0, 1.1, 0.9, 1.2]), None, paired_summary([0.1, -0.1, 0.05, 0.0])]
    with_holm(rows)
    assert rows[0]["significant"] and not rows[2]["significant"]
    assert rows[0]["p_holm"] == pytest.approx(2 * rows[0]["p_t"])


def _data(seed: int, n: int, digits: int | None) -> list[float]:
    rng = random.Random(seed)
    xs = [rng.gauss(0.3, 1.0) for _ in range(n)]
    return xs if digits is None else [round(x, digits) for x in xs]


# (seed, n, rounding): no ties (exact up to 50), ties and zeros at n ≤ 13 (exact sign flips),
# ties beyond (normal approximation with the tie correction), and n > 50 (normal)
CASES = [(1, 5, None), (2, 10, None), (3, 50, None), (4, 8, 0), (5, 13, 1), (6, 30, 0)]
CASES += [(7, 60, None), (8, 200, 1), (9, 2, None), (10, 14, 0)]


@pytest.mark.parametrize(("seed", "n", "digits"), CASES)
def test_against_scipy_ttest_rel_and_wilcoxon(seed, n, digits):
    d = _data(seed, n, digits)
    if not any(d):
        pytest.skip("all zero")
    base = [10.0] * n
    paired = [b + x for b, x in zip(base, d, strict=True)]
    s = paired_summary(d)
    ref_t = stats.ttest_rel(paired, base)
    assert s["p_t"] == pytest.approx(ref_t.pvalue, rel=1e-9, abs=1e-14)
    assert s["t"] == pytest.approx(ref_t.statistic, rel=1e-9)
    lo, hi = stats.t.interval(0.95, n - 1, loc=s["mean"], scale=s["se"])
    assert s["ci95"] == pytest.approx([lo, hi], rel=1e-9)
    ref_w = stats.wilcoxon(d)  # scipy's defaults: zero_method="wilcox", method="auto"
    assert s["p_wilcoxon"] == pytest.approx(ref_w.pvalue, rel=1e-9, abs=1e-14)


def test_the_wilcoxon_method_follows_scipys_auto_rule():
    assert wilcoxon_p(_data(2, 10, None))[1] == "exact"
    assert wilcoxon_p(_data(4, 8, 0))[1] == "exact-ties"
    assert wilcoxon_p(_data(6, 30, 0))[1] == "normal"
    assert wilcoxon_p(_data(7, 60, None))[1] == "normal"
    assert wilcoxon_p([0.0, 0.0]) == (1.0, "exact")


@pytest.mark.parametrize("df", [1, 2, 5, 9, 59, 61, 400, 10**6])
def test_t_distribution_against_scipy(df):
    for p in (0.6, 0.8, 0.975, 0.025):
        assert t_ppf(p, df) == pytest.approx(stats.t.ppf(p, df), rel=1e-8)
    for t in (-3.0, 0.2, 2.5):
        assert t_cdf(t, df) == pytest.approx(stats.t.cdf(t, df), rel=1e-10)


def _scipy_power(effect: float, n: int) -> float:
    c = stats.t.ppf(0.975, n - 1)
    ncp = effect * math.sqrt(n)
    return 1 - stats.nct.cdf(c, n - 1, ncp) + stats.nct.cdf(-c, n - 1, ncp)


@pytest.mark.parametrize("effect", [0.1, 0.35, 0.6, 1.0, 1.5, 2.2, 4.0])
def test_videos_needed_is_the_smallest_n_with_80_percent_power(effect):
    """Checked with scipy's noncentral t: power ≥ 0.8 at n, < 0.8 at n − 1 (the iterated t
    approximation alone is 1-2 pairs short at 1.5 and 2.2)."""
    n = videos_needed(effect, 1.0)
    assert _scipy_power(effect, n) >= 0.8
    assert n == 2 or _scipy_power(effect, n - 1) < 0.8
    assert videos_needed(-effect * 3, 3.0) == n  # sign and scale do not matter


def test_power_integral_against_scipy_nct():
    for n in (2, 3, 4, 10, 40):
        for effect in (0.2, 0.8, 2.0):
            assert t_test_power(effect, n, 0.05) == pytest.approx(_scipy_power(effect, n), abs=3e-5)


def test_degenerate_inputs():
    assert paired_summary([])["mean"] is None
    one = paired_summary([0.4])
    assert one["mean"] == 0.4 and one["p_t"] is None and one["ci95"] is None
    same = paired_summary([0.5, 0.5, 0.5])
    assert same["p_t"] == 0.0 and same["videos_needed"] == 2 and same["t"] is None
    zero = paired_summary([0.0, 0.0, 0.0])
    assert zero["p_t"] == 1.0 and zero["videos_needed"] is None
    with pytest.raises(ValueError):
        paired_summary([1.0, float("nan")])
