"""Which clean latents form each chunk's memory: HY-WorldPlay's retrieval, seeded.

Port, from reading, of Tencent-Hunyuan/HY-WorldPlay@da2d0c2 ``hyvideo/utils/retrieval_context.py``
(``generate_points_in_sphere``, ``calculate_fov_overlap_similarity``,
``select_aligned_memory_frames``) as ``_ar_rollout_inner`` calls it (``memory_frames=20,
temporal_context_size=12, pred_latent_size=4``, then the current chunk's latents removed):

- chunk ``c`` (first latent ``n = 4c``) with ``n <= 20``: every earlier latent;
- otherwise the last 12 latents, latents 0-3, and then 4-latent clips starting at ``4, 8, ...,
  < n - 12``, nearest first, until 8 non-temporal latents are chosen (so one clip: at most 20
  memory latents). A clip's distance to the chunk is ``1 - overlap`` averaged over the clip's
  latents +0 and +2 and the chunk's 4 latents (fewer at the end of the video); ties keep the
  earlier clip (a stable sort);
- overlap of a history camera with the current one: a Monte-Carlo estimate over points in an
  8 m ball around the current camera, ``|in both views| / |in the current view|`` (0 when the
  current view holds none), a view being +/-30 deg in azimuth and +/-17.5 deg in elevation
  around the camera's forward axis, measured in the current camera's frame, and the history
  camera's view also limited to points within 8 m of it.

Upstream draws the 50,000 points once per video from torch's unseeded global generator, so its
memory differs from run to run. Here they come from a generator seeded by the trajectory
(:func:`points_seed`), and the index lists are computed once per (case, trajectory) and kept
in the run's manifest (``case.plan``): the reference and every quantized variant read the same
latents. The geometry is float64 (as upstream: its cameras are float64 numpy arrays), the
points float32 (as ``torch.rand`` draws them).
"""

from __future__ import annotations

import math

import torch

from jbkv_cli.models.seeding import derive_seed

NUM_POINTS = 50_000
RADIUS = 8.0
FOV_H_DEG = 60.0
FOV_V_DEG = 35.0
MAX_DISTANCE = 8.0
CLIP = 4


def points_seed(digest: str) -> int:
    """The point cloud's seed for a trajectory of camera digest ``digest``."""
    return derive_seed(0, f"hy-worldplay memory points\0{digest}")


def sample_points(seed: int, n: int = NUM_POINTS, radius: float = RADIUS) -> torch.Tensor:
    """``[n, 3]`` float32 points uniform in a ball: radius ``R u^(1/3)``, azimuth ``2 pi v``,
    polar angle ``acos(1 - 2 w)`` with ``u, v, w`` drawn in that order (upstream's order)."""
    g = torch.Generator().manual_seed(seed)
    u, v, w = (torch.rand(n, generator=g) for _ in range(3))
    r = radius * torch.pow(u, 1 / 3)
    phi = 2 * math.pi * v
    theta = torch.acos(1 - 2 * w)
    x = r * torch.sin(theta) * torch.cos(phi)
    y = r * torch.sin(theta) * torch.sin(phi)
    z = r * torch.cos(theta)
    return torch.stack((x, y, z), dim=1)


def _pitch_yaw(r_w2c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pitch and yaw (degrees) of the camera's forward axis (``R^T e_z``)."""
    fwd = r_w2c.T[:, 2]
    x, y, z = fwd[0], fwd[1], fwd[2]
    yaw = torch.atan2(x, z) * (180.0 / math.pi)
    pitch = torch.atan2(y, torch.sqrt(x**2 + z**2)) * (180.0 / math.pi)
    return pitch, yaw


def _in_view(points, center, pitch, yaw) -> torch.Tensor:
    vec = points - center
    azimuth = torch.atan2(vec[:, 0], vec[:, 2]) * (180 / math.pi)
    elevation = torch.atan2(vec[:, 1], torch.sqrt(vec[:, 0] ** 2 + vec[:, 2] ** 2)) * (
        180 / math.pi
    )
    d_az = torch.remainder(azimuth - yaw + 180, 360) - 180
    d_el = torch.remainder(elevation - pitch + 180, 360) - 180
    return (d_az.abs() < FOV_H_DEG / 2) & (d_el.abs() < FOV_V_DEG / 2)


def fov_overlap(w2c_curr: torch.Tensor, w2c_hist: torch.Tensor, points: torch.Tensor) -> float:
    """Share of the current view's points also in the history camera's view (both float64
    4x4 world-to-camera; ``points`` around the current camera). Both cameras are first moved
    into the current camera's frame as upstream computes it (``inv(w2c_curr @ c2w)``)."""
    inv = torch.linalg.inv
    curr = inv(w2c_curr @ inv(w2c_curr))  # the identity, up to rounding
    hist = inv(w2c_curr @ inv(w2c_hist))
    r_c, r_h = curr[:3, :3], hist[:3, :3]
    center_c, center_h = -r_c.T @ curr[:3, 3], -r_h.T @ hist[:3, 3]
    world = points + center_c  # float32 points, float64 sum
    in_curr = _in_view(world, center_c, *_pitch_yaw(r_c))
    in_hist = _in_view(world, center_h, *_pitch_yaw(r_h))
    in_hist &= torch.linalg.norm(world - center_h, dim=1) < MAX_DISTANCE
    seen = int(in_curr.sum())
    return 0.0 if seen == 0 else float((in_curr & in_hist).sum()) / seen


def select_memory(
    w2c: torch.Tensor,
    start: int,
    points: torch.Tensor,
    memory_frames: int = 20,
    temporal_context: int = 12,
    pred: int = CLIP,
) -> list[int]:
    """``select_aligned_memory_frames`` for the chunk starting at latent ``start``."""
    if start <= memory_frames:
        return list(range(start))
    total = w2c.shape[0]
    if start >= total or start < 3:
        raise ValueError(f"latent {start} is outside the trajectory of {total} latents")
    context = list(range(max(0, start - temporal_context), start))
    queries = list(range(start, min(start + pred, total)))
    distances = []
    for hist in range(CLIP, start - temporal_context, CLIP):
        total_dist = 0.0
        for q in queries:
            d1 = 1.0 - fov_overlap(w2c[q], w2c[hist], points)
            d2 = 1.0 - fov_overlap(w2c[q], w2c[hist + 2], points)
            total_dist += (d1 + d2) / 2.0
        distances.append((hist, total_dist / len(queries)))
    distances.sort(key=lambda item: item[1])
    chosen = list(range(CLIP))
    budget = memory_frames - temporal_context
    for hist, _ in distances:
        if len(chosen) >= budget:
            break
        if hist not in chosen:
            chosen.extend(range(hist, hist + CLIP))
    return sorted(set(context) | set(chosen))


def memory_plan(
    w2c: torch.Tensor,
    points: torch.Tensor,
    chunk: int = CLIP,
    memory_frames: int = 20,
    temporal_context: int = 12,
) -> list[list[int]]:
    """The memory latents of every chunk (chunk 0: none), the current chunk's left out."""
    chunks = w2c.shape[0] // chunk
    plan: list[list[int]] = [[]]
    for c in range(1, chunks):
        start = c * chunk
        chosen: set[int] = set()
        for s in range(start, start + chunk, CLIP):
            chosen |= set(select_memory(w2c, s, points, memory_frames, temporal_context))
        current = set(range(start, start + chunk))
        plan.append(sorted(chosen - current))
    return plan
