"""jbkv_cli/metrics/horizon.py on synthetic cases with known answers."""

import math
import random

import pytest

from jbkv_cli.metrics.horizon import (
    Divergence,
    delay,
    divergence_chunk,
    gain_per_chunk,
    midpoint_threshold,
    sign_test,
)

FIRST, FLOOR = 33.0, 19.0  # dB: the embedded model's first INT2 chunk and its floor


def diverging_at(chunk: int | None, horizon: int = 12) -> list[float]:
    """Per-chunk PSNR that follows the reference (33 dB, decaying slowly) until ``chunk``, then
    sits at the floor; ``None``: never diverges."""
    return [
        FLOOR + 0.3 * (c % 2) if chunk is not None and c >= chunk else FIRST - 0.5 * c
        for c in range(horizon)
    ]


def test_threshold_is_halfway_and_divergence_the_first_chunk_below_it():
    theta = midpoint_threshold([32.0, 34.0], FLOOR)
    assert theta == pytest.approx(26.0)
    for chunk in (0, 1, 5, 11):
        assert divergence_chunk(diverging_at(chunk), theta) == chunk
    assert divergence_chunk(diverging_at(None), theta) is None  # censored
    assert divergence_chunk([27.0, 26.0, 25.9], 26.0) == 2  # strictly below
    with pytest.raises(ValueError):
        midpoint_threshold([], FLOOR)
    with pytest.raises(ValueError):
        midpoint_threshold([math.nan], FLOOR)


def test_survival_and_median_with_censoring():
    d = Divergence.of([diverging_at(t, 8) for t in (0, 2, 2, 5, None, None)], 26.0)
    assert d.times == (0, 2, 2, 5, None, None) and d.horizon == 8
    assert d.survival() == pytest.approx([5 / 6, 5 / 6, 3 / 6, 3 / 6, 3 / 6, 2 / 6, 2 / 6, 2 / 6])
    assert d.median() == 2  # the first chunk with S <= 1/2
    assert Divergence((1, None, None), 4).median() is None  # most never diverge: >= H
    assert Divergence((1, 3, None, None), 4).median() == 3  # exactly half at chunk 3
    summary = d.summary()
    assert summary["diverged"] == 4 and summary["n"] == 6 and summary["median_ci95"] == (0, None)
    with pytest.raises(ValueError, match="different lengths"):
        Divergence.of([[30.0] * 4, [30.0] * 5], 26.0)


def test_median_interval_ranks_are_the_tabulated_ones():
    """n = 10: ranks (2, 9), coverage 97.9%; n = 20: (6, 15), 95.9%; n < 6: none."""
    assert Divergence(tuple(range(10)), 12).median_ci() == (1, 8)
    assert Divergence(tuple(range(20)), 24).median_ci() == (5, 14)
    assert Divergence(tuple(range(5)), 12).median_ci() is None


def test_median_interval_covers_the_true_median_at_least_95_percent():
    """Exponential times (median ln 2 / rate, continuous, so no ties), n = 15, 4000 draws, seed
    0: coverage >= 0.95 minus 3 Monte Carlo SEs (0.0103)."""
    rng = random.Random(0)
    true_median, covered, trials = math.log(2) / 0.1, 0, 4000
    for _ in range(trials):
        xs = sorted(rng.expovariate(0.1) for _ in range(15))
        covered += xs[3] <= true_median <= xs[11]  # ranks (4, 12), as median_ci picks for 15
    assert Divergence(tuple(range(15)), 20).median_ci() == (3, 11)
    assert covered / trials >= 0.95 - 3 * math.sqrt(0.95 * 0.05 / trials)


def test_sign_test_is_the_exact_binomial():
    assert sign_test(9, 1) == pytest.approx(2 * 11 / 1024)
    assert sign_test(0, 0) == 1.0
    assert sign_test(3, 3) == 1.0
    assert sign_test(10, 0) == pytest.approx(2 / 1024)


def test_delay_counts_censored_pairs_by_their_known_sign():
    a = Divergence((3, None, 2, 4), 8)
    b = Divergence((5, None, None, 4), 8)
    out = delay(a, b)
    assert (out["later"], out["earlier"], out["ties"]) == (2, 0, 2)
    assert out["median_difference"] == 1.0  # [0, 0, 2, 6]: a censored b counts as H
    assert out["p_sign"] == pytest.approx(0.5)
    assert out["median_difference_ci95"] is None and out["censored_pairs"] == 2  # n < 6
    with pytest.raises(ValueError):
        delay(a, Divergence((1, 2, 3), 8))


def test_the_median_delay_has_the_order_statistic_interval_of_its_differences():
    """n = 8: the interval's rank is 1 (2 P(Bin(8, 1/2) <= 0) = 0.008; rank 2 gives 0.07), so
    it spans the smallest and largest difference; n = 15: ranks 4 and 12, as for a median."""
    a = Divergence((2, 3, 4, 5, 6, 7, 8, 9), 20)
    b = Divergence((1, 3, 5, 6, 8, 9, 11, 14), 20)  # differences -1 0 1 1 2 2 3 5
    out = delay(a, b)
    assert out["median_difference"] == 1.5 and out["median_difference_ci95"] == (-1.0, 5.0)
    assert out["censored_pairs"] == 0
    fifteen = delay(Divergence((0,) * 15, 20), Divergence(tuple(range(15)), 20))
    assert fifteen["median_difference"] == 7.0 and fifteen["median_difference_ci95"] == (3.0, 11.0)


def test_gain_per_chunk_stops_counting_a_video_when_its_baseline_diverged():
    a = [diverging_at(2, 4), diverging_at(None, 4), diverging_at(None, 4)]
    b = [[x + 1.0 for x in a[0]], [x + 0.5 for x in a[1]], [x + 1.5 for x in a[2]]]
    gains = gain_per_chunk(a, b, Divergence.of(a, 26.0))
    assert [g["n"] for g in gains] == [3, 3, 2, 2]  # video 0's baseline diverged at chunk 2
    assert gains[0]["mean"] == pytest.approx(1.0)
    assert gains[3]["mean"] == pytest.approx(1.0)  # (0.5 + 1.5) / 2
