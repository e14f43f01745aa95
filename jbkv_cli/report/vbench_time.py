"""VBench-Long's consistency per clip over time: the long-horizon check of a model with no
prompt check of its own (every real model), read from ``metrics/vbench.json``.

VBench-Long splits every video into clips of a fixed length and scores each clip
(:mod:`jbkv_cli.metrics.vbench_clips`); ``jbkv vbench run`` keeps each video's clip values in
time order (``per_clip``, :func:`~jbkv_cli.metrics.vbench_scores.regroup_clips`). For the
dimensions of :data:`OVER_TIME`, per variant and clip ``k``:

- the mean over videos with its SE (:func:`~jbkv_cli.metrics.stats.aggregate`);
- for a compressed variant, the paired difference to the reference's same clip of the same
  video (prompt and seed), ``v_k − ref_k``, with its 95% t interval
  (:func:`~jbkv_cli.metrics.paired.paired_summary`). It needs no pixel agreement with the
  reference, so unlike PSNR it keeps its meaning after the video has diverged: a variant whose
  subject stops being consistent falls below the reference from some clip on.

Clip ``k`` holds frames ``[k F, (k+1) F)`` with ``F = int(fps) · seconds`` (VBench's rule; the
last clip is padded by VBench with earlier frames): the model's chunks it covers come from the
reference's records (:func:`~jbkv_cli.metrics.chunks.chunk_of`) when the clip length is one for
the dimension and the chunk length is known, else only the clip index is given.
"""

from __future__ import annotations

from typing import Any

from jbkv_cli.metrics.chunks import chunk_frames_of, chunk_of, first_chunk_frames_of
from jbkv_cli.metrics.paired import paired_summary
from jbkv_cli.metrics.stats import aggregate
from jbkv_cli.report.results import ResultRow
from jbkv_cli.run.directory import RunDir
from jbkv_cli.run.schema import vbench_problem
from jbkv_cli.utils.errors import JbkvError
from jbkv_cli.utils.jsonio import read_json

OVER_TIME: tuple[str, ...] = ("subject_consistency", "background_consistency")
"""VBench-Long's consistency dimensions, the ones read per clip over time."""

Clips = dict[str, list[float | None]]  # video -> value per clip (None: clip not scored)


def read_vbench(run: RunDir) -> dict[str, Any] | None:
    """``RUN/metrics/vbench.json``, checked (:func:`~jbkv_cli.run.schema.vbench_problem`); None
    when there is none."""
    path = run.root / "metrics" / "vbench.json"
    if not path.is_file():
        return None
    doc = read_json(path)
    problem = vbench_problem(doc)
    if problem:
        raise JbkvError(
            f"{path} is not a jbkv VBench result: {problem} (damaged or edited? "
            f"`jbkv vbench run {run.root}` writes it again)"
        )
    return doc


def vbench_over_time(
    run: RunDir, rows: list[ResultRow], doc: dict[str, Any] | None
) -> list[dict[str, Any]]:
    """Per dimension of :data:`OVER_TIME` that ``doc`` (``vbench.json``) scored over two clips
    or more: its clip length, its clips (index, the chunks covered) and per variant the clip
    statistics (module docstring); [] when there is none."""
    if not doc:
        return []
    variants = doc.get("variants") or {}
    lengths = (doc.get("clip_seconds") or {}).get("dimensions") or {}
    reference = run.reference
    out = []
    for dim in OVER_TIME:
        clips: dict[str, Clips] = {}
        for r in rows:
            values = ((variants.get(r.variant) or {}).get("dimensions") or {}).get(dim) or {}
            if values.get("per_clip"):
                clips[r.variant] = values["per_clip"]
        count = max((len(v) for c in clips.values() for v in c.values()), default=0)
        if count < 2:
            continue
        seconds = lengths.get(dim) or []
        one = seconds[0] if len(seconds) == 1 else None  # prompts cut at two lengths: no spans
        span = _spans(run, count, one) if one else None
        ref = clips.get(reference)
        entries = []
        for r in rows:
            if r.variant not in clips:
                continue
            mine = clips[r.variant]
            per_clip = [aggregate(_at(mine, k).values()) for k in range(count)]
            vs_ref = None
            if ref is not None and r.variant != reference:
                vs_ref = [_paired(mine, ref, k) for k in range(count)]
            entries.append(
                {
                    "variant": r.variant,
                    "label": r.label,
                    "per_clip": per_clip,
                    "vs_reference": vs_ref,
                }
            )
        out.append(
            {
                "dimension": dim,
                "clip_seconds": one,
                "clips": [
                    {"clip": k, "chunks": None if span is None else span[k]} for k in range(count)
                ],
                "variants": entries,
            }
        )
    return out


def _at(clips: Clips, k: int) -> dict[str, float]:
    """Video -> its clip ``k`` value, over the videos that have one."""
    return {v: x[k] for v, x in clips.items() if len(x) > k and x[k] is not None}


def _paired(mine: Clips, ref: Clips, k: int) -> dict[str, Any]:
    a, b = _at(ref, k), _at(mine, k)
    return paired_summary(b[v] - a[v] for v in sorted(a.keys() & b.keys()))


def _spans(run: RunDir, count: int, seconds: float) -> list[list[int]] | None:
    """Per clip the first and last chunk it covers, from the reference's first record; None
    when its frame rate, frame count or chunk length is unknown."""
    records = run.records(run.reference)
    if not records:
        return None
    record, settings = records[0], run.manifest.get("settings", {})
    fps, shape = record.get("fps"), record.get("frames")
    length = chunk_frames_of(record, settings)
    if not fps or not shape or not length:
        return None
    per_clip, total = int(fps) * seconds, int(shape[0])
    first = first_chunk_frames_of(record, settings)
    spans = []
    for k in range(count):
        start = min(int(k * per_clip), total - 1)
        end = min(int((k + 1) * per_clip), total) - 1
        spans.append([chunk_of(start, length, first), chunk_of(max(start, end), length, first)])
    return spans


def over_time_lines(entries: list[dict[str, Any]]) -> list[str]:
    """``VBench subject_consistency per 2-s clip (chunks 0–5, chunks 6–11), INT2 …: 0.951,
    0.942 (Δ -0.009 [-0.020, +0.002])``: one line per dimension and variant."""
    lines = []
    for e in entries:
        clips = ", ".join(clip_label(c) for c in e["clips"])
        for v in e["variants"]:
            lines.append(f"{title(e)} ({clips}), {v['label']}: " + ", ".join(variant_cells(v)))
    return lines


def title(entry: dict[str, Any]) -> str:
    """``VBench subject_consistency per 2-s clip`` (no length when the clips have two)."""
    length = f"{entry['clip_seconds']:g}-s " if entry["clip_seconds"] else ""
    return f"VBench {entry['dimension']} per {length}clip"


def variant_cells(variant: dict[str, Any]) -> list[str]:
    """One variant's :func:`clip_cell` per clip."""
    diffs = variant["vs_reference"] or [None] * len(variant["per_clip"])
    return [clip_cell(p, d) for p, d in zip(variant["per_clip"], diffs, strict=True)]


def clip_label(clip: dict[str, Any]) -> str:
    """``chunks 6–11`` (``clip 1`` when its chunks are unknown)."""
    chunks = clip["chunks"]
    if chunks is None:
        return f"clip {clip['clip']}"
    lo, hi = chunks
    return f"chunk {lo}" if lo == hi else f"chunks {lo}–{hi}"


def clip_cell(point: dict[str, Any], diff: dict[str, Any] | None) -> str:
    """``0.951`` or ``0.951 (Δ -0.009 [-0.020, +0.002])``; ``—`` without videos."""
    if point["mean"] is None:
        return "—"
    text = f"{point['mean']:.3f}"
    if diff and diff.get("n"):
        ci = diff.get("ci95")
        ci_text = f" [{ci[0]:+.3f}, {ci[1]:+.3f}]" if ci else ""
        text += f" (Δ {diff['mean']:+.3f}{ci_text})"
    return text
