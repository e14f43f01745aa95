"""The HTML report of a run: ``RUN/report/index.html``, to compare videos by watching them.

One self-contained page per run, rendered from the report's JSON (``report.to_json``) and the
run directory alone, with no external URL (no CDN, no web font):

- the variant table, sortable by any column (``report.js``, plain JavaScript);
- the figures beside it in ``RUN/report/`` (``frontier.png``, ``delta_ps_hist.png``,
  ``frames.png``, ``drift.png``) when they have been made, and the drift table (PSNR and SSIM
  per chunk, per variant, mean ± SE over videos; :mod:`jbkv_cli.report.drift`);
- per (prompt, seed) one row of videos: reference / INT4 / INT2 / INT2 + correction / every
  other variant, under one play/pause/scrub control that keeps them in step.

Videos are not copied: the page links the run's H.264 mp4s by relative path
(``../videos/<variant>/<prompt>-<i>.mp4``), so the run directory is the unit to share or serve;
``report/`` alone holds the page, its two assets and the PNGs.

Every piece of user text on the page (the prompt, the model, the run's name and settings, the
variants' labels, the LPIPS note) is escaped and set in its own ``<bdi>``: a bidi control in it
(a prompt holding U+202E RIGHT-TO-LEFT OVERRIDE) ends with its element and cannot reorder the
text around it (`` · seed 0``, the scores). The ``<title>`` cannot hold elements: there the
model's name is isolated with U+2068 … U+2069 (FIRST STRONG ISOLATE … POP DIRECTIONAL ISOLATE).
"""

from __future__ import annotations

import html
import os
import shutil
from importlib import resources
from pathlib import Path
from typing import Any
from urllib.parse import quote

from jbkv_cli import __version__
from jbkv_cli.metrics.paired import describe
from jbkv_cli.report.comparisons import LEGEND, TABLE_COLUMNS, comparison_table
from jbkv_cli.report.drift import drift_series
from jbkv_cli.report.horizon import delay_text, divergence_text, marks
from jbkv_cli.report.results import ResultRow, Stat
from jbkv_cli.report.table import format_stat, lpips_note, megabytes, table_cells
from jbkv_cli.report.vbench_time import clip_label, title, variant_cells
from jbkv_cli.run.directory import RunDir, video_name
from jbkv_cli.utils.atomic import atomic_path, write_text_atomic
from jbkv_cli.utils.errors import JbkvError

ASSETS = ("report.css", "report.js")
FIGURES = (
    ("frontier.png", "Storage–quality frontier: PSNR, SSIM, |ΔP_S| against effective bits"),
    ("drift.png", "Drift: PSNR and SSIM per chunk (mean ± SE over videos)"),
    ("delta_ps_hist.png", "Attention mass stolen by quantized cached keys (ΔP_S per query)"),
    ("frames.png", "Frames over time: reference / INT4 / INT2 / INT2 + correction"),
    (
        "attention_error.png",
        "ΔP_S and the bias share of the keys' attention error per layer × denoising step",
    ),
)
MIN_VIDEO_PX, MAX_VIDEO_PX = 128, 320


def write_html_report(run: RunDir, data: dict[str, Any], out_dir: Path | None = None) -> Path:
    """Write ``index.html``, ``report.css`` and ``report.js`` into ``out_dir`` (RUN/report)."""
    out_dir = Path(out_dir) if out_dir is not None else run.root / "report"
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise JbkvError(f"cannot create {out_dir}: {exc.strerror or exc}") from exc
    for name in ASSETS:
        _copy_asset(name, out_dir / name)
    page = out_dir / "index.html"
    write_text_atomic(page, render_page(run, data, out_dir))
    return page


def _copy_asset(name: str, target: Path) -> None:
    """Copy a packaged asset to ``target`` atomically; a failure names ``target`` (a full disk
    is the target's problem, not the package's source file that ``shutil`` would name)."""
    try:
        with atomic_path(target) as tmp, resources.as_file(_asset(name)) as src:
            shutil.copyfile(src, tmp)
    except OSError as exc:
        raise JbkvError(f"cannot write {target}: {exc.strerror or exc}") from exc


def render_page(run: RunDir, data: dict[str, Any], out_dir: Path) -> str:
    """The page as a string; ``out_dir`` is where it will lie (relative links start there)."""
    rows = [ResultRow.from_dict(r) for r in data["rows"]]
    model = data.get("model")
    settings = data.get("settings") or {}
    shown = ", ".join(f"{k}={v}" for k, v in settings.items() if not isinstance(v, dict | list))
    drift = drift_series(run, rows)
    note = lpips_note(rows)
    body = [
        f"<h1>jbkv report · {_bdi(model)}</h1>",
        f'<p class="meta">run <code>{_bdi(run.root.name)}</code> · reference '
        f"{_e(data.get('reference_precision'))} · {_bdi(shown)}</p>",
        "<h2>Variants</h2>",
        '<p class="meta">Mean ± standard error over videos, each paired with the reference of '
        "the same prompt and seed; best per column in bold green. Click a header to sort.</p>",
        _table(rows),
        f'<p class="note">LPIPS n/a: {_bdi(note)}</p>' if note else "",
        _gains(data.get("correction_gains") or []),
        _comparisons(data),
        _partition(rows),
        memory_section(rows),
        bias_share_section(rows),
        "<h2>Figures</h2>",
        _figures(out_dir),
        "<h2>Drift over time</h2>",
        _drift(drift),
        horizon_html(data.get("horizon")),
        "<h2>Videos</h2>",
        '<p class="meta">One control per prompt and seed plays, pauses and scrubs every video of '
        "the row in step (the first video is the clock). Scores: this video against its "
        "reference.</p>",
        _videos(run, rows, out_dir, drift["chunk_frames"]),
        f'<p class="meta">made by jbkv {_e(__version__)} from the run directory alone.</p>',
    ]
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        '<meta name="viewport" content="width=device-width, initial-scale=1">\n'
        f"<title>jbkv report · {_e(FSI + str(model) + PDI)}</title>\n"
        '<link rel="icon" href="data:,">\n<link rel="stylesheet" href="report.css">\n'
        "</head>\n<body>\n" + "\n".join(b for b in body if b) + "\n"
        '<script src="report.js"></script>\n</body>\n</html>\n'
    )


def video_order(rows: list[ResultRow]) -> list[ResultRow]:
    """Reference, INT4, INT2, INT2 + correction (the headline four), then every other variant."""

    def pick(bits: int, corrected: bool) -> ResultRow | None:
        for r in rows:
            full = r.keys and r.values and not r.bias_only
            if r.bits == bits and r.corrected == corrected and full:
                return r
        return None

    first = [r for r in (pick(16, False), pick(4, False), pick(2, False), pick(2, True)) if r]
    seen = {r.variant for r in first}
    return first + [r for r in rows if r.variant not in seen]


# --- sections -----------------------------------------------------------------------------------

_SORT_KEYS = {
    "scheme": lambda r: r.quantizer,
    "bits": lambda r: r.bits,
    "eff. bits": lambda r: r.effective_bits,
    "corrected": lambda r: r.correction,
    "PSNR ↑ dB": lambda r: r.mean("psnr"),
    "SSIM ↑": lambda r: r.mean("ssim"),
    "LPIPS ↓": lambda r: r.mean("lpips"),
    "ΔP_S": lambda r: r.mean("delta_ps"),
    "Δlog Z": lambda r: r.mean("lp_shift"),
    "pred/Δ": lambda r: r.mean("lp_ratio"),
    "top-1 shift ↓": lambda r: r.mean("token_shift"),
    "KV MB": lambda r: r.kv_cache_bytes,
    "KV/ref": lambda r: r.kv_ratio,
    "work MB": lambda r: r.kv_working_bytes,
    "peak MB": lambda r: r.cuda_peak_bytes,
    "bias share": lambda r: r.mean("bias_share"),
    "removed": lambda r: r.mean("correction_removed"),
    "s/video": lambda r: r.mean("seconds"),
}


def _table(rows: list[ResultRow]) -> str:
    cols, cells, best = table_cells(rows)
    text_cols = {"variant", "scheme", "corrected"}
    head = "".join(
        f'<th class="text" scope="col">{_e(c)}</th>'
        if c in text_cols
        else f'<th scope="col">{_e(c)}</th>'
        for c in cols
    )
    lines = []
    for i, (r, row_cells) in enumerate(zip(rows, cells, strict=True)):
        tds = []
        for c, text in zip(cols, row_cells, strict=True):
            key = i if c == "variant" else _sort_key(r, c)
            classes = [
                k for k, on in (("text", c in text_cols), ("best", best.get(c) == r.variant)) if on
            ]
            cls = f' class="{" ".join(classes)}"' if classes else ""
            cell = _bdi(text) if c in text_cols else _e(text)  # text cells are user text
            tds.append(f'<td{cls} data-sort="{_e("" if key is None else key)}">{cell}</td>')
        kind = "reference" if r.is_reference else ("noop" if r.no_op else "")
        ref = f' class="{kind}"' if kind else ""  # noop: compressed nothing (kvcache/coverage.py)
        lines.append(f'<tr{ref} data-variant="{_e(r.variant)}">{"".join(tds)}</tr>')
    return (
        '<table class="sortable" id="variants">\n'
        f"<thead><tr>{head}</tr></thead>\n<tbody>\n" + "\n".join(lines) + "\n</tbody>\n</table>"
    )


def _sort_key(row: ResultRow, column: str) -> Any:
    if column in _SORT_KEYS:
        return _SORT_KEYS[column](row)
    if column.startswith("VB "):
        vb = row.vbench or {}
        if column == "VB quality":
            return vb.get("quality")
        dim = (vb.get("dimensions") or {}).get(column[3:]) or {}
        return dim.get("mean")
    return None


def _gains(gains: list[ResultRow]) -> str:
    items = []
    for g in gains:
        d = g.get("psnr_gain")
        if not d:
            continue
        se = f" ± {d['se']:.2f}" if d.get("se") is not None else ""
        frac = g.get("recovered_fraction")
        rec = f" ({frac:+.0%} of the gap to {_bdi(g['gap_to'])})" if frac is not None else ""
        stats = describe(d, with_mean=False)
        stats = f", {stats}" if stats else ""
        head = f"{_bdi(g['correction'])} on {_bdi(g['label'])}: PSNR "
        text = f"{d['mean']:+.2f}{_e(se)} dB paired{_e(stats)}{rec}"
        if g.get("pruned16"):  # both gains, each naming its reference
            d16 = g.get("psnr_gain_vs_pruned16")
            vs16 = "no video has both scores"
            if d16:
                se16 = f" ± {d16['se']:.2f}" if d16.get("se") is not None else ""
                stats16 = describe(d16, with_mean=False)
                vs16 = f"{d16['mean']:+.2f}{se16} dB paired" + (f", {stats16}" if stats16 else "")
            base = _bdi(g.get("pruned16_label") or g["pruned16"])
            text = f"vs the full reference {text}; vs the pruned 16-bit cache ({base}) {_e(vs16)}"
        items.append(f"<li>{head}{text}</li>")
    return f"<ul>{''.join(items)}</ul>" if items else ""


def _comparisons(data: dict[str, Any]) -> str:
    """Every paired comparison (correction gains, methods at matched bits, variants against the
    reference) with its statistics (:func:`jbkv_cli.report.comparisons.comparison_table`)."""
    cells = comparison_table(data)
    if not cells:
        return ""
    text = ' class="text"'
    head = "".join(
        f'<th{text if i < 3 else ""} scope="col">{_e(c)}</th>' for i, c in enumerate(TABLE_COLUMNS)
    )
    body = []
    for row in cells:
        sig = ' class="significant"' if row[7].endswith("*") else ""
        tds = [f'<td class="text">{_bdi(t)}</td>' for t in row[:2]]
        tds.append(f'<td class="text">{_e(row[2])}</td>')
        tds += [f"<td>{_e(t)}</td>" for t in row[3:]]
        body.append(f"<tr{sig}>{''.join(tds)}</tr>")
    return (
        "<h2>Paired comparisons</h2>\n"
        f'<p class="meta">{_e(LEGEND)}.</p>\n'
        '<table id="comparisons">\n'
        f"<thead><tr>{head}</tr></thead>\n<tbody>\n" + "\n".join(body) + "\n</tbody>\n</table>"
    )


def _partition(rows: list[ResultRow]) -> str:
    """The measured bias per variant: the cached log-partition shift of the stored keys, the
    part the correction predicts, what it leaves, and their ratio (attention/partition.py)."""
    shown = [r for r in rows if r.lp_shift is not None]
    if not shown:
        return ""
    cols = ("Δlog Z measured", "predicted", "left", "predicted / measured")
    head = "".join(f'<th scope="col">{_e(c)}</th>' for c in cols)
    body = []
    for r in shown:
        cells = [
            format_stat(getattr(r, m), 4, True) for m in ("lp_shift", "lp_predicted", "lp_left")
        ]
        cells.append(format_stat(r.lp_ratio, 2, True))
        tds = "".join(f"<td>{_e(c)}</td>" for c in cells)
        body.append(f'<tr><td class="text">{_bdi(r.label)}</td>{tds}</tr>')
    return (
        "<h2>The measured bias</h2>"
        '<p class="meta">Per observed attention call (a block of queries of one layer): '
        "log Σ<sub>cached</sub> exp(τ q·k̂) − log Σ<sub>cached</sub> exp(τ q·k), k the exact "
        "keys; the part the variant's correction predicts (it removes), what is left, and "
        "predicted / measured (1: exact, above 1: over-corrected, below 0: the wrong sign). "
        "Mean ± SE over videos.</p>"
        f'<table class="sortable" id="partition"><thead><tr><th class="text">variant</th>{head}'
        f"</tr></thead>\n<tbody>{''.join(body)}</tbody></table>"
    )


def _ratio(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


def memory_section(rows: list[ResultRow]) -> str:
    """Stored, working and (CUDA) peak bytes per variant (attention/memory.py)."""
    shown = [r for r in rows if r.kv_working_bytes is not None]
    if not shown:
        return ""
    cuda = any(r.cuda_peak_bytes is not None for r in shown)
    cols = ["stored MB", "stored/ref", "working MB / read", "working/ref"]
    cols += ["CUDA peak MB", "resident before MB"] if cuda else []
    head = "".join(f'<th scope="col">{_e(c)}</th>' for c in cols)
    body = []
    for r in shown:
        cells = [megabytes(r.kv_cache_bytes), _ratio(r.kv_ratio), megabytes(r.kv_working_bytes)]
        cells.append(_ratio(r.working_ratio))
        if cuda:
            cells += [megabytes(r.cuda_peak_bytes), megabytes(r.cuda_resident_bytes)]
        tds = "".join(f"<td>{_e(c)}</td>" for c in cells)
        body.append(f'<tr><td class="text">{_bdi(r.label)}</td>{tds}</tr>')
    peak = (
        " CUDA peak: <code>torch.cuda.max_memory_allocated</code> reset per video (weights, "
        "activations, cache); resident before: allocated when the video began, mostly the "
        "weights."
        if cuda
        else " No CUDA peak: the run was not on a GPU."
    )
    return (
        "<h2>Memory</h2>"
        '<p class="meta">Stored: the bytes of the tensors the cache holds at its peak, every '
        "layer (codes, steps, exact tokens). Working: what the largest read of one layer's "
        "cache holds at once: the dequantized window and what attention builds from it "
        "(augmented channels, masks, bias blocks), accounted from the shapes per backend; the "
        f"diagnostics' full-precision copies are kept apart in each video's record.{peak} "
        "Means over videos.</p>"
        f'<table class="sortable" id="memory"><thead><tr><th class="text">variant</th>{head}'
        f"</tr></thead>\n<tbody>{''.join(body)}</tbody></table>"
    )


def bias_share_section(rows: list[ResultRow]) -> str:
    """The bias share of the keys' attention error and what each correction removes, per
    variant and layer (bias_share.py)."""
    shown = [r for r in rows if r.bias_share is not None]
    if not shown:
        return ""
    layers = sorted({k for r in shown for k in (r.bias_share_by_layer or {})}, key=int)
    head = "".join(f'<th scope="col">layer {_e(k)}</th>' for k in layers)
    body = []
    for r in shown:
        by_layer = r.bias_share_by_layer or {}
        cells = [
            format_stat(r.bias_share, 3),
            format_stat(r.correction_removed, 3, True),
            format_stat(r.bias_explained, 3, True),
        ]
        for k in layers:
            stat = Stat.from_dict((by_layer.get(k) or {}).get("share"), f"layer {k}")
            cells.append(format_stat(stat, 3))
        tds = "".join(f"<td>{_e(c)}</td>" for c in cells)
        body.append(f'<tr><td class="text">{_bdi(r.label)}</td>{tds}</tr>')
    return (
        "<h2>Where the attention error comes from</h2>"
        '<p class="meta">Bias share: Σ‖softmax(s + β)V − o‖² / Σ‖softmax(ŝ)V − o‖², the '
        "attention-output error that the predicted bias β alone reproduces (added to the exact "
        "keys' scores) against that of the stored keys (exact values in both; o the "
        "full-precision output; β: what the variant's correction removes, or for an "
        "uncorrected variant what the method's own noise model predicts). It is a ratio of "
        "error sizes, not a bound on what a correction recovers. Removed: 1 − "
        "Σ‖softmax(ŝ + a)V − o‖² / Σ‖softmax(ŝ)V − o‖², what the variant's correction a "
        "actually removes of that error on the same calls (— without a correction; below 0 it "
        "adds error). Explained: 1 − Σ‖softmax(ŝ)V − softmax(s + β)V‖² / Σ‖softmax(ŝ)V − o‖², "
        "its first-order estimate. Mean ± SE over videos, overall and per layer (per head in "
        "the JSON).</p>"
        f'<table class="sortable" id="bias-share"><thead><tr><th class="text">variant</th>'
        f'<th scope="col">all layers</th><th scope="col">removed</th>'
        f'<th scope="col">explained</th>{head}</tr></thead>\n<tbody>{"".join(body)}</tbody>'
        "</table>"
    )


def _figures(out_dir: Path) -> str:
    figs = [
        f'<figure><img src="{quote(name)}" alt="{_e(caption)}">'
        f"<figcaption>{_e(caption)}</figcaption></figure>"
        for name, caption in FIGURES
        if (out_dir / name).is_file()
    ]
    if not figs:
        return '<p class="meta">No figures yet (run <code>jbkv report RUN --plots</code>).</p>'
    return '<div class="figures">' + "".join(figs) + "</div>"


def _drift(drift: dict[str, Any]) -> str:
    if not drift["variants"]:
        return '<p class="meta">No per-chunk scores yet.</p>'
    unit = drift["unit"]
    per = f"chunk of {drift['chunk_frames']} frames" if unit == "chunk" else "frame"
    chunks = sorted({p["chunk"] for v in drift["variants"] for p in v["psnr"]})
    parts = [
        f'<p class="meta">PSNR (dB) and SSIM per {_e(per)} against the reference, mean ± SE '
        "over videos: a full-clip mean hides when quality falls. 100 dB = identical frames "
        "(the cap).</p>"
    ]
    for metric, digits in (("psnr", 2), ("ssim", 4)):
        head = "".join(f"<th>{unit} {c}</th>" for c in chunks)
        body = []
        for v in drift["variants"]:
            by_chunk = {p["chunk"]: p for p in v[metric]}
            tds = "".join(_drift_cell(by_chunk.get(c), digits) for c in chunks)
            body.append(f'<tr><td class="text">{_bdi(v["label"])}</td>{tds}</tr>')
        parts.append(
            f"<details{' open' if metric == 'psnr' else ''}><summary>{metric.upper()} per "
            f'{_e(unit)}</summary>\n<table class="sortable drift" data-metric="{metric}">'
            f'<thead><tr><th class="text">variant</th>{head}</tr></thead>\n<tbody>'
            + "\n".join(body)
            + "</tbody></table></details>"
        )
    return "\n".join(parts)


def horizon_html(section: dict[str, Any] | None) -> str:
    """The long-horizon section (:mod:`jbkv_cli.report.horizon`): per variant the time to
    divergence and the still-valid fraction, per correction the delay test and the paired gain
    per chunk with its 95% CI; "" when the run stored none of it."""
    if not section:
        return ""
    floor = section["floor"]
    meta = (
        f"Floor {floor['db']:.2f} dB: PSNR between the reference videos of two seeds of one "
        f"prompt (mean over {len(floor['by_prompt'])} prompts; each prompt's own is used). A "
        "video diverges at the first chunk whose PSNR against its reference falls below halfway "
        "from the first chunk's PSNR (of the uncorrected variant of the same format) to its "
        "prompt's floor; a video that never does is censored. Median with its 95% "
        "order-statistic interval (≥ H: censored)."
        if floor["db"] is not None
        else f"{floor['note']}."
    )
    marks_ = sorted({c for v in section["variants"] for c in marks(len(v["still_valid"] or []))})
    head = "".join(f'<th scope="col">still valid, chunk {c}</th>' for c in marks_)
    body = []
    for v in section["variants"]:
        at = {p["chunk"]: p for p in v["still_valid"] or []}
        cells = [divergence_text(v["divergence"])]
        cells += [
            f"{at[c]['fraction']:.0%} ({at[c]['valid']}/{at[c]['n']})" if c in at else "—"
            for c in marks_
        ]
        tds = "".join(f"<td>{_e(c)}</td>" for c in cells)
        body.append(f'<tr><td class="text">{_bdi(v["label"])}</td>{tds}</tr>')
    parts = ["<h2>Long horizon</h2>"]
    if any(v["divergence"] or v["still_valid"] for v in section["variants"]):
        parts += [
            f'<p class="meta">{_e(meta)} Still valid at chunk c: the share of videos whose '
            "model's own prompt check passed at every chunk up to c (it needs no reference).</p>",
            '<table class="sortable" id="horizon"><thead><tr><th class="text">variant</th>'
            f'<th scope="col">time to divergence</th>{head}</tr></thead>\n<tbody>'
            + "".join(body)
            + "</tbody></table>",
        ]
    for d in section["delays"]:
        gains = d["gain_per_chunk"]
        chunks = "".join(f"<th>chunk {g['chunk']}</th>" for g in gains)
        cells = "".join(_gain_cell(g) for g in gains)
        parts.append(
            f"<p>{_bdi(d['label'])} vs {_bdi(d['baseline_label'])}: {_e(delay_text(d, False))}</p>"
            f"<details><summary>paired PSNR gain per chunk (dB, 95% CI, videos whose baseline "
            f'has not diverged)</summary><table class="drift"><thead><tr>{chunks}</tr>'
            f"</thead><tbody><tr>{cells}</tr></tbody></table></details>"
        )
    parts += [_over_time_html(e) for e in section.get("vbench") or []]
    return "\n".join(parts)


def _over_time_html(entry: dict[str, Any]) -> str:
    """One VBench dimension per clip over time (:mod:`jbkv_cli.report.vbench_time`): a row per
    variant, a column per clip; Δ: paired against the reference's clip, 95% CI."""
    head = "".join(f'<th scope="col">{_e(clip_label(c))}</th>' for c in entry["clips"])
    body = []
    for v in entry["variants"]:
        tds = "".join(f"<td>{_e(cell)}</td>" for cell in variant_cells(v))
        body.append(f'<tr><td class="text">{_bdi(v["label"])}</td>{tds}</tr>')
    return (
        f"<details open><summary>{_e(title(entry))}: mean over "
        "videos; Δ: paired against the reference's same clip, 95% CI</summary>"
        f'<table class="drift"><thead><tr><th class="text">variant</th>{head}</tr></thead>'
        f"<tbody>{''.join(body)}</tbody></table></details>"
    )


def _gain_cell(g: dict[str, Any]) -> str:
    if not g.get("n"):
        return "<td>—</td>"
    ci = g.get("ci95")
    ci_text = f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else ""
    return f"<td>{g['mean']:+.2f}{_e(ci_text)} n {g['n']}</td>"


def _drift_cell(point: dict[str, Any] | None, digits: int) -> str:
    if not point or point["mean"] is None:
        return '<td data-sort="">—</td>'
    se = f" ± {point['se']:.{digits}f}" if point.get("se") is not None else ""
    return f'<td data-sort="{point["mean"]}">{point["mean"]:.{digits}f}{se}</td>'


def _videos(run: RunDir, rows: list[ResultRow], out_dir: Path, chunk_frames: int) -> str:
    order = video_order(rows)
    refs = sorted(run.records(run.reference), key=lambda r: (r["prompt"], r["index"]))
    scores = {r.variant: run.read_metrics("fidelity", r.variant) for r in order}
    groups = []
    for ref in refs:
        name = video_name(ref["prompt"], ref["index"])
        frames, _, width = (ref.get("frames") or [0, 0, 0])[:3]
        fps = float(ref.get("fps") or 0) or 25.0
        shown_w = _display_width(width)
        figures = []
        for r in order:
            mp4 = run.paths(r.variant, name)["mp4"]
            if not run.is_done(r.variant, name):
                continue
            src = _relative_url(mp4, out_dir)
            s = scores[r.variant].get(name) or {}
            score = (
                "reference"
                if r.is_reference
                else f"PSNR {s['psnr']:.2f} dB · SSIM {s['ssim']:.4f}"
                if "psnr" in s
                else "not scored"
            )
            figures.append(
                f'<figure data-variant="{_e(r.variant)}"><video src="{src}" muted loop '
                f'playsinline preload="auto" width="{shown_w}"></video>'
                f'<figcaption>{_bdi(r.label)}<br><span class="score">{_e(score)}</span>'
                "</figcaption></figure>"
            )
        if not figures:
            continue
        duration = frames / fps if frames else 0
        groups.append(
            f'<section class="sync-group" data-fps="{fps:g}" data-frames="{frames}" '
            f'data-chunk-frames="{chunk_frames}">'
            f"<h3>{_bdi(ref['prompt'])} · seed {_e(ref['seed'])}</h3>"
            '<div class="controls"><button class="play" type="button">▶ play</button>'
            f'<input class="scrub" type="range" min="0" max="{duration:g}" step="{1 / fps:g}" '
            f'value="0" aria-label="scrub"><span class="time"></span></div>'
            f'<div class="videos">{"".join(figures)}</div></section>'
        )
    return "\n".join(groups) or '<p class="meta">No finished videos yet.</p>'


# --- helpers ------------------------------------------------------------------------------------


def _display_width(width: int) -> int:
    """Small videos scaled up by a whole factor (pixelated, to at least 128 px), large ones to 320."""
    if width <= 0:
        return MAX_VIDEO_PX
    return min(width * max(1, MIN_VIDEO_PX // width), MAX_VIDEO_PX)


def _asset(name: str):
    return resources.files("jbkv_cli").joinpath("report", "assets", name)


def _relative_url(path: Path, start: Path) -> str:
    """``path`` relative to ``start`` as a URL (each segment percent-encoded)."""
    rel = Path(os.path.relpath(path.resolve(), start.resolve()))
    return "/".join(quote(part) for part in rel.parts)


def _e(value: Any) -> str:
    return html.escape(str(value), quote=True)


FSI, PDI = "\u2068", "\u2069"  # FIRST STRONG ISOLATE, POP DIRECTIONAL ISOLATE


def _bdi(value: Any) -> str:
    """User text, escaped and isolated: a bidi control in it cannot reorder what follows."""
    return f"<bdi>{_e(value)}</bdi>"


__all__ = ["render_page", "video_order", "write_html_report"]
