"""Per-chunk scores: drift over a chunk-wise generated video, one value per chunk.

An AR video model generates ``chunk_frames`` frames at a time, and a quantized cache can only
hurt chunks that read it, so quality falls chunk by chunk; a full-clip mean hides *when*. Chunk
0 covers the first ``f`` frames of the whole video (before any ``skip_frames``) and chunk
``k ≥ 1`` frames ``[f + (k−1)·c, f + k·c)``; a chunk's value is the mean of the per-frame values
of its compared frames, the same reduction as the per-video mean. ``f = c`` unless the model
states otherwise: a causal video VAE (Wan's, HunyuanVideo's) decodes a chunk of ``k`` latent
frames into ``4k`` frames but the first latent frame into one, so the first chunk has
``4k − 3`` (SkyReels-V2, Self-Forcing: 4·3 − 3 = 9 of 12; HY-WorldPlay: 13 of 16). A video whose
chunk length is unknown is scored per frame (``c = 1``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch


def _first_length(chunk_frames: int, first_frames: int | None) -> int:
    """The first chunk's length (default ``chunk_frames``); both must be at least 1."""
    first = chunk_frames if first_frames is None else first_frames
    if chunk_frames < 1 or first < 1:
        raise ValueError(f"chunk lengths must be >= 1, got {chunk_frames} (first {first})")
    return first


def chunk_of(
    frames: torch.Tensor | int, chunk_frames: int, first_frames: int | None = None
) -> torch.Tensor | int:
    """The chunk each frame index of ``frames`` belongs to: ``0`` below ``f = first_frames``
    (default ``chunk_frames``), else ``1 + (frame − f) // chunk_frames``."""
    first = _first_length(chunk_frames, first_frames)
    if isinstance(frames, int):
        return 0 if frames < first else 1 + (frames - first) // chunk_frames
    return torch.where(frames < first, 0, 1 + (frames - first).clamp_min(0) // chunk_frames)


def per_chunk(
    values: torch.Tensor | Sequence[float],
    chunk_frames: int,
    skipped: int = 0,
    first_frames: int | None = None,
) -> list[float]:
    """Means of per-frame ``values`` (frames ``skipped``, ``skipped + 1``, …) per chunk, the
    first chunk ``first_frames`` long (default ``chunk_frames``).

    The first entry is chunk :func:`chunk_of` ``(skipped)`` (possibly only partly compared).
    """
    x = torch.as_tensor(values, dtype=torch.float64).flatten()
    _first_length(chunk_frames, first_frames)
    if x.numel() == 0:
        return []
    index = chunk_of(torch.arange(x.numel()) + skipped, chunk_frames, first_frames)
    index = index - index[0]
    sums = torch.zeros(int(index[-1]) + 1, dtype=torch.float64).index_add_(0, index, x)
    counts = torch.bincount(index).to(torch.float64)
    return (sums / counts).tolist()


def chunk_frames_of(
    record: Mapping[str, Any], settings: Mapping[str, Any] | None = None
) -> int | None:
    """Frames per chunk of a generated video, from its record (and the run's settings).

    ``frames_per_chunk`` when the model states it (the embedded model does); else the frame
    count over ``num_chunks`` when it divides evenly (MAGI-1); else None (unknown: e.g. a causal
    VAE whose first latent frame decodes to one frame, as SkyReels-V2's does).
    """
    info = record.get("info") or {}
    settings = settings or {}
    for source in (info, settings):
        value = source.get("frames_per_chunk")
        if isinstance(value, int) and value > 0:
            return value
    frames = record.get("frames")
    total = frames[0] if isinstance(frames, list | tuple) and frames else None
    chunks = info.get("num_chunks") or settings.get("num_chunks")
    if isinstance(total, int) and isinstance(chunks, int) and chunks > 0 and total % chunks == 0:
        return total // chunks
    return None


def first_chunk_frames_of(
    record: Mapping[str, Any], settings: Mapping[str, Any] | None = None
) -> int | None:
    """Frames of a video's first chunk when the model states them (``first_chunk_frames`` in
    its record or the run's settings: the causal-VAE adapters do), else None (= a full chunk)."""
    for source in (record.get("info") or {}, settings or {}):
        value = source.get("first_chunk_frames")
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


def causal_vae_chunks(latent_frames: int, temporal_scale: int) -> dict[str, int]:
    """``frames_per_chunk`` and ``first_chunk_frames`` of chunks of ``latent_frames`` latent
    frames decoded by a causal VAE of ``temporal_scale`` (the first latent frame is one frame):
    ``{"frames_per_chunk": s·k, "first_chunk_frames": s·(k − 1) + 1}``."""
    return {
        "frames_per_chunk": temporal_scale * latent_frames,
        "first_chunk_frames": temporal_scale * (latent_frames - 1) + 1,
    }
