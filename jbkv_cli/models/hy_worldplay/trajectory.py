"""Camera trajectories of HY-WorldPlay cases -> cameras, normalized intrinsics, action labels.

Port, from reading, of Tencent-Hunyuan/HY-WorldPlay@da2d0c2 ``hyvideo/generate.py``
(``parse_pose_string``, ``pose_string_to_json``, ``pose_to_input``, ``one_hot_to_one_dimension``)
and ``hyvideo/generate_custom_trajectory.py`` (``generate_camera_trajectory_local``):

- A pose string is comma-separated ``action-duration`` commands; ``duration`` is read as a
  number and truncated to whole latents (``right-0.5`` adds none, as upstream). Per latent:
  ``w``/``s`` move 0.08 forward/back along the camera's z, ``a``/``d`` 0.08 left/right along
  its x, ``up``/``down`` pitch by +/-3 deg (a rotation about x), ``left``/``right`` yaw by
  -/+3 deg (about y); rotations apply before translations, all in the camera's own frame. The
  trajectory starts at the identity, so ``n`` commands' latents give ``1 + n`` poses
  (``w-63``: 64 latents = 253 frames). The intrinsics are upstream's default
  ``fx = fy = 969.697, cx = 960, cy = 540``.
- A pose JSON is ``{"0": {"extrinsic": 4x4 camera-to-world, "K": 3x3}, ...}``, one entry per
  latent, read in file order.
- ``w2c = inv(c2w)``; intrinsics become ``fx / (2 cx)``, ``fy / (2 cy)``, ``cx = cy = 0.5``.
- Action label of latent ``i > 0`` from ``rel = inv(c2w[i-1]) c2w[i]`` (latent 0: label 0):
  translation ``t = rel[:3, 3]``, if ``|t| > 1e-4``, with angles ``a_j = arccos(t_j / |t|)``:
  forward if ``a_z < 60``, backward if ``a_z > 120``; right if ``a_x < 60``, left if
  ``a_x > 120``. Rotation: ``(rx, ry, rz)`` = extrinsic-xyz Euler angles of ``rel[:3, :3]``
  (scipy's ``as_euler("xyz")``): right if ``ry > 0.05`` deg, left if ``ry < -0.05``; up if
  ``rx > 0.05``, down if ``rx < -0.05``. Each of the two 4-way one-hots maps to 0..8 (none 0,
  +a 1, -a 2, +b 3, -b 4, then the pairs (a, b) 5, (a, -b) 6, (-a, b) 7, (-a, -b) 8, with
  translation (a, b) = (forward, right) and rotation (a, b) = (right, up)); the label is
  ``translation * 9 + rotation`` (0..80).
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from jbkv_cli.utils.errors import JbkvError, UsageError, shown
from jbkv_cli.utils.jsonio import read_json

FORWARD_SPEED = 0.08
TURN_SPEED = math.radians(3.0)
DEFAULT_K = [[969.6969696969696, 0.0, 960.0], [0.0, 969.6969696969696, 540.0], [0.0, 0.0, 1.0]]
MOVE_EPS = 1e-4
ROT_EPS_DEG = 5e-2
COMMANDS = {  # action -> (motion, sign)
    "w": ("forward", 1.0),
    "s": ("forward", -1.0),
    "a": ("right", -1.0),
    "d": ("right", 1.0),
    "up": ("pitch", 1.0),
    "down": ("pitch", -1.0),
    "left": ("yaw", -1.0),
    "right": ("yaw", 1.0),
}
# upstream's ``mapping`` of 4-way one-hots (a, -a, b, -b) to labels 0..8
ONE_HOT_LABELS = {
    (0, 0, 0, 0): 0,
    (1, 0, 0, 0): 1,
    (0, 1, 0, 0): 2,
    (0, 0, 1, 0): 3,
    (0, 0, 0, 1): 4,
    (1, 0, 1, 0): 5,
    (1, 0, 0, 1): 6,
    (0, 1, 1, 0): 7,
    (0, 1, 0, 1): 8,
}
MAX_LATENTS = 4096


@dataclass(frozen=True)
class Trajectory:
    """Per latent frame: ``w2c`` ``[T, 4, 4]``, normalized ``intrinsics`` ``[T, 3, 3]`` (both
    float64) and ``actions`` ``[T]`` (int64, 0..80)."""

    w2c: torch.Tensor
    intrinsics: torch.Tensor
    actions: torch.Tensor

    @property
    def latents(self) -> int:
        return self.w2c.shape[0]


def is_json_path(spec: str) -> bool:
    """Upstream's rule: a trajectory ending in ``.json`` is a file."""
    return spec.strip().endswith(".json")


def parse_pose_string(text: str) -> list[dict[str, float]]:
    """One motion per latent from a pose string (module docstring); ``ValueError`` on a bad
    command."""
    motions: list[dict[str, float]] = []
    for raw in text.split(","):
        cmd = raw.strip()
        if not cmd:
            continue
        parts = cmd.split("-")
        if len(parts) != 2:
            raise ValueError(f"bad pose command {cmd!r}: use action-duration, e.g. w-31")
        action = parts[0].strip()
        try:
            duration = float(parts[1].strip())
        except ValueError:
            raise ValueError(f"bad duration in pose command {cmd!r}") from None
        if action not in COMMANDS:
            raise ValueError(
                f"unknown action {action!r} in pose command {cmd!r} "
                f"(actions: {', '.join(COMMANDS)})"
            )
        if not math.isfinite(duration) or duration < 0 or duration > MAX_LATENTS:
            raise ValueError(f"bad duration in pose command {cmd!r}: 0..{MAX_LATENTS} latents")
        motion, sign = COMMANDS[action]
        speed = FORWARD_SPEED if motion in ("forward", "right") else TURN_SPEED
        motions += [{motion: sign * speed} for _ in range(int(duration))]
    return motions


def _rot_x(a: float) -> np.ndarray:
    c, s = math.cos(a), math.sin(a)
    return np.array([[1, 0, 0], [0, c, -s], [0, s, c]])


def _rot_y(a: float) -> np.ndarray:
    c, s = math.cos(a), math.sin(a)
    return np.array([[c, 0, s], [0, 1, 0], [-s, 0, c]])


def camera_path(motions: list[dict[str, float]]) -> list[np.ndarray]:
    """Camera-to-world poses: the identity, then one per motion (yaw, pitch, then forward and
    right translations in the rotated camera frame)."""
    pose = np.eye(4)
    poses = [pose.copy()]
    for move in motions:
        if "yaw" in move:
            pose[:3, :3] = pose[:3, :3] @ _rot_y(move["yaw"])
        if "pitch" in move:
            pose[:3, :3] = pose[:3, :3] @ _rot_x(move["pitch"])
        for key, axis in (("forward", 2), ("right", 0)):
            amount = move.get(key, 0.0)
            if amount:
                local = np.zeros(3)
                local[axis] = amount
                pose[:3, 3] += pose[:3, :3] @ local
        poses.append(pose.copy())
    return poses


def pose_string_to_json(text: str) -> dict[str, dict[str, Any]]:
    """``{str(i): {"extrinsic": c2w, "K": DEFAULT_K}}`` for a pose string."""
    poses = camera_path(parse_pose_string(text))
    return {str(i): {"extrinsic": p.tolist(), "K": DEFAULT_K} for i, p in enumerate(poses)}


def read_pose_json(path: str | Path) -> dict[str, dict[str, Any]]:
    """A pose JSON file, its shape checked; ``ValueError`` naming the problem."""
    try:
        data = read_json(path, "pose JSON")
    except JbkvError as exc:
        raise ValueError(str(exc)) from None
    if not isinstance(data, dict) or not data:
        raise ValueError(f"pose JSON {path} is not an object of per-latent poses")
    if len(data) > MAX_LATENTS:
        raise ValueError(f"pose JSON {path} has {len(data)} poses; at most {MAX_LATENTS}")
    for key, entry in data.items():
        ok = (
            isinstance(entry, dict)
            and _matrix(entry.get("extrinsic"), 4)
            and _matrix(entry.get("K"), 3)
        )
        if not ok:
            raise ValueError(
                f"pose JSON {path}: entry {shown(str(key), 20)} needs 'extrinsic' (4x4 numbers) "
                "and 'K' (3x3 numbers)"
            )
    return data


def _matrix(value: Any, n: int) -> bool:
    return (
        isinstance(value, list)
        and len(value) == n
        and all(
            isinstance(row, list)
            and len(row) == n
            and all(isinstance(x, int | float) and not isinstance(x, bool) for x in row)
            for row in value
        )
    )


def pose_json(spec: str) -> dict[str, dict[str, Any]]:
    """The per-latent poses of a trajectory (a pose string or a pose JSON path)."""
    return read_pose_json(spec.strip()) if is_json_path(spec) else pose_string_to_json(spec)


def euler_xyz_deg(r: np.ndarray) -> np.ndarray:
    """Extrinsic x-y-z Euler angles (degrees) of a rotation ``r = Rz(c) Ry(b) Rx(a)``:
    ``a = atan2(r21, r22)``, ``b = asin(-r20)``, ``c = atan2(r10, r00)`` (scipy's ``xyz``)."""
    b = math.asin(max(-1.0, min(1.0, -float(r[2, 0]))))
    a = math.atan2(float(r[2, 1]), float(r[2, 2]))
    c = math.atan2(float(r[1, 0]), float(r[0, 0]))
    return np.degrees([a, b, c])


def _label(one_hot: tuple[int, int, int, int]) -> int:
    return ONE_HOT_LABELS[one_hot]


def action_labels(c2w: np.ndarray) -> np.ndarray:
    """Per-latent labels 0..80 from camera-to-world poses ``[T, 4, 4]`` (module docstring)."""
    labels = np.zeros(len(c2w), dtype=np.int64)
    for i in range(1, len(c2w)):
        rel = np.linalg.inv(c2w[i - 1]) @ c2w[i]
        move = rel[:3, 3]
        norm = float(np.linalg.norm(move))
        trans = [0, 0, 0, 0]
        if norm > MOVE_EPS:
            angles = np.degrees(np.arccos(np.clip(move / norm, -1.0, 1.0)))
            if angles[2] < 60:
                trans[0] = 1
            elif angles[2] > 120:
                trans[1] = 1
            if angles[0] < 60:
                trans[2] = 1
            elif angles[0] > 120:
                trans[3] = 1
        rx, ry, _ = euler_xyz_deg(rel[:3, :3])
        rot = [int(ry > ROT_EPS_DEG), int(ry < -ROT_EPS_DEG), 0, 0]
        rot[2], rot[3] = int(rx > ROT_EPS_DEG), int(rx < -ROT_EPS_DEG)
        labels[i] = _label(tuple(trans)) * 9 + _label(tuple(rot))
    return labels


def pose_to_input(poses: dict[str, dict[str, Any]]) -> Trajectory:
    """Cameras, normalized intrinsics and action labels of per-latent ``poses`` (file order)."""
    entries = list(poses.values())
    c2w = np.array([np.array(e["extrinsic"], dtype=np.float64) for e in entries])
    try:
        w2c = np.linalg.inv(c2w)
    except np.linalg.LinAlgError:
        raise ValueError("a camera-to-world matrix of the trajectory is singular") from None
    ks = []
    for e in entries:
        k = np.array(e["K"], dtype=np.float64)
        if k[0, 2] == 0 or k[1, 2] == 0:
            raise ValueError("intrinsics need a non-zero principal point (fx / (2 cx))")
        k[0, 0] /= k[0, 2] * 2
        k[1, 1] /= k[1, 2] * 2
        k[0, 2] = k[1, 2] = 0.5
        ks.append(k)
    if not (np.isfinite(w2c).all() and np.isfinite(np.array(ks)).all()):
        raise ValueError("the trajectory's matrices are not finite")
    labels = action_labels(np.linalg.inv(w2c))
    return Trajectory(
        torch.from_numpy(w2c), torch.from_numpy(np.array(ks)), torch.from_numpy(labels)
    )


def load_trajectory(spec: str, latents: int | None = None) -> Trajectory:
    """The trajectory of ``spec``; a :class:`UsageError` for a bad one, or one whose latent
    count is not ``latents`` (upstream's ``pose_to_input`` assertion)."""
    try:
        traj = pose_to_input(pose_json(spec))
    except ValueError as exc:
        raise UsageError(f"trajectory {shown(spec)}: {exc}") from None
    if latents is not None and traj.latents != latents:
        raise UsageError(
            f"trajectory {shown(spec)} has {traj.latents} latents ({4 * traj.latents - 3} "
            f"frames); this run makes {latents} latents ({4 * latents - 3} frames)"
        )
    return traj


def trajectory_digest(traj: Trajectory) -> str:
    """SHA-256 of the cameras (float64 bytes): what the memory retrieval depends on."""
    return hashlib.sha256(traj.w2c.numpy().tobytes()).hexdigest()


def default_pose(latents: int) -> str:
    """``w-{latents - 1}``: straight forward for the whole video (the paper's 253 frames with
    64 latents = ``w-63``; the trajectory is not stated there)."""
    return f"w-{latents - 1}"


__all__ = [
    "Trajectory",
    "action_labels",
    "camera_path",
    "default_pose",
    "euler_xyz_deg",
    "load_trajectory",
    "parse_pose_string",
    "pose_json",
    "pose_to_input",
    "trajectory_digest",
]
