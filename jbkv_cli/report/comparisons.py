"""The paired comparisons of a run beyond the correction gains, each with paired statistics.

- **method vs method at matched bits**: among the full variants (keys and values stored, no
  ablation; no no-op, :mod:`jbkv_cli.kvcache.coverage`: a variant that compressed nothing is
  not a method at that size) with the same bit width, correction and pruner, the one with the
  highest mean PSNR
  is the group's best; every other variant of the group is compared with it, PSNR(variant) −
  PSNR(best) paired per video. The question answered: which methods are *not* distinguishable
  from the best one at this size.
- **variant vs reference**: ΔP_S per video (the attention mass the quantized cache moves between
  the cached and the current tokens, measured against the full-precision cache in the same
  pass: already a paired difference), tested against 0 for every variant that records it.

Each table (the correction gains of :func:`jbkv_cli.report.table.paired_differences`, the method
comparisons, the reference comparisons) is Holm-adjusted over its own rows
(:mod:`jbkv_cli.metrics.paired`). Rendering for the terminal and Markdown is here too, so
``quantize-eval`` and ``report`` print the same lines.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from jbkv_cli.metrics.paired import describe, format_p, mark, paired_summary, with_holm
from jbkv_cli.report.results import ResultRow
from jbkv_cli.run.directory import RunDir

Summarize = Callable[[list[float]], dict[str, Any]]


class Scores:
    """Per-video PSNR of each variant, read once per report: against the reference
    (``metrics/fidelity``, the default ``kind``) or against the pruned 16-bit video
    (``metrics/pruned16``, :mod:`jbkv_cli.run.pruned_base`)."""

    def __init__(self, run: RunDir) -> None:
        self.run = run
        self._psnr: dict[tuple[str, str], dict[str, float]] = {}

    def psnr(self, vid: str, kind: str = "fidelity") -> dict[str, float]:
        if (kind, vid) not in self._psnr:
            fid = self.run.read_metrics(kind, vid)
            psnr = {n: s["psnr"] for n, s in fid.items() if s.get("psnr") is not None}
            self._psnr[kind, vid] = psnr
        return self._psnr[kind, vid]

    def diffs(self, vid_a: str, vid_b: str, kind: str = "fidelity") -> list[float]:
        """PSNR(b) − PSNR(a) over the videos both have, in name order (both of ``kind``)."""
        a, b = self.psnr(vid_a, kind), self.psnr(vid_b, kind)
        return [b[n] - a[n] for n in sorted(set(a) & set(b))]


def method_comparisons(
    rows: list[ResultRow], scores: Scores, summarize: Summarize = paired_summary
) -> list[dict[str, Any]]:
    """Per (bits, correction, pruner) group of two or more full variants with PSNR: the best
    variant and each other one's paired PSNR difference to it (module docstring)."""
    groups: dict[tuple[int, str, str], list[ResultRow]] = {}
    for r in rows:
        if r.full and not r.is_reference and r.psnr is not None and not r.no_op:
            groups.setdefault((r.bits, r.correction, r.pruner), []).append(r)
    out = []
    for (bits, correction, pruner), members in groups.items():
        if len(members) < 2:
            continue
        best = max(members, key=lambda r: r.psnr.mean)
        comparisons = []
        for r in members:
            if r is best:
                continue
            diffs = scores.diffs(best.variant, r.variant)
            comparisons.append(
                {
                    "variant": r.variant,
                    "label": r.label,
                    "psnr_diff": summarize(diffs) if diffs else None,
                }
            )
        out.append(
            {
                "bits": bits,
                "correction": correction,
                "pruner": pruner,
                "best": best.variant,
                "best_label": best.label,
                "best_psnr": best.psnr.mean,
                "comparisons": comparisons,
            }
        )
    with_holm([c["psnr_diff"] for g in out for c in g["comparisons"]])
    return out


def reference_comparisons(
    run: RunDir, rows: list[ResultRow], summarize: Summarize = paired_summary
) -> list[dict[str, Any]]:
    """Per variant that records ΔP_S: its per-video values tested against 0."""
    out = []
    for r in rows:
        if r.is_reference or r.delta_ps is None:
            continue
        values = [
            d
            for d in (
                (rec.get("diagnostics") or {}).get("delta_ps") for rec in run.records(r.variant)
            )
            if d is not None
        ]
        out.append(
            {
                "variant": r.variant,
                "label": r.label,
                "metric": "delta_ps",
                "diff": summarize(values) if values else None,
            }
        )
    with_holm([c["diff"] for c in out])
    return out


# --- rendering ----------------------------------------------------------------------------------

LEGEND = (
    "paired over videos: 95% CI (t), p_t paired t-test, p_W Wilcoxon signed-rank, Holm = p_t "
    "Holm-adjusted over the table, * Holm < 0.05, videos for 80% power at α = 0.05"
)


def _paired_text(g: dict[str, Any]) -> str:
    """``+0.42 ± 0.18 dB paired, [+0.05, +0.79], p_t …``."""
    se = f" ± {g['se']:.2f}" if g.get("se") is not None else ""
    stats = describe(g, with_mean=False)
    stats = f", {stats}" if stats else ""
    return f"{g['mean']:+.2f}{se} dB paired{stats}"


def gain_line(gain: dict[str, Any]) -> str | None:
    """``taylor on INT2 rtn g32: PSNR +0.42 ± 0.18 dB paired, [+0.05, +0.79], p_t …``; on a
    pruned and quantized format with its pruned 16-bit variant in the run, both gains, each
    naming its reference: ``… PSNR vs the full reference +0.08 …; vs the pruned 16-bit cache
    (16-bit flowcache) +0.40 …``."""
    g = gain.get("psnr_gain")
    if not g:
        return None
    frac = gain.get("recovered_fraction")
    rec = f" ({frac:+.0%} of the gap to {gain['gap_to']})" if frac is not None else ""
    label = f"{gain['correction']} on {gain['label']}"
    if not gain.get("pruned16"):
        return f"{label}: PSNR {_paired_text(g)}{rec}"
    g16 = gain.get("psnr_gain_vs_pruned16")
    vs16 = _paired_text(g16) if g16 else "no video has both scores"
    return (
        f"{label}: PSNR vs the full reference {_paired_text(g)}{rec}; "
        f"vs the pruned 16-bit cache ({gain.get('pruned16_label') or gain['pruned16']}) {vs16}"
    )


def method_line(group: dict[str, Any]) -> str:
    """One line per group: its best variant, the others not significantly below it (with their
    statistics), and how many are."""
    tested = [c for c in group["comparisons"] if c["psnr_diff"] and c["psnr_diff"].get("p_t")]
    lower = [c for c in tested if mark(c["psnr_diff"]) and c["psnr_diff"]["mean"] < 0]
    tied = [c for c in group["comparisons"] if c not in lower]
    head = (
        f"INT{group['bits']} · {group['correction']}"
        + ("" if group["pruner"] == "none" else f" · {group['pruner']}")
        + f": best {group['best_label']} ({group['best_psnr']:.2f} dB); "
        + f"{len(lower)} of {len(group['comparisons'])} significantly lower"
    )
    if not tied:
        return head
    shown = [
        f"{c['label']} {describe(c['psnr_diff'])}" if c["psnr_diff"] else f"{c['label']} (no pairs)"
        for c in tied
    ]
    return head + "; not distinguishable: " + "; ".join(shown)


def reference_line(comparisons: list[dict[str, Any]]) -> str | None:
    """``ΔP_S ≠ 0 (vs the reference): 120 of 126 variants (Holm < 0.05); not: …``."""
    tested = [c for c in comparisons if c["diff"]]
    if not tested:
        return None
    sig = [c for c in tested if mark(c["diff"])]
    line = f"ΔP_S ≠ 0 vs the reference: {len(sig)} of {len(tested)} variants (Holm < 0.05)"
    rest = [c for c in tested if not mark(c["diff"])]
    if rest:
        line += (
            "; not: "
            + "; ".join(f"{c['label']} {describe(c['diff'], 4)}" for c in rest[:10])
            + (f"; … {len(rest) - 10} more" if len(rest) > 10 else "")
        )
    return line


def comparison_lines(data: dict[str, Any]) -> list[str]:
    """What the terminal prints under the table: the legend, then every comparison table's
    lines (``data``: :func:`jbkv_cli.report.table.to_json`'s document)."""
    lines = [line for g in data.get("correction_gains") or [] if (line := gain_line(g))]
    lines += [method_line(g) for g in data.get("method_comparisons") or []]
    ref = reference_line(data.get("reference_comparisons") or [])
    lines += [ref] if ref else []
    return [LEGEND, *lines] if lines else []


TABLE_COLUMNS = (
    "comparison",
    "against",
    "metric",
    "mean",
    "95% CI",
    "p_t",
    "p_W",
    "Holm",
    "videos needed",
)


def comparison_table(data: dict[str, Any]) -> list[list[str]]:
    """Every comparison of the three tables as cells under :data:`TABLE_COLUMNS` (the first
    two are user text: variant labels). Holm cells end in `` *`` when significant."""
    items = []
    for g in data.get("correction_gains") or []:
        what = f"{g['correction']} on {g['label']}"
        if not g.get("pruned16"):
            items.append((what, "uncorrected", "PSNR dB", g["psnr_gain"]))
            continue
        base = g.get("pruned16_label") or g["pruned16"]
        items.append((what, "uncorrected", "PSNR dB vs the full reference", g["psnr_gain"]))
        items.append((what, "uncorrected", f"PSNR dB vs {base}", g["psnr_gain_vs_pruned16"]))
    for grp in data.get("method_comparisons") or []:
        for c in grp["comparisons"]:
            items.append((c["label"], grp["best_label"], "PSNR dB", c["psnr_diff"]))
    for c in data.get("reference_comparisons") or []:
        items.append((c["label"], "reference", "ΔP_S", c["diff"]))
    cells = []
    for what, against, metric, s in items:
        if not s:
            continue
        digits = 4 if metric == "ΔP_S" else 2  # (a PSNR metric may name a label: user text)
        ci = s.get("ci95")
        ci_text = "—" if not ci else f"[{ci[0]:+.{digits}f}, {ci[1]:+.{digits}f}]"
        ps = [
            format_p(s[k]) if s.get(k) is not None else "—" for k in ("p_t", "p_wilcoxon", "p_holm")
        ]
        ps[2] += " *" if mark(s) else ""
        need = "—" if s.get("videos_needed") is None else str(s["videos_needed"])
        cells.append([what, against, metric, f"{s['mean']:+.{digits}f}", ci_text, *ps, need])
    return cells


def comparisons_markdown(data: dict[str, Any]) -> str:
    """The comparison table in Markdown, or "" when there are none."""
    cells = comparison_table(data)
    if not cells:
        return ""
    lines = ["", f"Paired comparisons ({LEGEND}).", ""]
    lines += ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    lines += ["| " + " | ".join(row) + " |" for row in cells]
    return "\n".join(lines) + "\n"
