"""The report's long-horizon section: when each variant's videos stop following their reference,
whether they still follow their prompt, and what a correction gains before that.

Read from the run directory alone (what scoring stored, :class:`~jbkv_cli.run.experiment.Scoring`):
the per-chunk PSNR of each video against its reference (``metrics/fidelity``), the reference's
*floor* (``metrics/floor``: a reference video of seed index ``i ≥ 1`` scored against the same
prompt's reference at index 0, so the PSNR two samples of one prompt have), and the model's
per-chunk prompt check (``metrics/prompt``, every variant and the reference). The statistics are
:mod:`jbkv_cli.metrics.horizon`'s.

- **Floor** of a prompt: the mean over its chunks and seed pairs of the reference-vs-reference
  PSNR; a prompt's own, because it depends on its content (a shape on a dark background is
  farther from the same shape elsewhere than on a gray one). With one seed per prompt there is
  no floor: time to divergence and the gain up to it are unavailable (said so), the still-valid
  fraction is not.
- **Threshold** of a video: halfway between the first chunk's PSNR and its prompt's floor
  (:func:`~jbkv_cli.metrics.horizon.midpoint_threshold`). The first chunk is the first one that
  differs from the reference (mean below the 100 dB cap: a model's first chunk reads no cache),
  its PSNR the mean over the videos of the variant's *baseline*, the same stored format
  uncorrected, so a correction and its baseline are held to one threshold per video and the
  paired delay test compares like with like.
- **Divergence** per video, per variant the median with its 95% interval and the survival;
  per correction the sign test of the delay and the paired PSNR gain per chunk over the videos
  whose baseline has not diverged by then (:mod:`jbkv_cli.metrics.horizon`).
- **Still valid** at chunk ``c``: the share of a variant's videos whose prompt check passed at
  every chunk up to ``c`` (:attr:`~jbkv_cli.models.contract.VideoModel.follows_prompt`).
- **VBench over time** (a model with no prompt check of its own): VBench-Long's consistency per
  clip, per variant and against the reference's same clip, when ``jbkv vbench run`` scored the
  run (:mod:`jbkv_cli.report.vbench_time`).

Chunk numbers are the model's (0 = the first chunk).
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from jbkv_cli.metrics.horizon import Divergence, delay, divergence_chunk, gain_per_chunk
from jbkv_cli.metrics.paired import format_p
from jbkv_cli.metrics.psnr import PSNR_CAP_DB
from jbkv_cli.metrics.stats import aggregate
from jbkv_cli.report.drift import chunked_entry
from jbkv_cli.report.results import ResultRow
from jbkv_cli.report.vbench_time import over_time_lines, read_vbench, vbench_over_time
from jbkv_cli.run.directory import RunDir, video_name

Series = dict[str, list[float]]  # video name -> PSNR per chunk (chunk 0 first)
NO_FLOOR = "no floor: it needs two seeds of a prompt (the run has one), so no divergence"


def horizon_section(run: RunDir, rows: list[ResultRow]) -> dict[str, Any] | None:
    """The section's data (module docstring); None when the run stored nothing it reads."""
    reference = run.reference
    prompts = {video_name(r["prompt"], r["index"]): r["prompt"] for r in run.records(reference)}
    floors, floor_chunks = _floors(run, prompts)
    series = {r.variant: _series(run, r.variant) for r in rows if not r.is_reference}
    valid = {r.variant: still_valid(run.read_metrics("prompt", r.variant)) for r in rows}
    over_time = vbench_over_time(run, rows, read_vbench(run))
    if not any(valid.values()) and not floors and not over_time:
        return None
    by_variant = {r.variant: r for r in rows}
    firsts: dict[str, float] = {}  # variant -> the first chunk's PSNR its thresholds use
    variants = []
    for r in rows:
        entry: dict[str, Any] = {"variant": r.variant, "label": r.label, "baseline": None}
        entry["still_valid"] = valid[r.variant] or None
        entry["divergence"] = None
        base = baseline_of(r, rows) or r
        first = first_chunk_psnr(series.get(base.variant) or {}) if floors else None
        div = None if first is None else _divergence(series[r.variant], first, floors, prompts)
        if div is not None:
            firsts[r.variant] = first
            entry.update(baseline=base.variant, first_chunk_db=first)
            entry["divergence"] = div.summary()
        variants.append(entry)
    delays = []
    for r in rows:
        base = baseline_of(r, rows)
        if base is None or r.variant not in firsts or base.variant not in firsts:
            continue
        first = firsts[r.variant]
        common = sorted(set(series[base.variant]) & set(series[r.variant]))
        a_series = {n: series[base.variant][n] for n in common}
        b_series = {n: series[r.variant][n] for n in common}
        a_div = _divergence(a_series, first, floors, prompts)
        b_div = _divergence(b_series, first, floors, prompts)
        if a_div is None or b_div is None or a_div.horizon != b_div.horizon:
            continue
        a, b = [a_series[n] for n in common], [b_series[n] for n in common]
        delays.append(
            {
                "variant": r.variant,
                "label": r.label,
                "baseline": base.variant,
                "baseline_label": by_variant[base.variant].label,
                **delay(a_div, b_div),
                "gain_per_chunk": [
                    {"chunk": c, **g} for c, g in enumerate(gain_per_chunk(a, b, a_div))
                ],
            }
        )
    values = list(floors.values())
    return {
        "floor": {
            "db": math.fsum(values) / len(values) if values else None,
            "by_prompt": floors,
            "per_chunk": floor_chunks,
            "note": None if floors else NO_FLOOR,
        },
        "variants": variants,
        "delays": delays,
        "vbench": over_time,
    }


def baseline_of(row: ResultRow, rows: list[ResultRow]) -> ResultRow | None:
    """The same stored format (storage, widths, pruner, what is stored) uncorrected; None for
    the reference or when the run has none (or ``row`` is it)."""
    if row.is_reference or not row.corrected:
        return None

    def key(r: ResultRow) -> tuple:
        return (r.storage, r.bits, r.value_bits, r.pruner, r.keys, r.values, r.bias_only)

    return next(
        (r for r in rows if not r.is_reference and not r.corrected and key(r) == key(row)), None
    )


def first_chunk_psnr(series: Series) -> float | None:
    """The mean PSNR of the first chunk whose mean is below the cap (the first one that read
    a compressed cache), over the videos of ``series``; None when there is none."""
    if not series:
        return None
    horizon = min(len(s) for s in series.values())
    for c in range(horizon):
        values = [s[c] for s in series.values()]
        mean = math.fsum(values) / len(values)
        if mean < PSNR_CAP_DB - 1e-9:
            return mean
    return None


def still_valid(entries: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per chunk ``c``: the share of videos whose ``valid_per_chunk`` is true at every chunk up
    to ``c`` (over the videos with that many chunks)."""
    lists = [e["valid_per_chunk"] for _, e in sorted(entries.items())]
    horizon = max((len(v) for v in lists), default=0)
    out = []
    for c in range(horizon):
        have = [v for v in lists if len(v) > c]
        ok = sum(all(v[: c + 1]) for v in have)
        out.append({"chunk": c, "fraction": ok / len(have), "valid": ok, "n": len(have)})
    return out


def _series(run: RunDir, vid: str) -> Series:
    """Video name -> PSNR per chunk, from the first chunk scored (chunk 0: scoring skips no
    frame)."""
    settings = run.manifest.get("settings", {})
    records = {video_name(r["prompt"], r["index"]): r for r in run.records(vid)}
    out = {}
    for name, entry in run.read_metrics("fidelity", vid).items():
        if name not in records:
            continue
        chunked = chunked_entry(entry, records[name], settings)
        if chunked is not None and chunked[2]["psnr"]:
            out[name] = list(chunked[2]["psnr"])
    return out


def _floors(run: RunDir, prompts: dict[str, str]) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Per prompt its floor, and per chunk the floor's mean ± SE over the seed pairs."""
    by_prompt: dict[str, list[float]] = defaultdict(list)
    by_chunk: dict[int, list[float]] = defaultdict(list)
    for name, entry in run.read_metrics("floor", run.reference).items():
        prompt = prompts.get(name)
        values = entry.get("psnr_per_chunk") or []
        if prompt is None or not values:
            continue
        by_prompt[prompt] += values
        first = int(entry.get("first_chunk", 0))
        for k, value in enumerate(values):
            by_chunk[first + k].append(value)
    floors = {p: math.fsum(v) / len(v) for p, v in sorted(by_prompt.items())}
    per_chunk = [{"chunk": c, **aggregate(v)} for c, v in sorted(by_chunk.items())]
    return floors, per_chunk


def _threshold(first: float, floors: dict[str, float], prompts: dict[str, str], name: str) -> float:
    """Halfway between ``first`` and the floor of ``name``'s prompt (the mean floor when that
    prompt has none)."""
    floor = floors.get(prompts.get(name, ""))
    if floor is None:
        floor = math.fsum(floors.values()) / len(floors)
    return (first + floor) / 2


def _divergence(
    series: Series, first: float, floors: dict[str, float], prompts: dict[str, str]
) -> Divergence | None:
    """The divergence of the videos of ``series`` (in name order), each at its own threshold;
    None when there are none or they do not all have the same number of chunks."""
    names = sorted(series)
    lengths = {len(series[n]) for n in names}
    if len(lengths) != 1:
        return None
    times = tuple(divergence_chunk(series[n], _threshold(first, floors, prompts, n)) for n in names)
    return Divergence(times, lengths.pop())


# --- rendering ----------------------------------------------------------------------------------

MARKS = (8, 16, 32, 64)  # after this many chunks the lines show the still-valid fraction
GAIN_MARKS = (2, 4, 8, 16, 32, 64)  # ... and the gain (chunk 0 reads no cache on most models)


def marks(horizon: int, after: tuple[int, ...] = MARKS) -> list[int]:
    """The chunks (0-based) after which ``after`` chunks are done, those of a run of
    ``horizon`` chunks, and its last chunk."""
    return sorted({*(m - 1 for m in after if m <= horizon), horizon - 1} - {-1})


def divergence_text(div: dict[str, Any] | None) -> str:
    """``median chunk 5 [3, 9] · 14/20 diverged within 32 chunks``; ``—`` when none."""
    if not div:
        return "—"
    median = div["median"]
    ci = div.get("median_ci95")
    head = f"median ≥ {div['horizon']}" if median is None else f"median chunk {median}"
    if ci:
        lo, hi = ("≥ H" if x is None else str(x) for x in ci)
        head += f" [{lo}, {hi}]"
    return f"{head} · {div['diverged']}/{div['n']} diverged within {div['horizon']} chunks"


def valid_text(valid: list[dict[str, Any]] | None) -> str:
    """``still valid: chunk 7 90% · chunk 15 85%``; ``—`` without a prompt check."""
    if not valid:
        return "—"
    at = {p["chunk"]: p for p in valid}
    return " · ".join(
        f"chunk {c} {at[c]['fraction']:.0%} ({at[c]['valid']}/{at[c]['n']})"
        for c in marks(len(valid))
    )


def delay_text(d: dict[str, Any], labels: bool = True) -> str:
    """``INT2 … +taylor vs INT2 …: diverges later in 6, earlier in 1, tied 3 of 10 videos ·
    median +2 chunks [+0, +4] · sign test p 0.125`` (``labels=False``: from ``diverges``); the
    interval is the median difference's 95% one (none below 6 videos)."""
    median, ci = d.get("median_difference"), d.get("median_difference_ci95")
    shown = "—" if median is None else f"{median:+g}"
    shown += "" if median is None or ci is None else f" [{ci[0]:+g}, {ci[1]:+g}]"
    text = (
        f"diverges later in {d['later']}, earlier in {d['earlier']}, tied {d['ties']} of "
        f"{d['n']} videos · median {shown} chunks · sign test p {format_p(d['p_sign'])}"
    )
    return f"{d['label']} vs {d['baseline_label']}: {text}" if labels else text


def gain_text(d: dict[str, Any]) -> str:
    """The paired gain at the marked chunks, ``chunk 7 +0.52 dB [+0.10, +0.94] n 18``."""
    gains = d.get("gain_per_chunk") or []
    parts = []
    for c in marks(len(gains), GAIN_MARKS):
        g = gains[c]
        if not g.get("n"):
            parts.append(f"chunk {c} — (every baseline video diverged)")
            continue
        ci = g.get("ci95")
        ci_text = f" [{ci[0]:+.2f}, {ci[1]:+.2f}]" if ci else ""
        parts.append(f"chunk {c} {g['mean']:+.2f} dB{ci_text} n {g['n']}")
    return " · ".join(parts)


def horizon_lines(section: dict[str, Any] | None) -> list[str]:
    """What the terminal and Markdown print of the section."""
    if not section:
        return []
    floor = section["floor"]
    head = (
        f"floor {floor['db']:.2f} dB (reference vs reference, two seeds of a prompt; mean over "
        f"{len(floor['by_prompt'])} prompts); threshold: halfway to it from the first chunk"
        if floor["db"] is not None
        else floor["note"]
    )
    lines = [f"horizon: {head}"]
    for v in section["variants"]:
        if v["divergence"] is None and v["still_valid"] is None:
            continue
        parts = [divergence_text(v["divergence"])] if v["divergence"] else []
        parts += [f"still valid {valid_text(v['still_valid'])}"] if v["still_valid"] else []
        lines.append(f"{v['label']}: " + "; ".join(parts))
    for d in section["delays"]:
        lines.append(delay_text(d))
        lines.append(f"{d['label']} gain up to the baseline's divergence: {gain_text(d)}")
    return lines + over_time_lines(section.get("vbench") or [])


def horizon_markdown(section: dict[str, Any] | None) -> str:
    """The section in Markdown, or "" when there is none."""
    lines = horizon_lines(section)
    if not lines:
        return ""
    return "\n## Horizon\n\n" + "\n".join(f"- {line}" for line in lines) + "\n"
