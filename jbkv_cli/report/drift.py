"""Drift over time: PSNR and SSIM per chunk, per variant, mean ± SE across videos.

A full-clip PSNR of a long video is dominated by its late divergence; the per-chunk curve shows
*when* a quantized cache starts to cost quality. Reads only the run directory: the per-chunk
lists ``fidelity`` stores (``psnr_per_chunk``, ``ssim_per_chunk``, ``first_chunk``,
``chunk_frames``); entries scored before those existed are chunked here from their per-frame
lists with the chunk length of their record (:func:`~jbkv_cli.metrics.chunks.chunk_frames_of`).
"""

from __future__ import annotations

from collections import Counter
from typing import Any

from jbkv_cli.metrics.chunks import chunk_frames_of, chunk_of, first_chunk_frames_of, per_chunk
from jbkv_cli.metrics.stats import aggregate
from jbkv_cli.report.results import ResultRow
from jbkv_cli.run.directory import RunDir, video_name

METRICS = ("psnr", "ssim")


def drift_series(run: RunDir, rows: list[ResultRow]) -> dict[str, Any]:
    """Per-chunk mean ± SE of each metric for every scored variant, in table order.

    Returns ``{"unit": "chunk" | "frame", "chunk_frames": int, "variants": [{"variant",
    "label", "corrected", "chunk_frames", "psnr": [{"chunk", "mean", "se", "n"}, …], "ssim": […]}, …]}``;
    ``unit`` is ``frame`` when every variant was scored per frame (chunk length unknown).
    """
    settings = run.manifest.get("settings", {})
    variants = []
    for row in rows:
        vid = row.variant
        if row.is_reference:
            continue
        scores = run.read_metrics("fidelity", vid)
        records = {video_name(r["prompt"], r["index"]): r for r in run.records(vid)}
        series: dict[str, dict[int, list[float]]] = {m: {} for m in METRICS}
        lengths: Counter[int] = Counter()
        for name, entry in scores.items():
            chunked = chunked_entry(entry, records.get(name, {}), settings)
            if chunked is None:
                continue
            first, length, lists = chunked
            lengths[length] += 1
            for metric in METRICS:
                for k, value in enumerate(lists[metric]):
                    series[metric].setdefault(first + k, []).append(value)
        if not lengths:
            continue
        variants.append(
            {
                "variant": vid,
                "label": row.label,
                "corrected": row.corrected,
                "chunk_frames": lengths.most_common(1)[0][0],
                **{
                    m: [{"chunk": k, **aggregate(v)} for k, v in sorted(series[m].items())]
                    for m in METRICS
                },
            }
        )
    lengths = {v["chunk_frames"] for v in variants}
    chunk = lengths.pop() if len(lengths) == 1 else 1
    return {"unit": "frame" if chunk == 1 else "chunk", "chunk_frames": chunk, "variants": variants}


def chunked_entry(
    entry: dict[str, Any], record: dict[str, Any], settings: dict[str, Any]
) -> tuple[int, int, dict[str, list[float]]] | None:
    """(first chunk, chunk length, per-chunk lists) of one stored fidelity entry."""
    if all(f"{m}_per_chunk" in entry for m in METRICS):
        lists = {m: entry[f"{m}_per_chunk"] for m in METRICS}
        return int(entry.get("first_chunk", 0)), int(entry.get("chunk_frames", 1)), lists
    if not all(f"{m}_per_frame" in entry for m in METRICS):
        return None
    length = chunk_frames_of(record, settings)
    first = first_chunk_frames_of(record, settings) if length else None
    length = length or 1
    skipped = int(entry.get("skipped_frames", 0))
    lists = {m: per_chunk(entry[f"{m}_per_frame"], length, skipped, first) for m in METRICS}
    return chunk_of(skipped, length, first), length, lists
