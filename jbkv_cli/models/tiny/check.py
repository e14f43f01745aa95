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
  motion axis over the chunk's time (:func:`chunk_paths`: from the previous chunk's last frame,
  4 frame steps; chunk 0: its own 3) is at least ``min_path`` pixels (the slowest training
  speed, 0.97 px/frame, gives 2.9 px over 3 steps; a bounce does not shorten the path, the pixel
  grid does a little), and it stays on its axis (the centroid's range across the motion axis is
  at most ``max_drift`` pixels). Counting the step into the chunk matters at a wall: a shape
  that turns a pixel early, as the model's do over long rollouts, moves about 1 px within one
  chunk's own frames and about 2 px over its time; until 2026-12-03 (``follows_prompt_version``
  1) the check counted the chunk's own frames only and called such a turn a stall.

:func:`check_chunks` asks the same per chunk, for the long-horizon report: chunk ``c`` follows
the prompt when its foreground's mean colour is nearest to the named one, every frame of it
keeps its area within ``[1/2, 2]`` of the first chunk's median, its centroid's path along the
motion axis is at least ``min_path``, the centroid has stayed within ``max_drift`` across the
axis from the first frame to the end of ``c``, and (chunks 0 and 1) the start advances as named.
It needs no reference: after a video has diverged from its reference it still tells whether it
is a video of its prompt.
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


@dataclass(frozen=True)
class _Track:
    """Per-frame measurements of a video against its prompt."""

    area: torch.Tensor  # [T] foreground pixels
    along: torch.Tensor  # [T] centroid along the motion direction, px
    across: torch.Tensor  # [T] centroid across the motion axis, px
    colour: torch.Tensor  # [T, 3] mean foreground colour (0 where no foreground)
    colour_name: str  # the prompt's colour


def _track(frames: torch.Tensor, prompt: str) -> _Track:
    p = parse_prompt(prompt)
    mask = foreground(frames, p.background)
    h, w = mask.shape[1:]
    ys, xs = torch.meshgrid(torch.arange(float(h)), torch.arange(float(w)), indexing="ij")
    area = mask.sum((1, 2))
    safe = area.clamp_min(1)
    centroid = torch.stack(((mask * xs).sum((1, 2)) / safe, (mask * ys).sum((1, 2)) / safe), -1)
    x = frames.float() / 255
    colour = (x * mask[..., None]).sum((1, 2)) / safe[:, None]
    ux, uy = MOTIONS[p.motion]
    along = centroid @ torch.tensor([ux, uy])
    across = centroid @ torch.tensor([abs(uy), abs(ux)])
    return _Track(area, along, across, colour, p.colour)


def _nearest(colour: torch.Tensor) -> str:
    return min(COLOURS, key=lambda c: float((torch.tensor(COLOURS[c]) - colour).norm()))


def _mean_colour(track: _Track, lo: int, hi: int) -> torch.Tensor:
    """Mean foreground colour over frames ``lo .. hi-1``, weighted by area."""
    area = track.area[lo:hi]
    return (track.colour[lo:hi] * area[:, None]).sum(0) / area.sum().clamp_min(1)


def _start(track: _Track, frames_per_chunk: int) -> tuple[float, float]:
    """How far the centroid advanced by the end of chunk 2 (px along the named direction), and
    the first chunk's median area (px, at least 1)."""
    t = track.area.shape[0]
    first = min(2 * frames_per_chunk, t) - 1
    advance = float(track.along[first] - track.along[0])
    return advance, float(track.area[:frames_per_chunk].median().clamp_min(1))


def chunk_paths(along: torch.Tensor, frames_per_chunk: int) -> torch.Tensor:
    """Per whole chunk, the centroid's path length along the motion axis over the chunk's time:
    every frame step from the previous chunk's last frame (chunk 0: its own first) to its own
    last frame; ``[n_chunks]``, zeros for 1-frame chunks' chunk 0."""
    steps = along.diff().abs()  # step i: frame i -> i + 1
    n = along.shape[0] // frames_per_chunk
    return (
        torch.stack(
            [
                steps[max(0, c * frames_per_chunk - 1) : (c + 1) * frames_per_chunk - 1].sum()
                for c in range(n)
            ]
        )
        if n
        else torch.zeros(0)
    )


def check_video(
    frames: torch.Tensor,
    prompt: str,
    frames_per_chunk: int = 4,
    min_path: float = 1.2,
    max_drift: float = 4.0,
) -> PromptCheck:
    """Measure ``frames [T, H, W, 3]`` (uint8) against ``prompt`` (see the module docstring)."""
    tr = _track(frames, prompt)
    t = tr.area.shape[0]
    nearest = _nearest(_mean_colour(tr, 0, t))
    advance, ref_area = _start(tr, frames_per_chunk)
    ratio = tr.area / ref_area
    chunk_path = chunk_paths(tr.along, frames_per_chunk)
    drift = float(tr.across.max() - tr.across.min())
    return PromptCheck(
        colour=nearest,
        first_advance=advance,
        min_area_ratio=float(ratio.min()),
        max_area_ratio=float(ratio.max()),
        min_chunk_path=float(chunk_path.min()),
        max_drift=drift,
        colour_ok=nearest == tr.colour_name,
        starts_ok=advance > 2.0,
        shape_ok=bool(tr.area.min() > 0)
        and float(ratio.min()) >= 0.5
        and float(ratio.max()) <= 2.0,
        moving_ok=float(chunk_path.min()) >= min_path and drift <= max_drift,
    )


def check_chunks(
    frames: torch.Tensor,
    prompt: str,
    frames_per_chunk: int = 4,
    min_path: float = 1.2,
    max_drift: float = 4.0,
) -> list[bool]:
    """Per whole chunk of ``frames [T, H, W, 3]`` (uint8): does it still follow ``prompt``
    (the module docstring's per-chunk check)? A partial last chunk is left out."""
    tr = _track(frames, prompt)
    t = tr.area.shape[0]
    n = t // frames_per_chunk
    if n == 0:
        return []
    advance, ref_area = _start(tr, frames_per_chunk)
    starts_ok = advance > 2.0
    paths = chunk_paths(tr.along, frames_per_chunk)
    out = []
    for c in range(n):
        lo, hi = c * frames_per_chunk, (c + 1) * frames_per_chunk
        area = tr.area[lo:hi]
        ratio = area / ref_area
        shape_ok = bool(area.min() > 0) and float(ratio.min()) >= 0.5 and float(ratio.max()) <= 2
        colour_ok = _nearest(_mean_colour(tr, lo, hi)) == tr.colour_name
        path = float(paths[c])
        drift = float(tr.across[:hi].max() - tr.across[:hi].min())
        moving_ok = path >= min_path and drift <= max_drift
        out.append(colour_ok and shape_ok and moving_ok and (c >= 2 or starts_ok))
    return out
