"""Memory retrieval, held to an independent NumPy statement of upstream's rules
(Tencent-Hunyuan/HY-WorldPlay@da2d0c2 hyvideo/utils/retrieval_context.py, as
_ar_rollout_inner calls it), on w-63, w-8,s-8,a-8,d-8,up-8,down-8 and a JSON trajectory."""

import json
import math

import numpy as np
import pytest
import torch

from jbkv_cli.models.hy_worldplay import retrieval, trajectory


def reference_plan(w2c: np.ndarray, points: np.ndarray) -> list[list[int]]:
    """Upstream's rules, restated: chunk c (n = 4c) takes every earlier latent while n <= 20;
    else the last 12, latents 0-3 and the nearest 4-latent clip starting at 4, 8, ... < n - 12,
    its distance 1 - overlap averaged over clip latents +0, +2 and the 4 query latents. The
    overlap of camera H seen from camera C: points p around C (in C's frame) inside C's view
    (|azimuth| < 30, |elevation| < 17.5 deg about C's forward axis) that are also inside H's
    view (angles of p - centre(H) relative to H's forward axis, wrapped to +/-180) and within
    8 m of H, over those inside C's view."""

    def view(vec, fwd):
        az = np.degrees(np.arctan2(vec[:, 0], vec[:, 2]))
        el = np.degrees(np.arctan2(vec[:, 1], np.hypot(vec[:, 0], vec[:, 2])))
        yaw = np.degrees(np.arctan2(fwd[0], fwd[2]))
        pitch = np.degrees(np.arctan2(fwd[1], np.hypot(fwd[0], fwd[2])))
        d_az = (az - yaw + 180) % 360 - 180
        d_el = (el - pitch + 180) % 360 - 180
        return (np.abs(d_az) < 30) & (np.abs(d_el) < 17.5)

    pts = points.astype(np.float64)
    in_c = view(pts, np.array([0.0, 0.0, 1.0]))

    def overlap(c, h):
        rel = w2c[c] @ np.linalg.inv(w2c[h])  # H's camera-to-C's-frame
        centre, fwd = rel[:3, 3], rel[:3, :3] @ np.array([0.0, 0.0, 1.0])
        in_h = view(pts - centre, fwd) & (np.linalg.norm(pts - centre, axis=1) < 8.0)
        seen = in_c.sum()
        return 0.0 if seen == 0 else (in_c & in_h).sum() / seen

    total = len(w2c)
    plan = [[]]
    for c in range(1, total // 4):
        n = 4 * c
        if n <= 20:
            plan.append(list(range(n)))
            continue
        queries = range(n, min(n + 4, total))
        dist = []
        for h in range(4, n - 12, 4):
            d = sum(((1 - overlap(q, h)) + (1 - overlap(q, h + 2))) / 2 for q in queries)
            dist.append((d / len(queries), h))
        best = min(dist)[1]  # ties: the earlier clip
        chosen = set(range(n - 12, n)) | {0, 1, 2, 3} | set(range(best, best + 4))
        plan.append(sorted(chosen))
    return plan


def check(traj):
    seed = retrieval.points_seed(trajectory.trajectory_digest(traj))
    points = retrieval.sample_points(seed)
    plan = retrieval.memory_plan(traj.w2c, points)
    assert plan == reference_plan(traj.w2c.numpy(), points.numpy())
    assert all(len(p) <= 20 for p in plan)
    assert retrieval.memory_plan(traj.w2c, retrieval.sample_points(seed)) == plan  # seeded
    return plan


@pytest.mark.slow  # end to end
def test_hy_worldplay_retrieval_w63():
    plan = check(trajectory.load_trajectory("w-63", 64))
    assert len(plan) == 16 and plan[5] == list(range(20))
    assert plan[15][:4] == [0, 1, 2, 3] and plan[15][-12:] == list(range(48, 60))


def test_hy_worldplay_retrieval_every_action():
    check(trajectory.load_trajectory("w-8,s-8,a-8,d-8,up-8,down-8"))


def test_hy_worldplay_retrieval_json_trajectory(tmp_path):
    """A camera that walks out and turns back: the clip it looks at again is retrieved."""
    poses = {}
    for i in range(40):
        yaw = math.radians(min(i, 20) * 9.0)
        m = np.eye(4)
        m[:3, :3] = [
            [math.cos(yaw), 0, math.sin(yaw)],
            [0, 1, 0],
            [-math.sin(yaw), 0, math.cos(yaw)],
        ]
        m[:3, 3] = [0.0, 0.0, 0.1 * min(i, 10)]
        poses[str(i)] = {"extrinsic": m.tolist(), "K": trajectory.DEFAULT_K}
    path = tmp_path / "turn.json"
    path.write_text(json.dumps(poses))
    plan = check(trajectory.load_trajectory(str(path), 40))
    assert plan[9] != sorted(set(range(24, 36)) | {0, 1, 2, 3, 4, 5, 6, 7})  # not the first clip


def test_hy_worldplay_points_are_seeded_and_in_the_ball():
    a, b = retrieval.sample_points(7), retrieval.sample_points(7)
    assert torch.equal(a, b) and a.shape == (50_000, 3) and a.dtype == torch.float32
    assert float(a.norm(dim=1).max()) <= 8.0 and not torch.equal(a, retrieval.sample_points(8))
