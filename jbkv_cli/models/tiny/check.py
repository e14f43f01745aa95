"""Does a tiny-model video do what its prompt says? Measured on the frames, for tests and benchmarks.

The foreground is every pixel farther than ``0.25`` (in [0, 1], max over RGB) from the named
background's brightness. Per frame: its area, centroid and mean colour. A video *follows its
prompt* when

- the foreground's mean colour is nearest to the named colour;
- the shape starts moving as named: the centroid advances along the named direction over the
  first two chunks (it starts near the opposite wall);
- it stays a shape for the whole video: every frame's area is within ``[1/2, 2]`` of the
  median area of the first chunk;
- it keeps moving for the whole video: in every chunk, the centroid's path length along the
  motion axis is at least ``min_path`` pixels (the slowest training speed, 0.97 px/frame, gives
  2.9 px over the 3 frame steps of a 4-frame chunk; a bounce does not shorten the path, the
  pixel grid does a little), and it stays on its axis (the centroid's range across the motion
  axis is at most ``max_drift`` pixels).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch

from jbkv_cli.models.tiny.data import BACKGROUNDS, COLOURS, MOTIONS, parse_prompt


@dataclass(frozen=True)
class PromptCheck:
    """What :func:`check_video` measured, and the verdicts."""

    colour: str  # nearest named colour to the foreground's mean colour
    first_advance: float  # px along the named direction, first frame -> end of chunk 2
    min_area_ratio: float  # min over frames of area / median area of the first chunk
    max_area_ratio: float
    min_chunk_path: float  # min over chunks of the centroid path length along the motion axis
    max_drift: float  # centroid range across the motion axis, px
    colour_ok: bool
    starts_ok: bool
    shape_ok: bool
    moving_ok: bool

    @property
    def ok(self) -> bool:
        return self.colour_ok and self.starts_ok and self.shape_ok and self.moving_ok

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok}


def foreground(frames: torch.Tensor, background: str) -> torch.Tensor:
    """``frames [T, H, W, 3]`` uint8 -> foreground mask ``[T, H, W]`` (float 0/1)."""
    x = frames.float() / 255
    return ((x - BACKGROUNDS[background]).abs().amax(-1) > 0.25).float()


def check_video(
    frames: torch.Tensor,
    prompt: str,
    frames_per_chunk: int = 4,
    min_path: float = 1.2,
    max_drift: float = 4.0,
) -> PromptCheck:
    """Measure ``frames [T, H, W, 3]`` (uint8) against ``prompt`` (see the module docstring)."""
    p = parse_prompt(prompt)
    mask = foreground(frames, p.background)
    t, h, w = mask.shape
    ys, xs = torch.meshgrid(torch.arange(float(h)), torch.arange(float(w)), indexing="ij")
    area = mask.sum((1, 2))
    safe = area.clamp_min(1)
    centroid = torch.stack(((mask * xs).sum((1, 2)) / safe, (mask * ys).sum((1, 2)) / safe), -1)
    x = frames.float() / 255
    colour = (x * mask[..., None]).sum((0, 1, 2)) / mask.sum().clamp_min(1)
    nearest = min(COLOURS, key=lambda c: float((torch.tensor(COLOURS[c]) - colour).norm()))

    ux, uy = MOTIONS[p.motion]
    along = centroid @ torch.tensor([ux, uy])
    across = centroid @ torch.tensor([abs(uy), abs(ux)])
    first = min(2 * frames_per_chunk, t) - 1
    advance = float(along[first] - along[0])
    ref_area = float(area[:frames_per_chunk].median().clamp_min(1))
    ratio = area / ref_area
    chunks = along[: t - t % frames_per_chunk].reshape(-1, frames_per_chunk)
    chunk_path = chunks.diff(dim=1).abs().sum(1)  # zeros for 1-frame chunks
    drift = float(across.max() - across.min())
    return PromptCheck(
        colour=nearest,
        first_advance=advance,
        min_area_ratio=float(ratio.min()),
        max_area_ratio=float(ratio.max()),
        min_chunk_path=float(chunk_path.min()),
        max_drift=drift,
        colour_ok=nearest == p.colour,
        starts_ok=advance > 2.0,
        shape_ok=bool(area.min() > 0) and float(ratio.min()) >= 0.5 and float(ratio.max()) <= 2.0,
        moving_ok=float(chunk_path.min()) >= min_path and drift <= max_drift,
    )
