"""Statistics of ``jbkv fidelity --json``: confidence intervals of the scores, and the drift test.

Each score (PSNR, SSIM, LPIPS) is already a paired comparison, a test video against its
reference; it is a distance, with no zero a test could reject (PSNR of identical videos is the
cap, not 0), so the scores get their 95% confidence interval (t over videos) and no p-value.

The paired difference ``fidelity`` can test is drift: does a video lose quality over its chunks?
Per video, the score of its last chunk minus that of its first chunk that differs from the
reference (the first with a per-chunk PSNR below the cap: the first chunk of a chunk-wise
autoregressive model reads no cache and is often identical, scored at the cap, which would make
any drift look significant). Videos with no such chunk before their last are left out (counted).
The three metrics' drift tests are Holm-adjusted together (:mod:`jbkv_cli.metrics.paired`).
"""

from __future__ import annotations

from typing import Any

from jbkv_cli.metrics.paired import paired_summary, with_holm
from jbkv_cli.metrics.psnr import PSNR_CAP_DB

SCORES = ("psnr", "psnr_pooled", "ssim", "lpips")
DRIFT = ("psnr", "ssim", "lpips")
DRIFT_RULE = (
    "per video: last chunk minus the first chunk below the PSNR cap (the first that differs "
    "from the reference); videos without one before their last chunk are left out"
)


def fidelity_statistics(videos: list[Any]) -> dict[str, Any]:
    """``{"scores": {metric: {mean, se, sd, n, ci95}}, "drift": {"rule", "videos",
    "left_out", "metrics": {metric: paired statistics}}}`` of :class:`VideoScores` objects."""
    scores = {}
    for metric in SCORES:
        values = [getattr(v, metric) for v in videos if getattr(v, metric) is not None]
        s = paired_summary(values)
        scores[metric] = {k: s[k] for k in ("mean", "se", "sd", "n", "ci95")}
    diffs: dict[str, list[float]] = {m: [] for m in DRIFT}
    used = 0
    for v in videos:
        pair = _drift_chunks(v.psnr_per_chunk)
        if pair is None:
            continue
        used += 1
        first, last = pair
        for m in DRIFT:
            chunks = getattr(v, f"{m}_per_chunk")
            if chunks:
                diffs[m].append(chunks[last] - chunks[first])
    metrics = {m: paired_summary(d) for m, d in diffs.items() if d}
    with_holm(list(metrics.values()))
    return {
        "scores": scores,
        "drift": {
            "rule": DRIFT_RULE,
            "videos": used,
            "left_out": len(videos) - used,
            "metrics": metrics,
        },
    }


def _drift_chunks(psnr_per_chunk: list[float]) -> tuple[int, int] | None:
    """(first chunk below the cap, last chunk) indices into the list, or None."""
    first = next((i for i, p in enumerate(psnr_per_chunk) if p < PSNR_CAP_DB), None)
    last = len(psnr_per_chunk) - 1
    return None if first is None or first >= last else (first, last)
