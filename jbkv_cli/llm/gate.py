"""The regression gate of llm-prefill runs: ``jbkv report RUN --baseline results.json``.

Like :mod:`jbkv_cli.report.gate` for videos, it passes only when it compared something real:

1. the same model and settings, and the same jobs (chunk size, bin, document) as the baseline;
2. every variant complete: a record for each job of the reference;
3. per (variant, chunk size, bin) row: NLL no higher than the baseline's by more than
   ``nll`` (nats/token) and ``|ΔP_S|`` no larger by more than ``delta_ps``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from jbkv_cli.llm.report import Row
from jbkv_cli.llm.run import KIND
from jbkv_cli.report.gate import GateResult
from jbkv_cli.utils.errors import JbkvError, UsageError, shown
from jbkv_cli.utils.jsonio import read_json

TOLERANCES = {"nll": 0.02, "delta_ps": 0.01}


def parse_tolerances(text: str | None) -> dict[str, float]:
    """``"nll=0.05,delta_ps=0.02"`` on top of :data:`TOLERANCES`; each finite and >= 0."""
    tol = dict(TOLERANCES)
    for part in (text or "").split(","):
        if not part.strip():
            continue
        key, _, value = (s.strip() for s in part.partition("="))
        try:
            number = float(value)
        except ValueError:
            number = float("nan")
        if key not in TOLERANCES or not math.isfinite(number) or number < 0:
            raise UsageError(
                f"bad --tolerance {shown(part)} for an llm-prefill run; use e.g. "
                "nll=0.02,delta_ps=0.01 (finite numbers >= 0)"
            )
        tol[key] = number
    return tol


def load_baseline(path: Path) -> dict[str, Any]:
    """An llm-prefill ``results.json``; any problem is one line naming the file."""
    data = read_json(path, "baseline")  # regular file, <= 64 MiB, finite numbers
    problem = None
    if not isinstance(data, dict) or data.get("kind") != KIND:
        problem = f'not an {KIND} result (no "kind": "{KIND}")'
    elif not isinstance(data.get("settings"), dict) or not isinstance(data.get("jobs"), list):
        problem = "no 'settings' or 'jobs'"
    elif not isinstance(data.get("rows"), list):
        problem = "no 'rows' list"
    else:
        try:
            [Row.from_dict(r) for r in data["rows"]]
        except ValueError as exc:
            problem = str(exc)
    if problem:
        raise JbkvError(f"baseline {path} is not a jbkv llm-prefill result: {problem}")
    return data


def _rows(result: dict[str, Any]) -> dict[tuple[str, int, str], Row]:
    rows = (Row.from_dict(r) for r in result["rows"])
    return {(r.variant, r.chunk, r.bin): r for r in rows}


def check_baseline(
    current: dict[str, Any], baseline: dict[str, Any], tol: dict[str, float]
) -> GateResult:
    """Compare a run's result with a baseline; see the module docstring."""
    result = GateResult()
    problems = result.problems
    if current["model"] != baseline["model"]:
        problems.append(f"model {current['model']!r}, baseline {baseline['model']!r}")
        return result
    settings, base = current["settings"], baseline["settings"]
    diff = sorted(k for k in set(settings) | set(base) if settings.get(k) != base.get(k))
    if diff:
        problems.append("settings differ: " + ", ".join(diff[:4]))
    jobs = {tuple(j) for j in current["jobs"]}
    base_jobs = {tuple(j) for j in baseline["jobs"]}
    if jobs != base_jobs:
        problems.append(
            f"jobs differ: {len(base_jobs - jobs)} missing, {len(jobs - base_jobs)} not in the "
            "baseline"
        )
    rows, base_rows = _rows(current), _rows(baseline)
    for label, keys in (
        ("missing", set(base_rows) - set(rows)),
        ("not in the baseline", set(rows) - set(base_rows)),
    ):
        if keys:
            names = sorted(f"{v} c{c} {b}" for v, c, b in keys)
            problems.append(
                f"rows {label}: {', '.join(names[:3])}" + (" …" if len(names) > 3 else "")
            )
    compared: set[str] = set()
    ref_counts = {(c, b): r.examples for (v, c, b), r in rows.items() if r.is_reference}
    for key in sorted(set(rows) & set(base_rows)):
        row, old = rows[key], base_rows[key]
        name = f"{key[0]} c{key[1]} {key[2]}"
        want = ref_counts.get(key[1:], 0)
        if row.examples != want or want == 0:
            problems.append(f"{name}: {row.examples} of {want} examples done")
            continue
        if old.nll is not None:
            if row.nll is None:
                problems.append(f"{name}: nll missing")
            else:
                compared.add("nll")
                worse = row.nll.mean - old.nll.mean
                if worse > tol["nll"]:
                    problems.append(
                        f"{name}: NLL {row.nll.mean:.4f} vs baseline {old.nll.mean:.4f} "
                        f"(worse by {worse:.4f} > {tol['nll']})"
                    )
        if old.delta_ps is not None and row.delta_ps is not None:
            compared.add("delta_ps")
            worse = abs(row.delta_ps) - abs(old.delta_ps)
            if worse > tol["delta_ps"]:
                problems.append(
                    f"{name}: |ΔP_S| {abs(row.delta_ps):.4f} vs baseline "
                    f"{abs(old.delta_ps):.4f} (worse by {worse:.4f} > {tol['delta_ps']})"
                )
    result.variants = len({k[0] for k in set(rows) & set(base_rows)})
    result.videos = len(jobs)
    result.metrics = [m for m in ("nll", "delta_ps") if m in compared]
    return result


def summary(result: GateResult) -> str:
    """e.g. ``3 variants × 12 jobs, nll/delta_ps``."""
    return f"{result.variants} variants × {result.videos} jobs, {'/'.join(result.metrics)}"
