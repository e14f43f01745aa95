"""The CI regression gate: a run's result against a committed baseline result.

A baseline is the JSON that ``quantize-eval --json`` (or ``report --format json``) writes. The gate
passes only when it compared something real:

1. the same model and generation settings, the same set of (prompt, seed) videos and the same
   variants as the baseline (anything that differs is named);
2. every variant of the run is complete: all its videos generated and scored;
3. no metric of a variant is worse than the baseline's by more than its tolerance: PSNR, SSIM
   (higher is better), LPIPS (lower), ``|ΔP_S|`` (closer to 0), and the working bytes of a cache
   read (``kv_working_bytes``, lower; its tolerance is relative, 0.05 = 5 % more than the
   baseline's). Metrics the baseline lacks (LPIPS without AlexNet weights, working bytes in a
   baseline made before they were recorded) are skipped and listed as such; each quantized
   variant must have at least one metric compared;
4. no variant of the run is a no-op (its method compressed none of what its caches held, or
   its pruner dropped nothing: :mod:`jbkv_cli.kvcache.coverage`), and none compressed a
   smaller share of what it held than in the baseline (when the baseline records it).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from jbkv_cli.report.results import ResultRow, percent
from jbkv_cli.utils.errors import JbkvError, UsageError, shown
from jbkv_cli.utils.jsonio import read_json

TOLERANCES = {"psnr": 0.5, "ssim": 0.01, "lpips": 0.01, "delta_ps": 0.01}
TOLERANCES["kv_working_bytes"] = 0.05  # relative
HIGHER_IS_BETTER = {"psnr": True, "ssim": True, "lpips": False, "kv_working_bytes": False}
_METRIC_KEYS = ("psnr", "ssim", "lpips", "delta_ps", "kv_working_bytes")
_BYTES = ("kv_working_bytes",)  # plain ints on the row, compared relative to the baseline
SHARE_SLACK = 1e-6  # compressed shares are ratios of integer counts: equal runs give equal ones


@dataclass
class GateResult:
    """What the gate compared, and what failed (``passed`` when nothing did)."""

    problems: list[str] = field(default_factory=list)
    variants: int = 0
    videos: int = 0
    metrics: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.problems

    def summary(self) -> str:
        """e.g. ``9 variants × 4 videos, psnr/ssim/delta_ps``."""
        return f"{self.variants} variants × {self.videos} videos, {'/'.join(self.metrics)}"


def parse_tolerances(text: str | None) -> dict[str, float]:
    """``"psnr=0.5,ssim=0.01"`` -> dict, on top of :data:`TOLERANCES`; each finite and >= 0."""
    tol = dict(TOLERANCES)
    if not text:
        return tol
    for part in text.split(","):
        key, _, value = part.partition("=")
        key = key.strip()
        if key not in TOLERANCES or not value.strip():
            raise UsageError(
                f"bad --tolerance {shown(part)}; use e.g. psnr=0.5,ssim=0.01,lpips=0.01,delta_ps=0.01"
            )
        try:
            number = float(value)
        except ValueError:
            raise UsageError(f"bad --tolerance value {shown(value)} for {key}") from None
        if not math.isfinite(number) or number < 0:
            raise UsageError(f"--tolerance {key} must be a finite number >= 0, got {value.strip()}")
        tol[key] = number
    return tol


def load_baseline(path: Path) -> dict[str, Any]:
    """Read and validate a baseline; any problem is one line naming the file and the field."""
    data = read_json(path, "baseline", finite=False)  # regular file, <= 64 MiB; values: below
    problem = _shape_problem(data)
    if problem:
        raise JbkvError(f"baseline {path} is not a jbkv result: {problem}")
    return data


def _shape_problem(data: Any) -> str | None:
    if not isinstance(data, dict):
        return "not a JSON object"
    if not isinstance(data.get("model"), str):
        return "no 'model'"
    if not isinstance(data.get("settings"), dict):
        return "no 'settings' object"
    videos = data.get("videos")
    if not isinstance(videos, list) or not all(_is_video(v) for v in videos):
        return "no 'videos' list of [prompt, seed] (made before jbkv recorded it: regenerate it)"
    rows = data.get("rows")
    if not isinstance(rows, list) or not all(isinstance(r, dict) for r in rows):
        return "no 'rows' list"
    for row in rows:
        try:
            ResultRow.from_dict(row)
        except ValueError as exc:
            return str(exc)
    return None


def _is_video(v: Any) -> bool:
    return isinstance(v, list) and len(v) == 2 and isinstance(v[0], str) and type(v[1]) is int


def _listed(items: list[str], limit: int = 3) -> str:
    more = f", … ({len(items)} in all)" if len(items) > limit else ""
    return ", ".join(items[:limit]) + more


def check_baseline(
    current: dict[str, Any], baseline: dict[str, Any], tol: dict[str, float]
) -> GateResult:
    """Compare a run's result (``report.to_json``) with a baseline; see the module docstring."""
    result = GateResult()
    problems = result.problems
    if current["model"] != baseline["model"]:
        problems.append(f"model {current['model']!r}, baseline {baseline['model']!r}")
        return result
    settings, base_settings = current["settings"], baseline["settings"]
    diff = sorted(
        k for k in set(settings) | set(base_settings) if settings.get(k) != base_settings.get(k)
    )
    if diff:
        problems.append(
            "settings differ: "
            + _listed(
                [f"{k} {settings.get(k)!r} (baseline {base_settings.get(k)!r})" for k in diff]
            )
        )
    videos = {tuple(v) for v in current["videos"]}
    base_videos = {tuple(v) for v in baseline["videos"]}
    for label, items in (
        ("missing", base_videos - videos),
        ("not in the baseline", videos - base_videos),
    ):
        if items:
            names = [f"{p[:40]!r} seed {s}" for p, s in sorted(items)]
            problems.append(f"videos {label}: {_listed(names)}")
    rows = _quantized_rows(current)
    base_rows = _quantized_rows(baseline)
    if not base_rows:
        problems.append("the baseline has no quantized variant to compare")
    for label, items in (
        ("missing", set(base_rows) - set(rows)),
        ("not in the baseline", set(rows) - set(base_rows)),
    ):
        if items:
            problems.append(f"variants {label}: {_listed(sorted(items))}")
    n = len(base_videos)  # what every variant must have: the baseline's videos
    reference = _reference_row(current)
    if reference is not None and reference.videos != n:
        problems.append(_count(reference.variant, reference.videos, None, n))
    compared: set[str] = set()
    for vid in sorted(set(rows) & set(base_rows)):
        row, base = rows[vid], base_rows[vid]
        scored = row.psnr.n if row.psnr else 0
        if row.videos != n or scored != n:
            problems.append(_count(vid, row.videos, scored, n))
            continue
        checked = _compare_row(vid, row, base, tol, problems)
        if not checked:
            problems.append(f"{vid}: no metric to compare (the baseline has none)")
        compared |= checked
    problems += _coverage_problems(rows, base_rows)
    result.variants = len(set(rows) & set(base_rows))
    result.videos = len(videos)
    result.metrics = [m for m in _METRIC_KEYS if m in compared]
    return result


def _coverage_problems(rows: dict[str, ResultRow], base_rows: dict[str, ResultRow]) -> list[str]:
    """No-op variants, and variants compressing less of what they held than the baseline's."""
    problems = [
        f"{vid}: {rows[vid].compression_mark}: its row would read as compression that did "
        "not happen"
        for vid in sorted(rows)
        if rows[vid].no_op
    ]
    for vid in sorted(set(rows) & set(base_rows)):
        now, base = rows[vid].compressed_share, base_rows[vid].compressed_share
        if base is not None and not rows[vid].no_op and (now is None or now < base - SHARE_SLACK):
            shown = "not recorded" if now is None else percent(now)
            problems.append(f"{vid}: compressed {shown} of what it held, baseline {percent(base)}")
    return problems


def _count(vid: str, made: int, scored: int | None, want: int) -> str:
    """``v: 3 of 4 videos generated, 3 scored``, or ``v: 5 videos generated, 5 scored, the
    baseline has 4``: never "5 of 4"."""
    done = "" if scored is None else f", {scored} scored"
    if made <= want:
        return f"{vid}: {made} of {want} videos generated{done}"
    return f"{vid}: {made} videos generated{done}, the baseline has {want}"


def _reference_row(result: dict[str, Any]) -> ResultRow | None:
    rows = (ResultRow.from_dict(r) for r in result["rows"])
    return next((r for r in rows if r.is_reference), None)


def _quantized_rows(result: dict[str, Any]) -> dict[str, ResultRow]:
    rows = (ResultRow.from_dict(r) for r in result["rows"])
    return {r.variant: r for r in rows if not r.is_reference}


def _compare_row(
    vid: str, row: ResultRow, base: ResultRow, tol: dict[str, float], problems: list[str]
) -> set[str]:
    checked = set()
    for metric in _METRIC_KEYS:
        b = getattr(base, metric) if metric in _BYTES else base.mean(metric)
        if b is None:
            continue
        c = getattr(row, metric) if metric in _BYTES else row.mean(metric)
        if c is None or not math.isfinite(c):
            problems.append(f"{vid}: {metric} missing (baseline {b:.4f})")
            continue
        checked.add(metric)
        if metric == "delta_ps":
            worse, what, c_shown, b_shown = abs(c) - abs(b), "|ΔP_S|", abs(c), abs(b)
        elif metric in _BYTES:
            worse, what, c_shown, b_shown = (c - b) / b if b else 0.0, metric, c, b
        else:
            worse = b - c if HIGHER_IS_BETTER[metric] else c - b
            what, c_shown, b_shown = metric, c, b
        if worse > tol[metric]:
            problems.append(
                f"{vid}: {what} {c_shown:.4f} vs baseline {b_shown:.4f} "
                f"(worse by {worse:.4f} > {tol[metric]})"
            )
    return checked
