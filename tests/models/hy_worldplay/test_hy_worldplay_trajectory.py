"""Pose strings and pose JSON -> cameras, normalized intrinsics and action labels, held to an
independent statement of upstream's rules (Tencent-Hunyuan/HY-WorldPlay@da2d0c2
hyvideo/generate.py: parse_pose_string, pose_to_input; generate_custom_trajectory.py)."""

import json
import math

import numpy as np
import pytest
import torch

from jbkv_cli.models.hy_worldplay.trajectory import euler_xyz_deg, load_trajectory
from jbkv_cli.utils.errors import UsageError

FX = 969.6969696969696  # upstream's default intrinsics: fx = fy, cx = 960, cy = 540
K_NORM = np.array([[FX / 1920, 0, 0.5], [0, FX / 1080, 0.5], [0, 0, 1]])


def c2w(trans=(0.0, 0.0, 0.0), pitch_deg=0.0, yaw_deg=0.0):
    """A camera-to-world pose: yaw about y, then pitch about x, in the camera's frame."""
    a, b = math.radians(yaw_deg), math.radians(pitch_deg)
    ry = np.array([[math.cos(a), 0, math.sin(a)], [0, 1, 0], [-math.sin(a), 0, math.cos(a)]])
    rx = np.array([[1, 0, 0], [0, math.cos(b), -math.sin(b)], [0, math.sin(b), math.cos(b)]])
    m = np.eye(4)
    m[:3, :3] = ry @ rx
    m[:3, 3] = trans
    return m


def test_hy_worldplay_pose_w63_is_64_latents_straight_ahead():
    """``w-63``: 64 latents, camera i at z = 0.08 i, label 0 then 9 (forward, no rotation)."""
    traj = load_trajectory("w-63", 64)
    assert traj.latents == 64 and 4 * traj.latents - 3 == 253
    expected = np.array([np.linalg.inv(c2w((0, 0, 0.08 * i))) for i in range(64)])
    assert np.allclose(traj.w2c.numpy(), expected, atol=1e-12)
    assert np.allclose(traj.intrinsics.numpy(), np.broadcast_to(K_NORM, (64, 3, 3)))
    assert traj.actions.tolist() == [0] + [9] * 63


def test_hy_worldplay_pose_every_action():
    """``w-8,s-8,a-8,d-8,up-8,down-8``: labels translation*9 + rotation with translation
    forward 1, backward 2, right 3, left 4 and rotation up 3, down 4 (49 latents)."""
    traj = load_trajectory("w-8,s-8,a-8,d-8,up-8,down-8")
    assert traj.latents == 49
    labels = [0] + [1 * 9] * 8 + [2 * 9] * 8 + [4 * 9] * 8 + [3 * 9] * 8 + [3] * 8 + [4] * 8
    assert traj.actions.tolist() == labels
    positions = [0.08 * i for i in range(9)] + [0.64 - 0.08 * i for i in range(1, 9)]
    poses = [c2w((0, 0, z)) for z in positions]
    poses += [c2w((-0.08 * i, 0, 0)) for i in range(1, 9)]
    poses += [c2w((-0.64 + 0.08 * i, 0, 0)) for i in range(1, 9)]
    poses += [c2w(pitch_deg=3.0 * i) for i in range(1, 9)]
    poses += [c2w(pitch_deg=24.0 - 3.0 * i) for i in range(1, 9)]
    assert np.allclose(traj.w2c.numpy(), np.linalg.inv(np.array(poses)), atol=1e-12)


def test_hy_worldplay_pose_yaw_and_fractional_durations():
    """``right`` yaws by +3 deg a latent (label 1); a fractional duration is truncated, so
    ``right-0.5`` adds no latent (upstream's ``int(float(d))``)."""
    traj = load_trajectory("w-3, right-1, right-0.5, d-4")
    assert traj.actions.tolist() == [0, 9, 9, 9, 1, 27, 27, 27, 27]
    assert np.allclose(np.linalg.inv(traj.w2c[4].numpy())[:3, :3], c2w(yaw_deg=3.0)[:3, :3])


def test_hy_worldplay_pose_json(tmp_path):
    """A per-latent camera JSON: w2c = inv(c2w), intrinsics fx/(2cx), fy/(2cy), c = 0.5, and
    labels from each step's motion in the previous camera's frame: right (3 * 9), a 5 deg yaw
    left (2), forward and right at 45 deg (both: class 5 -> 45), a pitch down (4), a step
    below the 1e-4 threshold (0)."""
    poses = [
        c2w(),
        c2w((0.1, 0, 0)),
        c2w((0.1, 0, 0), yaw_deg=-5.0),
        None,
        None,
        None,
    ]
    d = np.array([1.0, 0.0, 1.0]) / math.sqrt(2)
    poses[3] = poses[2].copy()
    poses[3][:3, 3] += poses[2][:3, :3] @ (0.2 * d)
    poses[4] = poses[3] @ c2w(pitch_deg=-5.0)
    poses[5] = poses[4] @ c2w((0, 0, 5e-5))
    k = [[500.0, 0, 400.0], [0, 450.0, 300.0], [0, 0, 1]]
    path = tmp_path / "poses.json"
    path.write_text(
        json.dumps({str(i): {"extrinsic": p.tolist(), "K": k} for i, p in enumerate(poses)})
    )
    traj = load_trajectory(str(path), 6)
    assert traj.actions.tolist() == [0, 27, 2, 45, 4, 0]
    assert np.allclose(traj.w2c.numpy(), np.linalg.inv(np.array(poses)))
    assert np.allclose(
        traj.intrinsics[0].numpy(), [[500 / 800, 0, 0.5], [0, 450 / 600, 0.5], [0, 0, 1]]
    )


def test_hy_worldplay_euler_angles_are_scipys_xyz():
    rotation = pytest.importorskip("scipy.spatial.transform").Rotation
    for r in rotation.random(50, random_state=0).as_matrix():
        assert np.allclose(euler_xyz_deg(r), rotation.from_matrix(r).as_euler("xyz", degrees=True))


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("w3", "action-duration"),
        ("jump-3", "unknown action 'jump'"),
        ("w-x", "bad duration"),
        ("w-1-2", "action-duration"),
        ("w-inf", "bad duration"),
    ],
)
def test_hy_worldplay_bad_pose_strings_are_usage_errors(spec, needle):
    with pytest.raises(UsageError, match=needle):
        load_trajectory(spec)


def test_hy_worldplay_trajectory_length_must_be_the_latent_count(tmp_path):
    with pytest.raises(UsageError, match=r"has 32 latents \(125 frames\); this run makes 64"):
        load_trajectory("w-31", 64)
    bad = tmp_path / "bad.json"
    bad.write_text('{"0": {"extrinsic": [[1, 0], [0, 1]], "K": []}}')
    with pytest.raises(UsageError, match="needs 'extrinsic'"):
        load_trajectory(str(bad))
    with pytest.raises(UsageError, match="cannot read pose JSON"):
        load_trajectory(str(tmp_path / "missing.json"))
    assert torch.is_tensor(load_trajectory("w-3").actions)
