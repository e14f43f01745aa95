"""Procedural training videos for the tiny model, and the closed prompt grammar.

A video shows one anti-aliased shape of one colour moving on a plain background:

    "a red circle moves right on a dark background"

The prompt names colour, shape, direction and background; the size (+-4%), the start position
(a jitter of 2 px) and the speed (1 px/frame +-3%) vary a little per video. The shape bounces
off the walls (mirror reflection of its unfolded path): over the default 32 frames it crosses
the frame, bounces off the far wall and comes back. The model has no absolute clock (its RoPE
sees only frame differences), so continuing a video needs memory of earlier chunks: where the
shape is and which way it is going now (out, or back after the bounce). Size and speed are
nearly fixed by the prompt on purpose: a generated video then has a prior to fall back on
instead of copying, and compounding, its own small errors of size and speed chunk after chunk.
Pixels are in [0, 1]; the model works on ``2 * pixel - 1``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from jbkv_cli.utils.errors import UsageError, shown

COLOURS: dict[str, tuple[float, float, float]] = {
    "red": (0.90, 0.12, 0.10),
    "green": (0.15, 0.80, 0.20),
    "blue": (0.15, 0.30, 0.95),
    "yellow": (0.95, 0.85, 0.10),
}
SHAPES = ("circle", "square", "triangle")
MOTIONS: dict[str, tuple[float, float]] = {  # unit direction (dx, dy); image y points down
    "right": (1.0, 0.0),
    "left": (-1.0, 0.0),
    "up": (0.0, -1.0),
    "down": (0.0, 1.0),
}
BACKGROUNDS: dict[str, float] = {"dark": 0.08, "gray": 0.45, "light": 0.88}

VOCAB: tuple[str, ...] = (*COLOURS, *SHAPES, *MOTIONS, *BACKGROUNDS)
"""The content words of the grammar; the model embeds these (one id per slot)."""

GRAMMAR = (
    "a <colour> <shape> moves <direction> on a <background> background, with "
    f"colour in {{{', '.join(COLOURS)}}}, shape in {{{', '.join(SHAPES)}}}, "
    f"direction in {{{', '.join(MOTIONS)}}}, background in {{{', '.join(BACKGROUNDS)}}}"
)

_PROMPT_RE = re.compile(
    r"^an?\s+(?P<colour>\w+)\s+(?P<shape>\w+)\s+moves\s+(?P<motion>\w+)\s+"
    r"on\s+an?\s+(?P<background>\w+)\s+background\s*\.?$"
)


@dataclass(frozen=True)
class Prompt:
    """A parsed prompt: one word per slot of the grammar."""

    colour: str
    shape: str
    motion: str
    background: str

    @property
    def token_ids(self) -> list[int]:
        """Vocabulary ids of the four content words, in slot order."""
        return [VOCAB.index(w) for w in (self.colour, self.shape, self.motion, self.background)]

    @property
    def text(self) -> str:
        return f"a {self.colour} {self.shape} moves {self.motion} on a {self.background} background"


def parse_prompt(text: str) -> Prompt:
    """Parse a prompt of the closed grammar; anything else raises :class:`UsageError`."""
    m = _PROMPT_RE.match(" ".join(text.lower().split()))
    if m is None:
        raise UsageError(
            f"the tiny model understands only prompts of the form: {GRAMMAR}; got {shown(text)}"
        )
    words = m.groupdict()
    for slot, options in (
        ("colour", COLOURS),
        ("shape", SHAPES),
        ("motion", MOTIONS),
        ("background", BACKGROUNDS),
    ):
        if words[slot] not in options:
            raise UsageError(
                f"unknown {slot} {words[slot]!r} in prompt {shown(text)}; "
                f"the tiny model knows {GRAMMAR}"
            )
    return Prompt(**words)


def all_prompts() -> list[Prompt]:
    """Every prompt of the grammar (4 * 3 * 4 * 3 = 144)."""
    return [
        Prompt(c, s, m, b) for c in COLOURS for s in SHAPES for m in MOTIONS for b in BACKGROUNDS
    ]


@dataclass(frozen=True)
class DataConfig:
    """Rendering settings: frame size, clip length, and the ranges of the hidden variables."""

    image_size: int = 32
    num_frames: int = 20
    radius: tuple[float, float] = (6.0, 6.5)
    start_jitter: float = 2.0  # pixels
    speed: tuple[float, float] = (0.97, 1.03)  # pixels per frame
    jitter: float = 0.04  # uniform jitter of colour and background brightness


def _reflect(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor) -> torch.Tensor:
    """Fold an unbounded path into [lo, hi] by mirror reflection (a bounce off each wall)."""
    span = hi - lo
    y = torch.remainder(x - lo, 2 * span)
    return lo + span - (y - span).abs()


def _signed_distance(shape_ids: torch.Tensor, dx: torch.Tensor, dy: torch.Tensor, r: torch.Tensor):
    """Approximate signed distance (pixels, < 0 inside) to a circle / square / triangle."""
    circle = torch.sqrt(dx**2 + dy**2) - r
    square = torch.maximum(dx.abs(), dy.abs()) - 0.85 * r
    # upright triangle: three half-planes with outward normals (0, 1), (+-0.866, -0.5)
    inradius = 0.6 * r
    tri = torch.maximum(dy, 0.866 * dx.abs() - 0.5 * dy) - inradius
    sid = shape_ids.view(-1, *([1] * (dx.ndim - 1)))
    return torch.where(sid == 0, circle, torch.where(sid == 1, square, tri))


def render(
    prompts: list[Prompt], cfg: DataConfig, generator: torch.Generator | None = None
) -> torch.Tensor:
    """Render one random video per prompt: float ``[B, T, 3, H, W]`` in [0, 1]."""
    b, n, t = len(prompts), cfg.image_size, cfg.num_frames

    def uniform(lo: float, hi: float, *shape: int) -> torch.Tensor:
        return lo + (hi - lo) * torch.rand(*shape, generator=generator)

    radius = uniform(*cfg.radius, b)
    speed = uniform(*cfg.speed, b)
    direction = torch.tensor([MOTIONS[p.motion] for p in prompts])  # [B, 2]
    lo, hi = radius + 0.5, n - 1.5 - radius
    # start near the wall the shape moves away from, near the middle across the motion: the
    # first chunk is then almost determined by the prompt
    along = lo + uniform(0.0, cfg.start_jitter, b)
    across = (lo + hi) / 2 + uniform(-cfg.start_jitter, cfg.start_jitter, b)
    start_along = torch.where(direction.sum(1) > 0, along, lo + hi - along)
    horizontal = direction[:, 0] != 0
    x0 = torch.where(horizontal, start_along, across)
    y0 = torch.where(horizontal, across, start_along)
    steps = torch.arange(t, dtype=torch.float32)
    x = _reflect(x0[:, None] + direction[:, :1] * speed[:, None] * steps, lo[:, None], hi[:, None])
    y = _reflect(y0[:, None] + direction[:, 1:] * speed[:, None] * steps, lo[:, None], hi[:, None])

    grid = torch.arange(n, dtype=torch.float32)
    dx = grid.view(1, 1, 1, n) - x[:, :, None, None]  # [B, T, 1, W]
    dy = grid.view(1, 1, n, 1) - y[:, :, None, None]  # [B, T, H, 1]
    dx, dy = torch.broadcast_tensors(dx, dy)
    shape_ids = torch.tensor([SHAPES.index(p.shape) for p in prompts])
    sdf = _signed_distance(shape_ids, dx, dy, radius.view(b, 1, 1, 1))
    alpha = (0.5 - sdf).clamp(0.0, 1.0)[:, :, None]  # [B, T, 1, H, W]

    colour = torch.tensor([COLOURS[p.colour] for p in prompts]) + uniform(
        -cfg.jitter, cfg.jitter, b, 3
    )
    bg = torch.tensor([BACKGROUNDS[p.background] for p in prompts]) + uniform(
        -cfg.jitter, cfg.jitter, b
    )
    colour = colour.clamp(0, 1).view(b, 1, 3, 1, 1)
    bg = bg.clamp(0, 1).view(b, 1, 1, 1, 1)
    return bg * (1 - alpha) + colour * alpha


def random_prompts(count: int, generator: torch.Generator | None = None) -> list[Prompt]:
    """Prompts drawn uniformly from the grammar."""
    pool = all_prompts()
    idx = torch.randint(len(pool), (count,), generator=generator)
    return [pool[i] for i in idx.tolist()]
