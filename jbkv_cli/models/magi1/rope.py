"""MAGI-1's 3-D rotary position embedding (learnable frequency bands, absolute positions).

For head dim ``D`` there are ``D/8`` bands per axis (t, h, w), so ``F = 3·D/8`` frequencies
(48 at ``D = 128``). Token ``(t, h, w)`` of a forward whose video so far has ``T_tot`` latent
frames (finished chunks included) and an ``H × W`` grid has the coordinates

    p_t = t · (T_tot - 1) / (T_tot - 1)                    (absolute frame index)
    p_h = (h - (H - 1)/2) · (H/ρ - 1) / (H - 1),   ρ = sqrt(H·W / 256)
    p_w = (w - (W - 1)/2) · (W/ρ - 1) / (W - 1)

and angles ``θ = p_axis · band``. Rotation is "rotate-half" (flash-attn, non-interleaved) on the
first ``2F`` channels: ``(x_i, x_{i+F}) ↦ (x_i cos θ_i − x_{i+F} sin θ_i, x_i sin θ_i + x_{i+F} cos θ_i)``;
channels ``2F..D`` pass unchanged. Upstream writes ``p_t`` with the same (identity) rescale,
which we keep so the rounding matches.
"""

from __future__ import annotations

import math

import torch
from torch import nn


def default_bands(head_dim: int, temperature: float = 10000.0) -> torch.Tensor:
    """Initial bands ``temperature^(-i/n)``, ``n = head_dim // 8`` (the checkpoint overrides them)."""
    n = head_dim // 8
    return 1.0 / temperature ** (torch.arange(n, dtype=torch.float32) / n)


def _axis(size: int, ref: float, centre: bool, device: torch.device | None = None) -> torch.Tensor:
    x = torch.arange(size, dtype=torch.float32, device=device)
    if centre:
        x = x - (size - 1) / 2
    if size == 1:
        return x
    return x / (size - 1) * (ref - 1)


def rope_angles(bands: torch.Tensor, frames: int, height: int, width: int) -> torch.Tensor:
    """Angles ``[frames·height·width, 3·n]`` (axis-major: t bands, h bands, w bands), float32.

    ``frames`` counts every latent frame from the start of the video up to the forward's last.
    """
    rho = math.sqrt(height * width / 256)
    t = _axis(frames, frames, centre=False, device=bands.device)  # made on the device
    h = _axis(height, height / rho, centre=True, device=bands.device)
    w = _axis(width, width / rho, centre=True, device=bands.device)
    grid = torch.stack(torch.meshgrid(t, h, w, indexing="ij"), dim=-1)  # [T, H, W, 3]
    angles = grid.unsqueeze(-1) * bands.float()  # [T, H, W, 3, n]
    return angles.reshape(frames * height * width, -1)


class LearnableRotaryEmbedding(nn.Module):
    """Holds the learnable ``bands`` (checkpoint key ``rope.bands``) and builds cos/sin tables."""

    def __init__(self, head_dim: int) -> None:
        super().__init__()
        self.bands = nn.Parameter(default_bands(head_dim))

    def forward(
        self, frames_total: int, frames: int, height: int, width: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` ``[frames·height·width, F]`` for the last ``frames`` of ``frames_total``."""
        ang = rope_angles(self.bands, frames_total, height, width)
        ang = ang[-(frames * height * width) :]
        return ang.cos(), ang.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE on the first ``2F`` channels of ``x [..., L, D]`` (cos, sin ``[L, F]``)."""
    f = cos.shape[-1]
    x1, x2, rest = x[..., :f], x[..., f : 2 * f], x[..., 2 * f :]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos, rest], dim=-1)
