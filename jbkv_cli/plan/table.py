"""The plan as a table (``jbkv plan``'s stdout) and as JSON (``--json``)."""

from __future__ import annotations

from typing import Any

from rich.table import Table

from jbkv_cli.plan.budget import RESERVE, GiB
from jbkv_cli.plan.run import ModelPlan
from jbkv_cli.utils.console import plain

FORMAT = "jbkv-plan/1"


MiB = 2**20


def unit_of(plan: ModelPlan) -> tuple[str, int]:
    """GiB, or MiB for a plan whose largest peak is under 1 GiB (the tiny configs)."""
    largest = max((v.peak.total for v in plan.variants), default=0)
    return ("GiB", GiB) if largest >= GiB else ("MiB", MiB)


def _peak_phase(v) -> str:
    return next((name for name, split in v.phases if split.total == v.peak.total), "—")


def plan_table(plan: ModelPlan) -> Table:
    """One row per variant: the peak (GiB) and its split, the phase it falls in, the cache a
    run records, and per budget whether it fits and the longest video that does."""
    s = plan.settings
    unit, size = unit_of(plan)

    def fmt(n: float) -> str:
        return f"{n / size:.2f}"

    shown = ", ".join(
        f"{k}={v}"
        for k, v in s.items()
        if k in ("config", "num_chunks", "steps", "window", "height", "width", "dtype")
    )
    table = Table(
        title=plain(f"{plan.model} · {shown} · {unit}, predicted on fake CUDA"),
        title_justify="left",
        show_edge=False,
        box=None,
        pad_edge=False,
    )
    for name in ("variant", "peak", "weights", "cache", "attention", "other", "at", "KV stored"):
        table.add_column(name, justify="left" if name in ("variant", "at") else "right")
    for budget in plan.budgets:
        table.add_column(plain(budget.name), justify="right")
    for v in plan.variants:
        p = v.peak
        row = [
            plain(v.label),
            fmt(p.total),
            fmt(sum(p.weights.values())),
            fmt(p.cache),
            fmt(p.attention),
            fmt(p.activations),
            plain(_peak_phase(v)),
            fmt(v.stored),
        ]
        for budget in plan.budgets:
            fit = "fits" if v.fits.get(budget.name) else "no"
            longest = v.longest.get(budget.name)
            row.append(fit if longest is None else f"{fit}, ≤{longest} ch")
        table.add_row(*row)
    return table


def notes(plan: ModelPlan) -> list[str]:
    """The lines under a model's table: the weights per component, the budget rule, the time."""
    unit, size = unit_of(plan)
    parts = ", ".join(f"{k} {b / size:.2f}" for k, b in plan.components.items())
    lines = [f"  weights (all components, {unit}): {parts}"]
    if plan.budgets:
        lines.append(
            f"  fits: peak + {RESERVE / GiB:.0f} GiB (CUDA context, allocator) ≤ the budget; "
            "≤N ch: the longest video that fits, in chunks"
            + (f" of {plan.frames_per_chunk} frames" if plan.frames_per_chunk else "")
            + " (docs/plan.md)"
        )
    lines.append(f"  planned in {plan.seconds:.1f} s")
    return lines


def plan_document(plans: list[ModelPlan]) -> dict[str, Any]:
    """What ``--json`` writes: ``format`` and each model's plan (:meth:`ModelPlan.to_dict`)."""
    return {"format": FORMAT, "unit": "bytes", "plans": [p.to_dict() for p in plans]}
