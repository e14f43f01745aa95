"""Per-chunk scores: drift over a chunk-wise generated video, one value per chunk.

An AR video model generates ``chunk_frames`` frames at a time, and a quantized cache can only
hurt chunks that read it, so quality falls chunk by chunk; a full-clip mean hides *when*. Chunk
``k`` covers frames ``[k·c, (k+1)·c)`` of the whole video (before any ``skip_frames``); its
value is the mean of the per-frame values of its compared frames, the same reduction as the
per-video mean. A video whose chunk length is unknown is scored per frame (``c = 1``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch


def per_chunk(
    values: torch.Tensor | Sequence[float], chunk_frames: int, skipped: int = 0
) -> list[float]:
    """Means of per-frame ``values`` (frames ``skipped``, ``skipped + 1``, …) per chunk.

    The first entry is chunk ``skipped // chunk_frames`` (possibly only partly compared).
    """
    if chunk_frames < 1:
        raise ValueError(f"chunk_frames must be >= 1, got {chunk_frames}")
    x = torch.as_tensor(values, dtype=torch.float64).flatten()
    if x.numel() == 0:
        return []
    index = (torch.arange(x.numel()) + skipped) // chunk_frames
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
