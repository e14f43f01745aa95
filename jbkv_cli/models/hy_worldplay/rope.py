"""The 3-D rotary embedding of HY-WorldPlay's vision tokens, and its camera (PRoPE) branch.

RoPE (``hyvideo/models/transformers/modules/posemb_layers.py``): the head dim is split into
(16, 56, 56) channels for the (t, h, w) axes; each axis uses frequencies ``theta^(-2i/d)``
(theta 256) at its integer position, and pairs of *interleaved* channels ``(2i, 2i+1)`` are
rotated: ``x cos + rot(x) sin`` with ``rot(x)_(2i, 2i+1) = (-x_(2i+1), x_(2i))``, in float32.
Positions of a forward are ``start .. start + T - 1`` on the time axis
(``forward_vision(rope_temporal_size, start_rope_start_idx)``): the memory pass uses 0..M-1,
the current chunk M..M+3 ("temporal reframing").

PRoPE (``hyvideo/prope/camera_rope.py``, MIT): every vision token has its own camera
``P = lift(K') w2c`` (``K'``: the normalized intrinsics without principal point); queries are
mapped by ``P^T``, keys and values by ``P^-1`` and the attention output by ``P``, each 4x4
matrix applied to every 4-channel tile of the head dim. Both branches use the q/k after the
RMSNorm; PRoPE's before RoPE.
"""

from __future__ import annotations

import torch


def axis_freqs(dim: int, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """``[S, dim // 2]`` angles ``pos * theta^(-2i/dim)`` (float32)."""
    steps = torch.arange(0, dim, 2, device=positions.device)[: dim // 2].float()
    freqs = 1.0 / (theta ** (steps / dim))
    return torch.outer(positions.float(), freqs)


def rope_table(
    dims: tuple[int, int, int],
    frames: int,
    height: int,
    width: int,
    theta: float,
    start: int = 0,
    device: torch.device | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos, sin)`` ``[frames * height * width, sum(dims)]`` for tokens ``(t, h, w)``
    row-major with ``t`` in ``start .. start + frames - 1``; each angle repeated for its pair.
    Made on ``device`` (no copy from the host per forward)."""
    t = torch.arange(start, start + frames, device=device)
    hw = torch.arange(height, device=device), torch.arange(width, device=device)
    grid = torch.meshgrid(t, *hw, indexing="ij")
    angles = torch.cat(
        [axis_freqs(d, g.reshape(-1), theta) for d, g in zip(dims, grid, strict=True)], dim=1
    )
    return angles.cos().repeat_interleave(2, dim=1), angles.sin().repeat_interleave(2, dim=1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x`` ``[B, L, H, D]`` by the table ``[L, D]`` on interleaved pairs (float32)."""
    xf = x.float()
    pairs = xf.reshape(*xf.shape[:-1], -1, 2)
    rotated = torch.stack([-pairs[..., 1], pairs[..., 0]], dim=-1).flatten(-2)
    c, s = cos[None, :, None, :].to(x.device), sin[None, :, None, :].to(x.device)
    return (xf * c + rotated * s).type_as(x)


# --------------------------------------------------------------------------- PRoPE


def normalized_k(ks: torch.Tensor) -> torch.Tensor:
    """``K'``: the focal lengths of ``ks`` ``[..., 3, 3]``, principal point dropped."""
    out = torch.zeros_like(ks)
    out[..., 0, 0] = ks[..., 0, 0]
    out[..., 1, 1] = ks[..., 1, 1]
    out[..., 2, 2] = 1.0
    return out


def _lift(k: torch.Tensor) -> torch.Tensor:
    out = torch.zeros((*k.shape[:-2], 4, 4), dtype=k.dtype, device=k.device)
    out[..., :3, :3] = k
    out[..., 3, 3] = 1.0
    return out


def _invert_k(k: torch.Tensor) -> torch.Tensor:
    """Inverse of an intrinsics matrix without skew."""
    out = torch.zeros_like(k)
    out[..., 0, 0] = 1.0 / k[..., 0, 0]
    out[..., 1, 1] = 1.0 / k[..., 1, 1]
    out[..., 0, 2] = -k[..., 0, 2] / k[..., 0, 0]
    out[..., 1, 2] = -k[..., 1, 2] / k[..., 1, 1]
    out[..., 2, 2] = 1.0
    return out


def _invert_se3(m: torch.Tensor) -> torch.Tensor:
    """Inverse of a rigid 4x4 transform: ``[R^T, -R^T t]``."""
    r_inv = m[..., :3, :3].transpose(-1, -2)
    out = torch.zeros_like(m)
    out[..., :3, :3] = r_inv
    out[..., :3, 3] = -torch.einsum("...ij,...j->...i", r_inv, m[..., :3, 3])
    out[..., 3, 3] = 1.0
    return out


def prope_matrices(
    viewmats: torch.Tensor, ks: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(P^T, P^-1, P)`` ``[B, L, 4, 4]`` for per-token cameras ``viewmats`` (w2c) and ``ks``."""
    kn = normalized_k(ks)
    p = torch.einsum("...ij,...jk->...ik", _lift(kn), viewmats)
    p_inv = torch.einsum("...ij,...jk->...ik", _invert_se3(viewmats), _lift(_invert_k(kn)))
    return p.transpose(-1, -2), p_inv, p


def apply_tiles(x: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """``m @ tile`` for each 4-channel tile of ``x`` ``[B, H, L, D]``; ``m``: ``[B, L, 4, 4]``."""
    b, h, length, d = x.shape
    tiles = x.reshape(b, h, length, d // 4, 4)
    out = torch.einsum("blij,bhlkj->bhlki", m.to(x.dtype), tiles)
    return out.reshape(x.shape)
