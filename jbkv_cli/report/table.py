"""Report: rows built from a run directory alone, rendered last (Rich, Markdown, CSV, JSON, PNG).

Each row is one variant, a typed :class:`~jbkv_cli.report.results.ResultRow`; each metric a
:class:`~jbkv_cli.report.results.Stat` over videos, paired with the reference of the same prompt and seed
(so the SE is a paired standard error). Nothing here recomputes a video or a metric:
``quantize-eval`` and ``report`` print the same table.
"""

from __future__ import annotations

import csv
import io
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from jbkv_cli.kvcache.coverage import Coverage, compressed_share, pruned_share
from jbkv_cli.metrics.paired import paired_summary, with_holm
from jbkv_cli.report.comparisons import Scores, method_comparisons, reference_comparisons
from jbkv_cli.report.fit import print_fitted
from jbkv_cli.report.frontier import frontiers
from jbkv_cli.report.horizon import horizon_section
from jbkv_cli.report.memory import bias_share_by_layer, memory_fields
from jbkv_cli.report.results import ResultRow, Stat
from jbkv_cli.report.vbench_time import read_vbench
from jbkv_cli.run.directory import RunDir, video_name
from jbkv_cli.run.pruned_base import KIND as PRUNED16
from jbkv_cli.run.pruned_base import pruned_baselines
from jbkv_cli.run.schema import BIG
from jbkv_cli.utils.console import plain
from jbkv_cli.utils.errors import JbkvError

LP_METRICS = ("lp_shift", "lp_predicted", "lp_left", "lp_ratio")  # attention/partition.py
ERROR_METRICS = (
    "bias_share",
    "bias_explained",
    "correction_removed",
    "attn_err_quant",
    "attn_err_bias",
    "attn_err_corrected",
)  # attention/bias_share.py


def reference_bits(run: RunDir) -> int:
    """Bits per cached element of the reference: 16 for BF16/FP16, 32 for FP32 runs."""
    dtype = str(run.manifest.get("settings", {}).get("dtype", "bfloat16"))
    return 32 if "32" in dtype else 16


def reference_label(run: RunDir) -> str:
    return "FP32" if reference_bits(run) == 32 else "BF16"


def vbench_results(run: RunDir) -> dict[str, dict[str, Any]]:
    """Per variant: VBench dimension scores and totals from ``metrics/vbench.json`` (if any)."""
    doc = read_vbench(run)
    return vbench_variants(doc) if doc is not None else {}


def vbench_variants(doc: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """``{variant: {"dimensions": {d: {"mean", "se", "n"}}, "quality": …, "total": …}}`` from a
    ``vbench.json`` document."""
    out = {}
    for vid, v in (doc.get("variants") or {}).items():
        dims = {
            d: {"mean": x["score"], "se": x.get("se"), "n": x.get("n_videos")}
            for d, x in (v.get("dimensions") or {}).items()
            if isinstance(x, dict) and x.get("score") is not None
        }
        out[vid] = {"dimensions": dims, **(v.get("totals") or {})}
    return out


def build_rows(run: RunDir) -> list[ResultRow]:
    """One row per variant (reference first), from records and metrics on disk."""
    variants = run.variants()
    vbench = vbench_results(run)
    reference = run.reference
    if reference not in variants:
        raise JbkvError(f"{run.root} has no reference videos yet")
    ref_bytes = Stat.of([r["kv_cache_bytes"] for r in run.records(reference)])
    ref_working = memory_fields(run.records(reference))["kv_working_bytes"]
    ref_bits = reference_bits(run)
    rows = []
    for vid, spec in variants.items():
        records = run.records(vid)
        fid = run.read_metrics("fidelity", vid)
        names = [video_name(r["prompt"], r["index"]) for r in records]
        scores = [fid[n] for n in names if n in fid]
        diag = [r.get("diagnostics") or {} for r in records]
        kv = Stat.of([r["kv_cache_bytes"] for r in records])
        ratio = kv.mean / ref_bytes.mean if kv and ref_bytes and ref_bytes.mean else None
        eff = None if ratio is None else ref_bits * ratio
        ref = vid == reference
        memory = memory_fields(records)
        working = memory["kv_working_bytes"]
        rows.append(
            ResultRow(
                variant=vid,
                label=_label(spec, run, ref) + _storage_note(spec, run),
                quantizer=spec.quantizer,
                bits=spec.bits,
                group_size=None if ref else spec.group_size,
                effective_bits=eff,
                corrected=spec.correction_.active and not spec.bias_only,
                correction=spec.correction,
                keys=spec.keys,
                values=spec.values,
                bias_only=spec.bias_only,
                psnr=Stat.of([s["psnr"] for s in scores]),
                ssim=Stat.of([s["ssim"] for s in scores]),
                lpips=Stat.of([s.get("lpips") for s in scores]),
                lpips_status=next(
                    (s.get("lpips_status") for s in scores if s.get("lpips") is None), None
                ),
                delta_ps=Stat.of([d.get("delta_ps") for d in diag]),
                jsd=Stat.of([d.get("jsd") for d in diag]),
                out_mse=Stat.of([d.get("out_mse") for d in diag]),
                noise_var_ratio=Stat.of([_noise_ratio(d) for d in diag]),
                noise_z_mean=Stat.of([d.get("noise_z_mean") for d in diag]),
                **{m: Stat.of([d.get(m) for d in diag]) for m in LP_METRICS},
                kv_cache_bytes=None if kv is None else round(kv.mean),
                seconds=Stat.of([r["seconds"] for r in records]),
                videos=len(records),
                vbench=vbench.get(vid),
                storage=spec.storage_id,
                pruner=spec.pruner.name if spec.pruner is not None else "none",
                kv_ratio=ratio,
                kv_bytes_by_head=_bytes_by_head(records),
                kv_bytes_by_cache=_bytes_by_head(records, "kv_cache_bytes_by_cache"),
                value_bits=spec.value.bits if spec.mixed else None,
                token_shift=Stat.of([d.get("token_shift") for d in diag]),
                **memory,
                working_ratio=working / ref_working if working and ref_working else None,
                **{m: Stat.of([d.get(m) for d in diag]) for m in ERROR_METRICS},
                bias_share_by_layer=bias_share_by_layer(records),
                **_coverage(spec, records),
                layer_bits=None if spec.layers is None else str(spec.layers),
                taylor_outside=spec.taylor_outside,
            )
        )
    return rows


def _coverage(spec, records: list[dict[str, Any]]) -> dict[str, float | None]:
    """``compressed_share`` (a variant whose method stores the cache) and ``pruned_share`` (a
    pruned one) over its videos, token-rows summed (:mod:`jbkv_cli.kvcache.coverage`); None
    where the variant claims neither or no record says (runs made before jbkv recorded it). A
    record with ``compression: null`` held nothing: that variant compressed nothing."""
    out: dict[str, float | None] = {"compressed_share": None, "pruned_share": None}
    said = [r for r in records if "compression" in r]
    if not said:
        return out
    total = Coverage()
    for r in said:
        total.add(Coverage.from_dict(r["compression"]) or Coverage())
    if spec.quantized:
        out["compressed_share"] = compressed_share(total.held, total.compressed) or 0.0
    if spec.pruner is not None:
        out["pruned_share"] = pruned_share(total.unpruned, total.kept) or 0.0
    return out


def _noise_ratio(diag: dict[str, Any]) -> float | None:
    """Measured / predicted noise variance of one video; None when either is missing or the
    ratio leaves the range a mean can be taken over (a predicted variance of ~0)."""
    measured, predicted = diag.get("noise_measured_var"), diag.get("noise_predicted_var")
    if measured is None or not predicted:
        return None
    ratio = measured / predicted
    return ratio if abs(ratio) <= BIG else None


def _label(spec, run: RunDir, reference: bool) -> str:
    """The spec's label, naming the precision a full-precision cache really had (FP32 runs)."""
    if reference:
        return reference_label(run)
    if spec.method is None:  # pruned only: stored as the model gave it
        return spec.label.replace("16-bit", reference_label(run), 1)
    return spec.label


def _bits_cell(row: ResultRow) -> str:
    """``4``, ``K4V2`` where keys and values are stored at different widths, or the per-layer
    spec (``K2V2@0-3+K2V1@4-``)."""
    if row.layer_bits is not None:
        return row.layer_bits
    if row.value_bits is None or row.value_bits == row.bits:
        return str(row.bits)
    return f"K{row.bits}V{row.value_bits}"


def _storage_note(spec, run: RunDir) -> str:
    """`` (K=4: L/64 cap)`` where the method stores this model's chunks in a way the row should
    say (:meth:`~jbkv_cli.quant.method.KVMethod.storage_note`), else ""."""
    tokens = run.manifest.get("settings", {}).get("tokens_per_chunk")
    if spec.method is None or type(tokens) is not int or tokens < 1:
        return ""
    note = spec.method.storage_note(tokens)
    return f" ({note})" if note else ""


def _bytes_by_head(
    records: list[dict[str, Any]], key: str = "kv_cache_bytes_by_head"
) -> dict[str, int] | None:
    """Mean peak cache bytes per head class over videos (pruned variants), else None; with
    ``key="kv_cache_bytes_by_cache"`` per cache of a model with several (Matrix-Game-2.0's
    main, mouse and keyboard caches)."""
    split = [(r.get("info") or {}).get(key) for r in records]
    split = [s for s in split if isinstance(s, dict)]
    if not split:
        return None
    kinds = dict.fromkeys(["static", "dynamic", *(k for s in split for k in s)])
    kinds = [k for k in kinds if any(k in s for s in split)]
    return {k: round(sum(s.get(k, 0) for s in split) / len(split)) for k in kinds}


def _family(row: ResultRow) -> str:
    """The stored format without its bit width: ``int2-kivi-g32-r64`` -> ``kivi-g32-r64``."""
    storage = row.storage or f"int{row.bits}-{row.quantizer}-g{row.group_size}"
    return storage.split("-", 1)[1] if storage.startswith(f"int{row.bits}-") else storage


def paired_differences(
    run: RunDir, rows: list[ResultRow], scores: Scores | None = None
) -> list[dict[str, Any]]:
    """Per stored format: PSNR(corrected) − PSNR(uncorrected), paired per video, and the share
    of the gap to the same format with more bits (INT_low → INT_high) it recovers. Variants that
    differ only in a method option (KIVI's residual, a rotation seed) are kept apart.
    ``psnr_gain`` holds the paired statistics (:func:`~jbkv_cli.metrics.paired.paired_summary`),
    Holm-adjusted over the gains of the run: both scored against the full reference.

    A pruned and quantized format whose pruner's 16-bit variant is in the run also gets the gain
    scored against that pruned 16-bit video (:mod:`jbkv_cli.run.pruned_base`):
    ``pruned16`` (its variant id), ``pruned16_label``, ``psnr_gain_vs_pruned16`` (paired
    statistics, Holm-adjusted over these gains of the run; None when no video has both scores);
    None for the others."""
    scores = scores or Scores(run)
    bases = pruned_baselines(run.variants())
    labels = {r.variant: r.label for r in rows}
    by_key = {(_family(r), r.bits, r.correction): r for r in rows if r.full and not r.is_reference}
    out = []
    for (fam, b, c), row in by_key.items():
        base = by_key.get((fam, b, "none"))
        if c == "none" or base is None:
            continue
        diffs = scores.diffs(base.variant, row.variant)
        diff = paired_summary(diffs) if diffs else None
        higher = sorted(
            (r for k, r in by_key.items() if k[0] == fam and k[1] > b and k[2] == "none"),
            key=lambda r: r.bits,
        )
        gap = None
        if higher and base.psnr and higher[0].psnr:
            gap = higher[0].psnr.mean - base.psnr.mean
        recovered = diff["mean"] / gap if diff and gap else None
        base16 = bases.get(row.variant)
        base16 = base16 if base16 == bases.get(base.variant) else None
        vs16 = scores.diffs(base.variant, row.variant, PRUNED16) if base16 else []
        out.append(
            {
                "quantizer": row.quantizer,
                "bits": b,
                "group_size": row.group_size,
                "storage": row.storage,
                "label": base.label,
                "correction": c,
                "psnr_gain": diff,
                "gap_to": higher[0].variant if higher else None,
                "gap_db": gap,
                "recovered_fraction": recovered,
                "pruned16": base16,
                "pruned16_label": labels.get(base16) if base16 else None,
                "psnr_gain_vs_pruned16": paired_summary(vs16) if vs16 else None,
            }
        )
    with_holm([g["psnr_gain"] for g in out])
    with_holm([g["psnr_gain_vs_pruned16"] for g in out])
    return out


# --- rendering ----------------------------------------------------------------------------------


def _fmt(
    m: Stat | dict[str, Any] | None, digits: int, signed: bool = False, sep: str | None = " ± "
) -> str:
    """``mean ± se`` (``sep=None``: the mean alone)."""
    if isinstance(m, dict):
        m = Stat.from_dict(m, "value") if m.get("mean") is not None else None
    if m is None:
        return "—"
    sign = "+" if signed else ""
    text = f"{m.mean:{sign}.{digits}f}"
    return text + (f"{sep}{m.se:.{digits}f}" if m.se is not None and sep is not None else "")


def format_stat(m: Stat | None, digits: int, signed: bool = False) -> str:
    """``mean ± se`` of a metric, ``—`` when there is none (the HTML page's cells)."""
    return _fmt(m, digits, signed)


def _best(rows: list[ResultRow], key: str, lower: bool, absolute: bool = False) -> str | None:
    cands = [
        (r.mean(key), r.variant) for r in rows if not r.is_reference and r.mean(key) is not None
    ]
    if not cands:
        return None
    fn = (lambda x: abs(x[0])) if absolute else (lambda x: x[0])
    return (min if lower else max)(cands, key=fn)[1]


COLUMNS = (
    "variant",
    "scheme",
    "bits",
    "eff. bits",
    "corrected",
    "PSNR ↑ dB",
    "SSIM ↑",
    "LPIPS ↓",
    "ΔP_S",
    "Δlog Z",
    "pred/Δ",
    "top-1 shift ↓",
    "KV MB",
    "KV/ref",
    "work MB",
    "peak MB",
    "bias share",
    "removed",
    "s/video",
)
TEXT_COLUMNS = ("variant", "scheme", "corrected")


@dataclass(frozen=True)
class Layout:
    """Which columns a table shows and how compact its cells are (see :data:`LAYOUTS`).

    ``drop``: columns left out; ``sep``: between a mean and its SE; ``bare``: columns shown
    without their SE.
    """

    drop: frozenset[str] = frozenset()
    sep: str = " ± "
    bare: frozenset[str] = frozenset()


# working bytes per read, CUDA peak per video, bias share and what the correction removes
# (attention/memory.py, bias_share.py)
MEMORY_COLUMNS = frozenset({"work MB", "peak MB", "bias share", "removed"})
_REDUNDANT = frozenset({"scheme", "bits", "corrected"})  # the variant label says them
_SECONDARY = _REDUNDANT | {
    "KV MB",
    "KV/ref",
    "s/video",
    "pred/Δ",
    "top-1 shift ↓",
    *MEMORY_COLUMNS,
}  # eff. bits: size
_BARE = frozenset({"SSIM ↑", "LPIPS ↓", "PSNR ↑ dB", "ΔP_S", "Δlog Z"})
_SPARE = frozenset(
    {"KV MB", "s/video", "pred/Δ", *MEMORY_COLUMNS}
)  # eff. bits and KV/ref say the size
LAYOUTS = (
    Layout(),
    Layout(_SPARE),
    Layout(_REDUNDANT),
    Layout(_REDUNDANT | _SPARE),
    Layout(_SECONDARY),
    Layout(_REDUNDANT, "±"),
    Layout(_REDUNDANT | {"s/video", "pred/Δ"}, "±"),
    Layout(_SECONDARY, "±"),
    Layout(_SECONDARY, "±", frozenset({"SSIM ↑", "LPIPS ↓", "Δlog Z"})),
    Layout(_SECONDARY, "±", _BARE),
    Layout(_SECONDARY | {"Δlog Z"}, "±", _BARE),
)
"""From the full table (190 columns) down to the most compact (usable at 80)."""


def table_cells(
    rows: list[ResultRow], layout: Layout = LAYOUTS[0]
) -> tuple[list[str], list[list[str]], dict]:
    """Column names, cell strings and which cells are the best per column."""
    best = {
        "PSNR ↑ dB": _best(rows, "psnr", False),
        "SSIM ↑": _best(rows, "ssim", False),
        "LPIPS ↓": _best(rows, "lpips", True),
        "ΔP_S": _best(rows, "delta_ps", True, absolute=True),
        "top-1 shift ↓": _best(rows, "token_shift", True),
    }

    def fmt(column: str, m: Stat | None, digits: int, signed: bool = False) -> str:
        return _fmt(m, digits, signed, None if column in layout.bare else layout.sep)

    drop = set(layout.drop)
    if layout != LAYOUTS[0] and all(r.lpips is None for r in rows):
        drop.add("LPIPS ↓")  # n/a everywhere: the note under the table says why
    cols = [c for c in COLUMNS if c not in drop]
    cells = []
    for r in rows:
        ref = r.is_reference
        eff = r.effective_bits
        # the reference and pruned-only variants store what the model gives (e.g. FP32)
        unquantized = r.quantizer == "none" and bool(eff) and bool(r.kv_ratio)
        scheme = r.quantizer + ("" if r.keys and r.values else (" K-only" if r.keys else " V-only"))
        scheme += "" if r.pruner == "none" else f" + {r.pruner}"
        lp = fmt("LPIPS ↓", r.lpips, 4) if r.lpips else ("—" if ref else "n/a")
        mark = "; ".join(m for m in (r.compression_mark, TAYLOR_MARK * r.taylor_outside) if m)
        full = {
            "variant": r.label + (f" [{mark}]" if mark else ""),
            "scheme": "—" if ref else scheme + (" bias-only" if r.bias_only else ""),
            "bits": str(round(eff / r.kv_ratio)) if unquantized else _bits_cell(r),
            "eff. bits": "—" if eff is None else f"{eff:.3f}",
            "corrected": "—" if ref else (r.correction if r.corrected else "no"),
            "PSNR ↑ dB": "ref" if ref else fmt("PSNR ↑ dB", r.psnr, 2),
            "SSIM ↑": "ref" if ref else fmt("SSIM ↑", r.ssim, 4),
            "LPIPS ↓": "ref" if ref else lp,
            "ΔP_S": "—" if ref else fmt("ΔP_S", r.delta_ps, 4, signed=True),
            "Δlog Z": "—" if ref else fmt("Δlog Z", r.lp_shift, 4, signed=True),
            "pred/Δ": "—" if ref or r.lp_ratio is None else f"{r.lp_ratio.mean:+.2f}",
            "top-1 shift ↓": "—" if ref else fmt("top-1 shift ↓", r.token_shift, 4),
            "KV MB": "—" if r.kv_cache_bytes is None else f"{r.kv_cache_bytes / 2**20:.3f}",
            "KV/ref": "—" if r.kv_ratio is None else f"{r.kv_ratio:.3f}",
            "work MB": megabytes(r.kv_working_bytes),
            "peak MB": megabytes(r.cuda_peak_bytes),
            "bias share": "—" if ref else fmt("bias share", r.bias_share, 3),
            "removed": "—" if ref else fmt("removed", r.correction_removed, 3, signed=True),
            "s/video": fmt("s/video", r.seconds, 2),
        }
        cells.append([full[c] for c in cols])
    return cols, cells, best


TAYLOR_MARK = "taylor outside its range: 1-bit keys"
TAYLOR_NOTE = (
    "Rows marked *taylor outside its range* apply the taylor correction to 1-bit keys, where "
    'its small-step expansion does not hold (docs/corrections.md, "1-bit keys"); exact and '
    "signed run as they are."
)


def megabytes(n: int | None) -> str:
    """``n`` bytes in MiB with 3 decimals, ``—`` for None."""
    return "—" if n is None else f"{n / 2**20:.3f}"


def rich_table(rows: list[ResultRow], title: str, layout: Layout = LAYOUTS[0]) -> Table:
    cols, cells, best = table_cells(rows, layout)
    compact = layout != LAYOUTS[0]
    table = Table(
        title=plain(title),
        title_justify="left",
        box=box.SIMPLE_HEAD if compact else box.HEAVY_HEAD,
        pad_edge=not compact,
        show_edge=not compact,
        collapse_padding=compact,
    )
    for c in cols:
        table.add_column(c, justify="left" if c in TEXT_COLUMNS else "right", no_wrap=True)
    for r, row_cells in zip(rows, cells, strict=True):
        styled = [
            _rich_cell(text, c, best.get(c) == r.variant)
            for c, text in zip(cols, row_cells, strict=True)
        ]
        table.add_row(*styled, style="bold" if r.is_reference else None)
    return table


def _rich_cell(text: str, column: str, best: bool) -> Text | str:
    """A cell of the Rich table: the best value bold green; text columns hold user text (labels
    read from the run), so they are ``Text``, never markup; numbers stay strings."""
    if best:
        return plain(text, "bold green")
    return plain(text) if column in TEXT_COLUMNS else text


def print_table(console: Console, rows: list[ResultRow], title: str) -> None:
    """The main table at the console's width (:data:`LAYOUTS`), then the VBench table if any."""
    print_fitted(console, lambda layout: rich_table(rows, title, layout), LAYOUTS)
    if any(r.taylor_outside for r in rows):
        console.print(plain(TAYLOR_NOTE.replace("*", "")))
    entries = [(r.label, r.vbench) for r in rows if r.vbench]
    if entries:
        print_vbench_table(console, entries)


def print_vbench_table(console: Console, entries: list[tuple[str, dict[str, Any]]]) -> None:
    """The VBench table at the console's width (SE dropped when it does not fit)."""
    print_fitted(console, lambda sep: vbench_table(entries, sep), (" ± ", "±", None))


VB_TOTALS = ("quality", "semantic", "total")


def vbench_cells(
    entries: list[tuple[str, dict[str, Any]]], sep: str | None = " ± "
) -> tuple[list[str], list[list[str]]]:
    """VBench scores of ``(label, results)`` entries (:func:`vbench_variants`), variants in
    rows: one column per dimension present (— where a variant lacks it), then the totals (a
    partial total, over the dimensions present, is marked ``*``)."""
    dims = sorted({d for _, vb in entries for d in vb.get("dimensions", {})})
    cols = ["variant", *dims, *(t.capitalize() for t in VB_TOTALS)]
    cells = []
    for label, vb in entries:
        row = [label, *(_fmt(vb["dimensions"].get(d), 4, sep=sep) for d in dims)]
        for t in VB_TOTALS:
            value = vb.get(t)
            text = "—" if value is None else _fmt(Stat(value, vb.get(f"{t}_se"), 0), 4, sep=sep)
            row.append(text + ("*" if value is not None and vb.get("partial") else ""))
        cells.append(row)
    return cols, cells


def vbench_table(entries: list[tuple[str, dict[str, Any]]], sep: str | None = " ± ") -> Table:
    cols, cells = vbench_cells(entries, sep)
    partial = any(vb.get("partial") for _, vb in entries)
    table = Table(
        title="VBench",
        title_justify="left",
        box=box.SIMPLE_HEAD,
        caption="* partial: over the dimensions present (VBench weights)" if partial else None,
        caption_justify="left",
    )
    for c in cols:
        header = c if c == "variant" else c.replace("_", "\n")
        table.add_column(header, justify="left" if c == "variant" else "right", no_wrap=True)
    for row in cells:
        table.add_row(plain(row[0]), *row[1:])  # the variant's label is user text
    return table


def lpips_note(rows: list[ResultRow]) -> str | None:
    return next((r.lpips_status for r in rows if r.lpips_status), None)


def to_markdown(rows: list[ResultRow]) -> str:
    """The full table (and the VBench table when there are VBench results) in Markdown."""
    cols, cells, best = table_cells(rows)
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for r, row_cells in zip(rows, cells, strict=True):
        marked = [
            f"**{t}**" if best.get(c) == r.variant else t
            for c, t in zip(cols, row_cells, strict=True)
        ]
        lines.append("| " + " | ".join(marked) + " |")
    if any(r.taylor_outside for r in rows):
        lines += ["", TAYLOR_NOTE]
    entries = [(r.label, r.vbench) for r in rows if r.vbench]
    if entries:
        vcols, vcells = vbench_cells(entries)
        lines += ["", "| " + " | ".join(vcols) + " |", "|" + "---|" * len(vcols)]
        lines += ["| " + " | ".join(row) + " |" for row in vcells]
    return "\n".join(lines) + "\n"


HORIZON_CSV = ("divergence_median", "diverged", "divergence_videos", "still_valid_last")


def to_csv(rows: list[ResultRow], horizon: dict[str, Any] | None = None) -> str:
    """One line per variant (``bits`` the keys' width, ``value_bits`` the values' where it
    differs, ``layer_bits`` the per-layer spec where there is one); with the report's
    ``horizon`` section (:mod:`jbkv_cli.report.horizon`) its median divergence chunk, videos
    diverged and scored for it, and the still-valid fraction at the last chunk (empty where
    there is none)."""
    by_vid = {v["variant"]: v for v in (horizon or {}).get("variants", [])}
    buf = io.StringIO()
    fields = [
        "variant",
        "label",
        "quantizer",
        "bits",
        "value_bits",
        "layer_bits",
        "group_size",
        "effective_bits",
        "corrected",
        "correction",
        "pruner",
        "kv_ratio",
        "compressed_share",
        "pruned_share",
    ]
    metrics = ["psnr", "ssim", "lpips", "delta_ps", "jsd", "out_mse", "seconds", "token_shift"]
    metrics += LP_METRICS
    writer = csv.writer(buf)
    writer.writerow(
        fields
        + [f"{m}_{s}" for m in metrics for s in ("mean", "se", "n")]
        + ["kv_cache_bytes", "videos", *HORIZON_CSV]
    )
    for r in rows:
        vals = [getattr(r, f) for f in fields]
        for m in metrics:
            stat = getattr(r, m)
            vals += [None, None, None] if stat is None else [stat.mean, stat.se, stat.n]
        v = by_vid.get(r.variant) or {}
        div, valid = v.get("divergence") or {}, v.get("still_valid") or [{}]
        extra = [div.get("median"), div.get("diverged"), div.get("n"), valid[-1].get("fraction")]
        writer.writerow([*vals, r.kv_cache_bytes, r.videos, *extra])
    return buf.getvalue()


def to_json(run: RunDir, rows: list[ResultRow]) -> dict[str, Any]:
    """The machine-readable result (also the regression gate's baseline format).

    ``videos``: the (prompt, seed) pairs of the reference videos, sorted. ``pareto``: per
    frontier metric, the variants on the storage–quality Pareto front (:mod:`jbkv_cli.report.frontier`).
    ``correction_gains``, ``method_comparisons``, ``reference_comparisons``: the paired
    comparisons with their statistics (:mod:`jbkv_cli.report.comparisons`). ``horizon``: time
    to divergence, the still-valid fraction and the gain up to divergence
    (:mod:`jbkv_cli.report.horizon`; None when the run stored none of what it reads).
    """
    scores = Scores(run)
    videos = sorted({(r["prompt"], r["seed"]) for r in run.records(run.reference)})
    return {
        "run": str(run.root),
        "model": run.manifest.get("model"),
        "settings": run.manifest.get("settings"),
        "reference_precision": reference_label(run),
        "videos": [list(v) for v in videos],
        "rows": [r.to_dict() for r in rows],
        "correction_gains": paired_differences(run, rows, scores),
        "method_comparisons": method_comparisons(rows, scores),
        "reference_comparisons": reference_comparisons(run, rows),
        "pareto": frontiers(rows),
        "horizon": horizon_section(run, rows),
    }
