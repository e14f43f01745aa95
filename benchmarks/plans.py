"""The plan of every registered model's default setting at BF16, INT4 and INT2 (RTN, g32) with
no correction, ``taylor`` and ``signed``: the peak GPU memory and the longest video that fits
24, 48 and 80 GiB, as a markdown table written into docs/plan.md between its markers, and the
plans as JSON (``jbkv plan``'s format).

    python benchmarks/plans.py [--models tiny,magi1] [--json benchmarks/results/plans.json]
                               [--doc docs/plan.md]

Each model is planned at its default options with its ``plan_options`` (the fewest denoising
steps: the same bytes), on this CPU (docs/plan.md); the table's rows are :func:`row`'s.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BEGIN, END = "<!-- plans:begin -->", "<!-- plans:end -->"
BUDGETS = "24GiB,48GiB,80GiB"
HEADER = "| model | variant | peak GiB | 24 GiB | 48 GiB | 80 GiB |\n|---|---|--:|--:|--:|--:|"


def specs() -> list:
    """BF16, then INT4 and INT2 RTN (g32) each with correction none, taylor, signed."""
    from jbkv_cli.kvcache import FULL_PRECISION, KVSpec

    return [FULL_PRECISION] + [
        KVSpec.build("rtn", bits, correction=c)
        for bits in (4, 2)
        for c in ("none", "taylor", "signed")
    ]


def cell(fits: bool, chunks: int | None, frames_per_chunk: int | None) -> str:
    """A budget's cell: ``no``, ``fits`` or ``≤N ch`` (``≤N ch · F fr`` when a chunk's frames
    are known)."""
    if not fits:
        return "no"
    if chunks is None:
        return "fits"
    frames = f" · {chunks * frames_per_chunk} fr" if frames_per_chunk else ""
    return f"≤{chunks} ch{frames}"


def row(model: str, variant: dict, frames_per_chunk: int | None, budgets: list[str]) -> str:
    """One table row from a variant of ``jbkv plan --json`` (bytes)."""
    peak = variant["peak"]["total"] / 2**30
    longest = variant.get("longest_chunks", {})
    cells = [cell(variant["fits"][b], longest.get(b), frames_per_chunk) for b in budgets]
    return f"| {model} | {variant['variant']} | {peak:.2f} | " + " | ".join(cells) + " |"


def table(document: dict) -> str:
    """The markdown table of a ``jbkv plan --json`` document."""
    lines = [HEADER]
    for plan in document["plans"]:
        budgets = list(plan["budgets"])
        for variant in plan["variants"]:
            lines.append(row(plan["model"], variant, plan["frames_per_chunk"], budgets))
    return "\n".join(lines)


def settings_line(document: dict) -> str:
    """Each model's settings as planned (config, chunks, size)."""
    parts = []
    for plan in document["plans"]:
        s = plan["settings"]
        shown = ", ".join(
            f"{k}={s[k]}" for k in ("config", "num_chunks", "steps", "height", "width") if k in s
        )
        parts.append(f"`{plan['model']}` ({shown}; planned in {plan['seconds']:.0f} s)")
    return "Settings: " + "; ".join(parts) + "."


def write_doc(doc: Path, document: dict) -> None:
    """Replace what lies between the markers of ``doc`` with the table."""
    text = doc.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    body = f"\n{table(document)}\n\n{settings_line(document)}\n"
    doc.write_text(text[:start] + body + text[end:])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=None, help="comma list (default: every model)")
    ap.add_argument("--json", type=Path, default=ROOT / "benchmarks/results/plans.json")
    ap.add_argument("--doc", type=Path, default=ROOT / "docs/plan.md")
    args = ap.parse_args(argv)

    from jbkv_cli.models.registry import MODELS
    from jbkv_cli.plan.budget import parse_budgets
    from jbkv_cli.plan.job import PlanRequest, run_plan
    from jbkv_cli.plan.table import plan_document

    names = args.models.split(",") if args.models else list(MODELS)
    plans = []
    with tempfile.TemporaryDirectory() as folder:
        for name in names:
            t0 = time.perf_counter()
            request = PlanRequest(name, {}, specs(), budgets=parse_budgets(BUDGETS))
            plans.append(run_plan(request, Path(folder)))
            print(f"{name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
    document = plan_document(plans)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(document, indent=2) + "\n")
    write_doc(args.doc, document)
    print(table(document))
    return 0


if __name__ == "__main__":
    sys.exit(main())
