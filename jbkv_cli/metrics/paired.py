"""Paired statistics over videos: which differences are real, and how many videos would tell.

For per-video differences ``dᵢ = b(videoᵢ) − a(videoᵢ)`` (same prompt and seed, i = 1..n):

- mean ``d̄``, sample SD ``s`` (n − 1 denominator), SE ``s/√n``;
- 95% confidence interval ``d̄ ± t_{0.975, n−1} · s/√n`` (Student t);
- paired t-test: ``t = d̄ / (s/√n)``, two-sided ``p_t = P(|T_{n−1}| ≥ |t|)`` (scipy.stats.ttest_rel);
- Wilcoxon signed-rank test, two-sided, with scipy.stats.wilcoxon's defaults (scipy 1.17,
  ``zero_method="wilcox"``, no continuity correction, ``method="auto"``): zero differences are
  dropped; with no zeros and no ties and n ≤ 50 the exact null distribution (``exact``); with
  ties or zeros and n ≤ 13 the exact sign-flip distribution of the average ranks
  (``exact-ties``: scipy enumerates the same 2ⁿ flips); otherwise the normal approximation with
  the tie correction ``σ² = (n(n+1)(2n+1) − Σ(t³ − t)/2) / 24`` (``normal``). ``p = 1`` when
  every difference is zero;
- Holm's step-down adjustment of ``p_t`` across the comparisons one table makes (Holm 1979):
  the k-th smallest of m p-values becomes ``max_{j ≤ k} min(1, (m − j + 1) p_(j))``; a row is
  marked significant when its adjusted p < 0.05;
- videos needed: the smallest number of pairs (at least 2) for which a two-sided paired t-test
  at α = 0.05 has 80% power against the observed effect ``|d̄|/s`` (taken as the true one).
  Noncentral-t based: the iterated t approximation
  ``n = ⌈((t_{1−α/2, n−1} + t_{0.8, n−1}) · s / |d̄|)²⌉`` (from the normal quantiles, repeated
  until n stops changing) gives the start; up to 200 pairs n is then stepped to the exact
  answer with the noncentral-t power (:func:`~jbkv_cli.metrics.distributions.t_test_power`),
  where the approximation is up to 2 pairs short at large effects; above 200 the two agree.
  None when ``d̄ = 0``; 2 when every difference is the same non-zero value.

n < 2 gives no test (a single video has no SD): the summary holds the mean and n only.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

from jbkv_cli.metrics.distributions import (
    normal_cdf,
    normal_ppf,
    signed_rank_counts,
    t_ppf,
    t_sf2,
    t_test_power,
)

ALPHA = 0.05
POWER = 0.8
EXACT_MAX_N = 50  # scipy.stats.wilcoxon, method="auto": exact without ties or zeros
EXACT_TIES_MAX_N = 13  # ... with ties or zeros: the exact permutation distribution
_NEEDED_CAP = 10**7
EXACT_POWER_MAX_N = 10_000  # above, the iterated t value (off by at most a pair in 10⁴)


def paired_summary(diffs: Iterable[float]) -> dict[str, Any]:
    """The statistics of one paired comparison (module docstring); the keys ``mean, se, n``
    keep the shape of :func:`jbkv_cli.metrics.stats.aggregate`."""
    xs = [float(x) for x in diffs]
    if any(not math.isfinite(x) for x in xs):
        raise ValueError(f"paired_summary needs finite differences, got {xs}")
    n = len(xs)
    out: dict[str, Any] = {"mean": math.fsum(xs) / n if n else None, "se": None, "n": n}
    out.update(sd=None, ci95=None, t=None, p_t=None, p_wilcoxon=None, wilcoxon_method=None)
    out["videos_needed"] = None
    if n < 2:
        return out
    mean = out["mean"]
    sd = math.sqrt(math.fsum((x - mean) ** 2 for x in xs) / (n - 1))
    se = sd / math.sqrt(n)
    half = t_ppf(1 - ALPHA / 2, n - 1) * se
    if se > 0:
        t, p_t = mean / se, t_sf2(mean / se, n - 1)
    else:  # every difference equal: no spread, the mean is exact
        t, p_t = (0.0, 1.0) if mean == 0 else (math.copysign(math.inf, mean), 0.0)
    p_w, method = wilcoxon_p(xs)
    out.update(sd=sd, se=se, ci95=[mean - half, mean + half], t=t if math.isfinite(t) else None)
    out.update(p_t=p_t, p_wilcoxon=p_w, wilcoxon_method=method)
    out["videos_needed"] = videos_needed(mean, sd)
    return out


def wilcoxon_p(diffs: Sequence[float]) -> tuple[float, str]:
    """Two-sided Wilcoxon signed-rank p-value of ``diffs`` and the method used (module
    docstring: ``exact``, ``exact-ties`` or ``normal``)."""
    nonzero = [x for x in diffs if x != 0]
    m = len(nonzero)
    if m == 0:
        return 1.0, "exact"
    ranks = _average_ranks([abs(x) for x in nonzero])
    w_plus = sum(r for r, x in zip(ranks, nonzero, strict=True) if x > 0)
    ties = len(set(ranks)) < m
    zeros = m < len(diffs)
    exact = (not ties and not zeros and m <= EXACT_MAX_N) or (
        (ties or zeros) and len(diffs) <= EXACT_TIES_MAX_N
    )
    if exact:
        counts = signed_rank_counts(tuple(round(2 * r) for r in ranks))
        total = 2.0**m
        s = round(2 * w_plus)
        low, high = sum(counts[: s + 1]) / total, sum(counts[s:]) / total
        return min(1.0, 2 * min(low, high)), "exact" if not (ties or zeros) else "exact-ties"
    tie_term = sum(c**3 - c for c in _tie_sizes(ranks))
    var = (m * (m + 1) * (2 * m + 1) - tie_term / 2) / 24
    z = (w_plus - m * (m + 1) / 4) / math.sqrt(var)
    return min(1.0, 2 * normal_cdf(-abs(z))), "normal"


def _average_ranks(values: list[float]) -> list[float]:
    """Ranks 1..n of ``values``, ties sharing the average of their ranks."""
    order = sorted(range(len(values)), key=values.__getitem__)
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def _tie_sizes(ranks: list[float]) -> list[int]:
    counts: dict[float, int] = {}
    for r in ranks:
        counts[r] = counts.get(r, 0) + 1
    return list(counts.values())


def videos_needed(mean: float, sd: float, alpha: float = ALPHA, power: float = POWER) -> int | None:
    """Pairs for ``power`` at two-sided ``alpha`` against ``|mean|/sd`` (iterated t
    approximation, module docstring); None when there is no difference to detect."""
    if mean == 0:
        return None
    if sd == 0:
        return 2
    effect = abs(mean) / sd
    z = (normal_ppf(1 - alpha / 2) + normal_ppf(power)) / effect
    n = max(2, math.ceil(z * z))
    seen: set[int] = set()
    while n not in seen:  # until n repeats (it may alternate between two values: take the larger)
        if n >= _NEEDED_CAP:
            return _NEEDED_CAP
        seen.add(n)
        q = (t_ppf(1 - alpha / 2, n - 1) + t_ppf(power, n - 1)) / effect
        new = max(2, math.ceil(q * q))
        n = max(n, new) if new in seen else new
    if n <= EXACT_POWER_MAX_N:  # the approximation errs at small n: step to the exact answer
        while t_test_power(effect, n, alpha) < power:
            n += 1
        while n > 2 and t_test_power(effect, n - 1, alpha) >= power:
            n -= 1
    return n


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm-adjusted p-values in the input order; None entries (no test) stay None and do not
    count towards m."""
    tested = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    m = len(tested)
    out: list[float | None] = [None] * len(pvalues)
    running = 0.0
    for k, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (m - k) * p))
        out[i] = running
    return out


def with_holm(summaries: Sequence[dict[str, Any] | None]) -> None:
    """Adds ``p_holm`` (Holm over the summaries given: one table's comparisons) and
    ``significant`` (``p_holm < 0.05``) to each summary, in place."""
    adjusted = holm([None if s is None else s.get("p_t") for s in summaries])
    for s, p in zip(summaries, adjusted, strict=True):
        if s is not None:
            s["p_holm"] = p
            s["significant"] = p is not None and p < ALPHA


def mark(summary: dict[str, Any] | None) -> str:
    """``*`` for a significant comparison (Holm-adjusted p < 0.05), else ``""``."""
    return "*" if summary and summary.get("significant") else ""


def describe(summary: dict[str, Any], digits: int = 2, with_mean: bool = True) -> str:
    """``+0.42, 95% CI [+0.10, +0.74], p_t 0.012, p_W 0.020, Holm 0.036 *, 9 videos for 80%
    power`` (the parts that exist; ``with_mean=False`` leaves the mean out)."""
    parts = [f"{summary['mean']:+.{digits}f}"] if with_mean else []
    if summary.get("ci95"):
        lo, hi = summary["ci95"]
        parts.append(f"95% CI [{lo:+.{digits}f}, {hi:+.{digits}f}]")
    for key, name in (("p_t", "p_t"), ("p_wilcoxon", "p_W"), ("p_holm", "Holm")):
        if summary.get(key) is not None:
            parts.append(f"{name} {format_p(summary[key])}")
    if summary.get("significant") and parts:
        parts[-1] += " *"
    if summary.get("videos_needed") is not None:
        parts.append(f"{summary['videos_needed']} videos for 80% power")
    return ", ".join(parts)


def format_p(p: float) -> str:
    """``0.012``, ``<0.001``."""
    return "<0.001" if p < 0.001 else f"{p:.3f}"
