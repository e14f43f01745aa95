"""VBench scores: per-dimension values, per-video regrouping, and Total / Quality / Semantic.

Normalization and weights are VBench's published constants (``scripts/constant.py`` of
Vchitect/VBench, not shipped in the wheel). For a dimension ``d`` with raw score ``s_d``:

    n_d      = (s_d − Min_d) / (Max_d − Min_d) · w_d
    Quality  = Σ_{d ∈ Q} n_d / Σ_{d ∈ Q} w_d          (Σ w = 6.5 over all seven)
    Semantic = Σ_{d ∈ S} n_d / Σ_{d ∈ S} w_d          (Σ w = 9 over all nine)
    Total    = (4 · Quality + 1 · Semantic) / (4 + 1)

Upstream (``cal_final_score.py``) silently sets a missing dimension to 0. Here a group is
computed over the dimensions that are present (the denominators are the weights present), and
the result is marked ``partial`` with the missing dimensions listed; ``total`` is ``None`` when a
whole group is absent.

Standard errors: each dimension's SE is over per-video values (clips regrouped by video),
``SE_d = std_{ddof=1}(v) / √n``. Quality, Semantic and Total are linear in the ``s_d``, so by the
delta method (treating dimensions as independent, an approximation: dimensions that share a
prompt suite are correlated)

    SE_Q = √( Σ_{d ∈ Q} (w_d / ((Max_d − Min_d) · Σ_Q w))² · SE_d² ),  likewise SE_S,
    SE_T = √( (4/5)² SE_Q² + (1/5)² SE_S² ).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import PurePath
from typing import Any

QUALITY_DIMENSIONS: tuple[str, ...] = (
    "subject_consistency",
    "background_consistency",
    "temporal_flickering",
    "motion_smoothness",
    "aesthetic_quality",
    "imaging_quality",
    "dynamic_degree",
)
SEMANTIC_DIMENSIONS: tuple[str, ...] = (
    "object_class",
    "multiple_objects",
    "human_action",
    "color",
    "spatial_relationship",
    "scene",
    "appearance_style",
    "temporal_style",
    "overall_consistency",
)
DIMENSIONS: tuple[str, ...] = QUALITY_DIMENSIONS + SEMANTIC_DIMENSIONS

NORMALIZE: dict[str, tuple[float, float]] = {
    "subject_consistency": (0.1462, 1.0),
    "background_consistency": (0.2615, 1.0),
    "temporal_flickering": (0.6293, 1.0),
    "motion_smoothness": (0.706, 0.9975),
    "dynamic_degree": (0.0, 1.0),
    "aesthetic_quality": (0.0, 1.0),
    "imaging_quality": (0.0, 1.0),
    "object_class": (0.0, 1.0),
    "multiple_objects": (0.0, 1.0),
    "human_action": (0.0, 1.0),
    "color": (0.0, 1.0),
    "spatial_relationship": (0.0, 1.0),
    "scene": (0.0, 0.8222),
    "appearance_style": (0.0009, 0.2855),
    "temporal_style": (0.0, 0.364),
    "overall_consistency": (0.0, 0.364),
}
DIM_WEIGHT: dict[str, float] = {d: 1.0 for d in DIMENSIONS} | {"dynamic_degree": 0.5}
QUALITY_WEIGHT = 4.0
SEMANTIC_WEIGHT = 1.0

# Per-clip values VBench stores on another scale than its aggregate (MUSIQ is 0–100; the
# aggregate is divided by 100, the detailed list is not).
DETAIL_SCALE: dict[str, float] = {"imaging_quality": 0.01}

_CLIP_SUFFIX = re.compile(r"_(\d+|full)$")


def normalized(dimension: str, score: float) -> float:
    """``(score − Min) / (Max − Min) · weight`` for one dimension."""
    lo, hi = NORMALIZE[dimension]
    return (score - lo) / (hi - lo) * DIM_WEIGHT[dimension]


def _clip_location(path: str) -> tuple[str, str]:
    """(the long video, the clip's file stem) of a detailed entry's path.

    Clips live in ``.../split_clip/<video>/<video>_NNN.mp4`` (VBench-Long; some detailed lists
    carry odd keys below that folder), static-filtered clips in ``.../filtered_clips/<video>_NNN.mp4``,
    and short-mode entries are the videos themselves.
    """
    parts, stem = PurePath(path).parts, PurePath(path).stem
    if "split_clip" in parts:
        i = len(parts) - 1 - parts[::-1].index("split_clip")
        if i + 1 < len(parts):
            return parts[i + 1], PurePath(parts[i + 2]).stem if i + 2 < len(parts) else stem
    return _CLIP_SUFFIX.sub("", stem), stem


def video_id(path: str) -> str:
    """The long video a clip (or a short video) belongs to (:func:`_clip_location`)."""
    return _clip_location(path)[0]


def clip_index(path: str) -> int:
    """A clip's place in its long video: ``NNN`` of ``<video>_NNN.mp4``; 0 for a whole video
    (short modes, or ``_full``: a video shorter than one clip)."""
    m = _CLIP_SUFFIX.search(_clip_location(path)[1])
    return int(m.group(1)) if m and m.group(1).isdigit() else 0


@dataclass
class DimensionScore:
    """One dimension for one variant: VBench's aggregate plus per-video values, and per video
    its clips' values in time order (``per_clip``; None where a clip was not scored: the static
    filter keeps some clips only)."""

    dimension: str
    score: float
    per_video: dict[str, float] = field(default_factory=dict)
    n_clips: int = 0
    per_clip: dict[str, list[float | None]] = field(default_factory=dict)

    @property
    def n_videos(self) -> int:
        return len(self.per_video)

    @property
    def mean_per_video(self) -> float | None:
        vals = list(self.per_video.values())
        return sum(vals) / len(vals) if vals else None

    @property
    def se(self) -> float | None:
        """Standard error over videos, ``std(ddof=1) / √n``; ``None`` below two videos."""
        return standard_error(self.per_video.values())

    def to_json(self) -> dict[str, Any]:
        return {
            "score": self.score,
            "se": self.se,
            "n_videos": self.n_videos,
            "n_clips": self.n_clips,
            "mean_per_video": self.mean_per_video,
            "per_video": self.per_video,
            "per_clip": self.per_clip,
        }


def standard_error(values: Iterable[float]) -> float | None:
    """``std(ddof=1) / √n``; ``None`` for fewer than two values."""
    v = [float(x) for x in values]
    n = len(v)
    if n < 2:
        return None
    m = sum(v) / n
    var = sum((x - m) ** 2 for x in v) / (n - 1)
    return math.sqrt(var / n)


def regroup_by_video(detailed: Iterable[Mapping[str, Any]], scale: float = 1.0) -> dict[str, float]:
    """Mean of per-clip ``video_results`` per long video (booleans count as 0/1)."""
    sums: dict[str, list[float]] = {}
    for item in detailed:
        if "video_path" not in item or "video_results" not in item:
            continue
        sums.setdefault(video_id(str(item["video_path"])), []).append(
            float(item["video_results"]) * scale
        )
    return {k: sum(v) / len(v) for k, v in sorted(sums.items())}


def regroup_clips(
    detailed: Iterable[Mapping[str, Any]], scale: float = 1.0
) -> dict[str, list[float | None]]:
    """Per long video its clips' ``video_results`` by :func:`clip_index` (a clip listed twice:
    the mean), None for an index with no entry below the last."""
    by_index: dict[str, dict[int, list[float]]] = {}
    for item in detailed:
        if "video_path" not in item or "video_results" not in item:
            continue
        path = str(item["video_path"])
        clips = by_index.setdefault(video_id(path), {})
        clips.setdefault(clip_index(path), []).append(float(item["video_results"]) * scale)
    return {
        v: [sum(clips[k]) / len(clips[k]) if k in clips else None for k in range(max(clips) + 1)]
        for v, clips in sorted(by_index.items())
    }


def parse_dimension(dimension: str, raw: Any) -> DimensionScore:
    """Parse one entry of VBench's ``<name>_eval_results.json``: ``[aggregate, detailed, ...]``."""
    if not isinstance(raw, list | tuple) or not raw:
        raise ValueError(f"unexpected VBench result for {dimension}: {raw!r:.200}")
    detailed = raw[1] if len(raw) > 1 and isinstance(raw[1], list) else []
    clips = [d for d in detailed if isinstance(d, dict) and "video_results" in d]
    scale = DETAIL_SCALE.get(dimension, 1.0)
    return DimensionScore(
        dimension=dimension,
        score=float(raw[0]),
        per_video=regroup_by_video(clips, scale),
        n_clips=len(clips),
        per_clip=regroup_clips(clips, scale),
    )


@dataclass
class VBenchTotals:
    """Quality / Semantic / Total of one variant, with SEs and what was missing."""

    quality: float | None
    semantic: float | None
    total: float | None
    quality_se: float | None
    semantic_se: float | None
    total_se: float | None
    missing: list[str]

    @property
    def partial(self) -> bool:
        return bool(self.missing)

    def to_json(self) -> dict[str, Any]:
        return {
            "quality": self.quality,
            "semantic": self.semantic,
            "total": self.total,
            "quality_se": self.quality_se,
            "semantic_se": self.semantic_se,
            "total_se": self.total_se,
            "partial": self.partial,
            "missing": self.missing,
        }


def _group(
    dims: tuple[str, ...], scores: Mapping[str, float], ses: Mapping[str, float | None]
) -> tuple[float | None, float | None]:
    present = [d for d in dims if d in scores]
    if not present:
        return None, None
    wsum = sum(DIM_WEIGHT[d] for d in present)
    value = sum(normalized(d, scores[d]) for d in present) / wsum
    if any(ses.get(d) is None for d in present):
        return value, None
    var = 0.0
    for d in present:
        lo, hi = NORMALIZE[d]
        c = DIM_WEIGHT[d] / ((hi - lo) * wsum)
        var += (c * ses[d]) ** 2  # type: ignore[operator]
    return value, math.sqrt(var)


def compute_totals(
    scores: Mapping[str, float], ses: Mapping[str, float | None] | None = None
) -> VBenchTotals:
    """Quality, Semantic and Total from raw per-dimension scores (keys: VBench dimension names).

    Unknown keys are ignored; missing dimensions are listed (never counted as 0).
    """
    ses = ses or {}
    known = {d: float(s) for d, s in scores.items() if d in NORMALIZE}
    quality, quality_se = _group(QUALITY_DIMENSIONS, known, ses)
    semantic, semantic_se = _group(SEMANTIC_DIMENSIONS, known, ses)
    total = total_se = None
    if quality is not None and semantic is not None:
        wq = QUALITY_WEIGHT / (QUALITY_WEIGHT + SEMANTIC_WEIGHT)
        ws = SEMANTIC_WEIGHT / (QUALITY_WEIGHT + SEMANTIC_WEIGHT)
        total = wq * quality + ws * semantic
        if quality_se is not None and semantic_se is not None:
            total_se = math.sqrt((wq * quality_se) ** 2 + (ws * semantic_se) ** 2)
    missing = [d for d in DIMENSIONS if d not in known]
    return VBenchTotals(quality, semantic, total, quality_se, semantic_se, total_se, missing)


def totals_from_dimensions(dims: Mapping[str, DimensionScore]) -> VBenchTotals:
    """:func:`compute_totals` over parsed dimensions, SEs from their per-video values."""
    return compute_totals({d: s.score for d, s in dims.items()}, {d: s.se for d, s in dims.items()})
