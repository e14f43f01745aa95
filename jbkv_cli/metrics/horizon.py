"""Long-horizon statistics: when a compressed video stops following its reference, and what a
correction changes before that.

Over a long rollout a compressed-cache video drifts from the 16-bit reference until it is another
sample of the same prompt; from then on its per-chunk PSNR against the reference sits at a *floor*
(on the embedded model 18–20 dB from chunk ~10) and a paired fidelity metric measures nothing.

**Divergence.** A video diverges at the first chunk ``c`` (0-based) whose PSNR against the
reference is below a threshold ``θ``: ``T = min{c : psnr_c < θ}``. A video that never falls
below ``θ`` within its ``H`` chunks is *censored* at ``H`` (all that is known is ``T ≥ H``).
The default threshold is halfway between the floor and the first chunk's PSNR
(:func:`midpoint_threshold`): far from both the first chunk's fidelity and the floor, so
neither the first chunk's noise nor the floor's decides it.

**Per variant** (every video of a run has the same ``H``, so censoring is administrative and
the same for every video): the survival ``S(c)``, the share of videos not yet diverged after
chunk ``c`` (Kaplan–Meier, which with one common censoring time is the empirical share), and the
median time to divergence, the smallest ``c`` with ``S(c) ≤ 1/2`` (None: more than half never
diverge, the median is ``≥ H``). Its 95% interval is the distribution-free order-statistic
interval ``[T_(l), T_(n−l+1)]``, ``l`` the largest with ``2 P(Bin(n, 1/2) ≤ l − 1) ≤ 0.05``
(coverage ≥ 95%; it needs n ≥ 6; censored order statistics are "≥ H" bounds, None).

**A correction's delay** (paired: same prompt and seed, uncorrected ``a`` against corrected
``b``): the sign test on ``T_b − T_a`` — pairs where both are censored, or both diverge at the
same chunk, are ties and dropped; a pair where one is censored has a known sign — with the exact
two-sided binomial p-value ``min(1, 2 P(Bin(m, 1/2) ≤ min(k⁺, k⁻)))`` over the ``m`` untied pairs.
Its median difference counts a censored time as ``H`` (a lower bound of the delay when ``b``
is the censored one, an upper bound when ``a`` is), with the order-statistic 95% interval of
the median above taken over the sorted differences (the sign test's own interval; n ≥ 6). It
is exact when no pair is censored; ``censored_pairs`` says how many differences are bounds.

**Gain per chunk up to divergence**: at each chunk ``c``, the paired difference
``psnr_b,c − psnr_a,c`` over the videos whose *uncorrected* run has not diverged by ``c``
(``T_a > c``): where the baseline still follows the reference, a paired PSNR difference still
measures fidelity. Conditioning on the baseline only (never on ``b``) keeps a correction that
delays divergence from being compared on a selection of its own making.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from jbkv_cli.metrics.paired import paired_summary

ALPHA = 0.05
MIN_MEDIAN_CI = 6  # below, no order-statistic interval reaches 95% coverage


def midpoint_threshold(first_chunk: Sequence[float], floor: float) -> float:
    """``θ = (mean(first_chunk) + floor) / 2``: halfway between the first chunk's PSNR (mean over
    the videos given) and the floor, in dB."""
    xs = [float(x) for x in first_chunk]
    if not xs or not all(math.isfinite(x) for x in [*xs, floor]):
        raise ValueError("midpoint_threshold needs finite first-chunk PSNRs and a finite floor")
    return (math.fsum(xs) / len(xs) + floor) / 2


def divergence_chunk(per_chunk: Sequence[float], threshold: float) -> int | None:
    """The first chunk whose value is below ``threshold``; None when none is (censored)."""
    for c, value in enumerate(per_chunk):
        if value < threshold:
            return c
    return None


@dataclass(frozen=True)
class Divergence:
    """One variant's divergence times over its videos (module docstring); ``times[i]`` is None
    for a censored video; ``horizon`` the chunks every video has."""

    times: tuple[int | None, ...]
    horizon: int

    @classmethod
    def of(cls, series: Sequence[Sequence[float]], threshold: float) -> Divergence:
        """From per-chunk PSNR lists (one per video, all of one length)."""
        lengths = {len(s) for s in series}
        if len(lengths) > 1:
            raise ValueError(f"videos of different lengths: {sorted(lengths)} chunks")
        horizon = lengths.pop() if lengths else 0
        return cls(tuple(divergence_chunk(s, threshold) for s in series), horizon)

    def _sorted(self) -> list[float]:
        return sorted(math.inf if t is None else t for t in self.times)

    def survival(self) -> list[float]:
        """``S(c)`` for ``c = 0..H−1``: the share of videos not diverged at or before ``c``."""
        n = len(self.times)
        return [sum(t is None or t > c for t in self.times) / n for c in range(self.horizon)]

    def median(self) -> int | None:
        """The smallest chunk with ``S(c) ≤ 1/2``; None when more than half are censored."""
        xs = self._sorted()
        if not xs:
            return None
        value = xs[math.ceil(len(xs) / 2) - 1]
        return None if math.isinf(value) else int(value)

    def median_ci(self) -> tuple[int | None, int | None] | None:
        """The 95% order-statistic interval of the median; None for fewer than 6 videos; a bound
        that is a censored time is None (``≥ H``)."""
        n = len(self.times)
        rank = _order_rank(n)
        if rank is None:
            return None
        xs = self._sorted()
        low, high = xs[rank - 1], xs[n - rank]
        return (None if math.isinf(low) else int(low), None if math.isinf(high) else int(high))

    def summary(self) -> dict[str, Any]:
        """What the report stores for a variant."""
        n = len(self.times)
        return {
            "n": n,
            "horizon": self.horizon,
            "diverged": sum(t is not None for t in self.times),
            "median": self.median(),
            "median_ci95": self.median_ci(),
            "survival": self.survival(),
        }


def _binom_cdf_half(k: int, n: int) -> float:
    """``P(Bin(n, 1/2) ≤ k)``."""
    return math.fsum(math.comb(n, i) for i in range(k + 1)) / 2.0**n


def _order_rank(n: int) -> int | None:
    """The largest ``l`` with ``2 P(Bin(n, 1/2) ≤ l − 1) ≤ α``; None when there is none."""
    best = None
    for rank in range(1, n // 2 + 1):
        if 2 * _binom_cdf_half(rank - 1, n) <= ALPHA:
            best = rank
    return best


def sign_test(later: int, earlier: int) -> float:
    """Exact two-sided sign-test p-value for ``later`` and ``earlier`` untied pairs."""
    m = later + earlier
    if m == 0:
        return 1.0
    return min(1.0, 2 * _binom_cdf_half(min(later, earlier), m))


def delay(a: Divergence, b: Divergence) -> dict[str, Any]:
    """Does ``b`` diverge later than ``a``? (paired; module docstring)."""
    if len(a.times) != len(b.times) or a.horizon != b.horizon:
        raise ValueError("delay needs the same videos with the same horizon")
    horizon = a.horizon

    def value(t: int | None) -> int:
        return horizon if t is None else t

    later = sum(value(tb) > value(ta) for ta, tb in zip(a.times, b.times, strict=True))
    earlier = sum(value(tb) < value(ta) for ta, tb in zip(a.times, b.times, strict=True))
    diffs = sorted(value(tb) - value(ta) for ta, tb in zip(a.times, b.times, strict=True))
    n = len(diffs)
    median = None
    if n:
        mid = n // 2
        median = float(diffs[mid]) if n % 2 else (diffs[mid - 1] + diffs[mid]) / 2
    rank = _order_rank(n)
    ci = None if rank is None else (float(diffs[rank - 1]), float(diffs[n - rank]))
    return {
        "n": n,
        "later": later,
        "earlier": earlier,
        "ties": n - later - earlier,
        "median_difference": median,
        "median_difference_ci95": ci,
        "censored_pairs": sum(
            ta is None or tb is None for ta, tb in zip(a.times, b.times, strict=True)
        ),
        "p_sign": sign_test(later, earlier),
    }


def gain_per_chunk(
    a: Sequence[Sequence[float]], b: Sequence[Sequence[float]], a_div: Divergence
) -> list[dict[str, Any]]:
    """Per chunk ``c``: :func:`~jbkv_cli.metrics.paired.paired_summary` of ``b − a`` over the
    videos whose ``a`` has not diverged by ``c`` (module docstring)."""
    if len(a) != len(b) or len(a) != len(a_div.times):
        raise ValueError("gain_per_chunk needs the same videos in a, b and a's divergence")
    out = []
    for c in range(a_div.horizon):
        live = [i for i, t in enumerate(a_div.times) if t is None or t > c]
        out.append(paired_summary([b[i][c] - a[i][c] for i in live]))
    return out
