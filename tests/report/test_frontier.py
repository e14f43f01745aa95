"""The storage–quality frontier (jbkv_cli/report/frontier.py)."""

from __future__ import annotations

import itertools
import random

from jbkv_cli.report.frontier import frontier_points, frontiers, has_frontier, pareto_front
from jbkv_cli.report.results import ResultRow, Stat


def _dominated(p, q, higher):
    """q dominates p."""
    better = q[1] >= p[1] if higher else q[1] <= p[1]
    strictly = q[0] < p[0] or (q[1] > p[1] if higher else q[1] < p[1])
    return q[0] <= p[0] and better and strictly


def test_pareto_front_matches_the_definition_on_random_points():
    rng = random.Random(0)
    for trial in range(200):
        pts = [(rng.choice([2.1, 2.75, 3.0, 4.75]), rng.uniform(20, 50)) for _ in range(12)]
        for higher in (True, False):
            front = set(pareto_front(pts, higher))
            for i, p in enumerate(pts):
                dominated = any(_dominated(p, q, higher) for q in pts)
                duplicate_before = any(pts[j] == p for j in range(i))
                assert (i in front) == (not dominated and not duplicate_before), (trial, i)


def test_pareto_front_is_sorted_by_bits():
    pts = [(4.75, 50.0), (2.75, 36.0), (3.0, 35.0), (2.19, 30.0)]
    assert pareto_front(pts) == [3, 1, 0]
    assert pareto_front(pts, higher_is_better=False) == [3]


def _row(variant, quantizer, bits, eff, psnr, correction="none", keys=True):
    return ResultRow(
        variant=variant,
        label=variant,
        quantizer=quantizer,
        bits=bits,
        group_size=32,
        effective_bits=eff,
        corrected=correction != "none",
        correction=correction,
        keys=keys,
        values=True,
        bias_only=False,
        psnr=Stat(psnr, 0.1, 4),
        delta_ps=Stat(-0.01 * bits, 0.001, 4),
        videos=4,
    )


def test_frontiers_of_rows_skip_reference_and_ablations():
    rows = [
        _row("bf16", "none", 16, 32.0, 100.0),
        _row("int2-rtn-g32", "rtn", 2, 2.75, 36.0),
        _row("int4-rtn-g32", "rtn", 4, 4.75, 51.0),
        _row("int2-rtn-g32-taylor", "rtn", 2, 2.75, 37.0, "taylor"),
        _row("int2-rtn-g32-konly", "rtn", 2, 2.0, 99.0, keys=False),
    ]
    got = frontiers(rows)
    assert got["psnr"] == ["int2-rtn-g32-taylor", "int4-rtn-g32"]
    assert got["delta_ps"] == ["int2-rtn-g32"]  # |ΔP_S| 0.02 at the fewest bits
    assert {p.series for p in frontier_points(rows, "psnr")} == {"rtn", "rtn + taylor"}
    assert has_frontier(rows) and not has_frontier(rows[:2])


def test_every_front_point_is_undominated_in_a_grid():
    rows = [
        _row(f"int{b}-m{m}-g{g}", f"m{m}", b, b + 24 / g, 10 * b + m - g / 64)
        for b, m, g in itertools.product((2, 3, 4), (0, 1), (16, 32, 64))
    ]
    front = frontiers(rows)["psnr"]
    pts = {r.variant: (r.effective_bits, r.psnr.mean) for r in rows}
    for v in front:
        assert not any(_dominated(pts[v], q, True) for q in pts.values())
