"""The storage–quality frontier: quality against measured effective bits, per method ± correction.

A configuration (method, bits, group size, correction) is a point ``(b, y)``: ``b`` its effective
bits per cached element, measured from the stored tensors, ``y`` a quality (PSNR, SSIM: higher is
better; ``|ΔP_S|``: lower is better). A point is *Pareto-optimal* when no other point is at least
as good on both axes and better on one:

    p dominated  ⇔  ∃ p' : b' ≤ b  and  y' ⪰ y,  with one of them strict

The front of all points answers "which format to pick for this memory budget"; each series'
own front ("method + correction") is the curve drawn for it.
"""

from __future__ import annotations

from dataclasses import dataclass

from jbkv_cli.report.results import ResultRow

METRICS = {"psnr": True, "ssim": True, "delta_ps": False}  # metric -> higher is better
"""The frontier's quality axes; ΔP_S enters as its absolute value."""


def pareto_front(points: list[tuple[float, float]], higher_is_better: bool = True) -> list[int]:
    """Indices of the Pareto-optimal ``(bits, quality)`` points, sorted by bits.

    Fewer bits are better; quality is better higher (or lower with ``higher_is_better=False``).
    Ties keep the first point.
    """
    sign = 1.0 if higher_is_better else -1.0
    order = sorted(range(len(points)), key=lambda i: (points[i][0], -sign * points[i][1], i))
    front, best = [], float("-inf")
    for i in order:
        q = sign * points[i][1]
        if q > best:
            front.append(i)
            best = q
    return front


@dataclass(frozen=True)
class Point:
    """One configuration on the frontier."""

    variant: str
    series: str  # e.g. "rtn + taylor"
    bits: int
    group_size: int | None
    effective_bits: float
    value: float


def frontier_points(rows: list[ResultRow], metric: str) -> list[Point]:
    """The full (non-ablation) quantized variants that have ``metric`` and measured bits."""
    points = []
    for r in rows:
        value = r.mean(metric)
        if r.is_reference or not r.full or value is None or r.effective_bits is None:
            continue
        series = r.quantizer + ("" if r.pruner == "none" else f" {r.pruner}")
        series += "" if r.correction == "none" else f" + {r.correction}"
        value = abs(value) if metric == "delta_ps" else value
        points.append(Point(r.variant, series, r.bits, r.group_size, r.effective_bits, value))
    return points


def frontiers(rows: list[ResultRow]) -> dict[str, list[str]]:
    """Per metric, the variants on the overall Pareto front (cheapest first)."""
    out = {}
    for metric, higher in METRICS.items():
        points = frontier_points(rows, metric)
        front = pareto_front([(p.effective_bits, p.value) for p in points], higher)
        out[metric] = [points[i].variant for i in front]
    return out


def has_frontier(rows: list[ResultRow]) -> bool:
    """True when the run spans more than one storage size per series (a sweep, not a table)."""
    sizes: dict[str, set[float]] = {}
    for p in frontier_points(rows, "psnr"):
        sizes.setdefault(p.series, set()).add(round(p.effective_bits, 6))
    return any(len(s) > 1 for s in sizes.values())
