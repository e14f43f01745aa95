"""HY-WorldPlay's two position branches held to independent statements of upstream's rules.

RoPE (Tencent-Hunyuan/HY-WorldPlay@da2d0c2 ``posemb_layers.py``): channel pairs ``(2i, 2i+1)``
of the (t, h, w) segments (here the tiny (8, 12, 12); upstream's (16, 56, 56)) rotate by
``pos * theta^(-2i/d)``, written here as a complex multiplication token by token.
PRoPE (``prope/camera_rope.py``; Li et al., "Cameras as Relative Positional Encoding"): per
token ``P = diag(fx, fy, 1, 1) w2c`` (principal point dropped), scores ``q_i^T P_i P_j^-1 k_j``
per 4-channel tile and output ``P_i sum_j a_ij P_j^-1 v_j``, written here with
``torch.linalg.inv`` on each 4x4 matrix.
"""

import math

import torch
import torch.nn.functional as F

from jbkv_cli.models.hy_worldplay.rope import (
    apply_rope,
    apply_tiles,
    prope_matrices,
    rope_table,
)

DIMS = (8, 12, 12)
THETA = 256.0


def rope_reference(x: torch.Tensor, frames: int, h: int, w: int, start: int) -> torch.Tensor:
    """``x`` ``[L, D]`` (tokens t-major) rotated pair by pair as complex numbers."""
    out = torch.empty_like(x, dtype=torch.float64)
    tokens = [(t, i, j) for t in range(start, start + frames) for i in range(h) for j in range(w)]
    for n, pos in enumerate(tokens):
        offset = 0
        for axis, d in enumerate(DIMS):
            for p in range(d // 2):
                angle = pos[axis] * THETA ** (-2 * p / d)
                c = offset + 2 * p
                z = complex(x[n, c], x[n, c + 1]) * complex(math.cos(angle), math.sin(angle))
                out[n, c], out[n, c + 1] = z.real, z.imag
            offset += d
    return out


def test_hy_worldplay_rope_is_the_complex_rotation_of_each_axis():
    g = torch.Generator().manual_seed(0)
    frames, h, w, start = 3, 2, 3, 5
    x = torch.randn(frames * h * w, sum(DIMS), generator=g, dtype=torch.float64)
    cos, sin = rope_table(DIMS, frames, h, w, THETA, start=start)
    got = apply_rope(x[None, :, None, :], cos, sin)[0, :, 0]
    assert torch.allclose(got.double(), rope_reference(x, frames, h, w, start), atol=1e-6)


def test_hy_worldplay_rope_scores_depend_on_the_position_difference():
    """Temporal reframing is exact: memory at 0..M-1 and the chunk at M..M+3, or both shifted
    by 7, give the same scores."""
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 6 * 4, 2, sum(DIMS), generator=g)
    k = torch.randn(1, 6 * 4, 2, sum(DIMS), generator=g)

    def scores(start):
        cos, sin = rope_table(DIMS, 6, 2, 2, THETA, start=start)
        return torch.einsum("blhd,bmhd->bhlm", apply_rope(q, cos, sin), apply_rope(k, cos, sin))

    assert torch.allclose(scores(0), scores(7), atol=1e-4)
    assert not torch.allclose(scores(0)[..., :4, 4:8], scores(0)[..., :4, 8:12], atol=1e-2)


def cameras(n: int, seed: int):
    """Random rigid w2c ``[n, 4, 4]`` (float64) and intrinsics with a principal point."""
    g = torch.Generator().manual_seed(seed)
    q, _ = torch.linalg.qr(torch.randn(n, 3, 3, generator=g, dtype=torch.float64))
    q = q * torch.sign(torch.linalg.det(q))[:, None, None]
    w2c = torch.eye(4, dtype=torch.float64).repeat(n, 1, 1)
    w2c[:, :3, :3] = q
    w2c[:, :3, 3] = torch.randn(n, 3, generator=g, dtype=torch.float64)
    ks = torch.eye(3, dtype=torch.float64).repeat(n, 1, 1)
    ks[:, 0, 0] = 0.5 + torch.rand(n, generator=g, dtype=torch.float64)
    ks[:, 1, 1] = 0.5 + torch.rand(n, generator=g, dtype=torch.float64)
    ks[:, 0, 2] = ks[:, 1, 2] = 0.5
    return w2c, ks


def projective(w2c, ks):
    lift = torch.zeros_like(w2c)
    lift[:, 0, 0], lift[:, 1, 1], lift[:, 2, 2], lift[:, 3, 3] = ks[:, 0, 0], ks[:, 1, 1], 1, 1
    return lift @ w2c


def prope_reference(q, k, v, p):
    """The PRoPE branch's attention output ``[H, L, D]`` for per-token matrices ``p``."""
    heads, n, d = q.shape
    p_inv = torch.linalg.inv(p)
    out = torch.zeros_like(q)
    for h in range(heads):
        s = torch.zeros(n, n, dtype=q.dtype)
        for i in range(n):
            for j in range(n):
                rel = p[i] @ p_inv[j]
                s[i, j] = sum(q[h, i, t : t + 4] @ rel @ k[h, j, t : t + 4] for t in range(0, d, 4))
        a = torch.softmax(s / math.sqrt(d), dim=-1)
        for i in range(n):
            for t in range(0, d, 4):
                mixed = sum(a[i, j] * (p_inv[j] @ v[h, j, t : t + 4]) for j in range(n))
                out[h, i, t : t + 4] = p[i] @ mixed
    return out


def prope_branch(q, k, v, w2c, ks):
    p_t, p_inv, p = prope_matrices(w2c[None], ks[None])
    qp, kp, vp = apply_tiles(q[None], p_t), apply_tiles(k[None], p_inv), apply_tiles(v[None], p_inv)
    return apply_tiles(F.scaled_dot_product_attention(qp, kp, vp), p)[0]


def test_hy_worldplay_prope_matrices_are_lift_k_times_w2c_and_its_inverse():
    w2c, ks = cameras(6, 2)
    p_t, p_inv, p = prope_matrices(w2c, ks)
    assert torch.allclose(p, projective(w2c, ks), atol=1e-12)
    assert torch.allclose(p_t, p.transpose(-1, -2)) and torch.allclose(
        p_inv, torch.linalg.inv(p), atol=1e-10
    )
    moved = ks.clone()
    moved[:, 0, 2], moved[:, 1, 2] = 0.1, 0.9  # the principal point does not enter
    assert torch.allclose(prope_matrices(w2c, moved)[2], p)


def test_hy_worldplay_prope_attention_equals_the_relative_camera_statement():
    g = torch.Generator().manual_seed(3)
    n, d = 5, 8
    q, k, v = (torch.randn(2, n, d, generator=g, dtype=torch.float64) for _ in range(3))
    w2c, ks = cameras(n, 4)
    got = prope_branch(q, k, v, w2c, ks)
    assert torch.allclose(got, prope_reference(q, k, v, projective(w2c, ks)), atol=1e-9)


def test_hy_worldplay_prope_is_invariant_to_the_world_frame():
    """Only relative cameras enter: ``w2c -> w2c G`` for one rigid ``G`` leaves the output."""
    g = torch.Generator().manual_seed(5)
    n, d = 4, 8
    q, k, v = (torch.randn(1, n, d, generator=g, dtype=torch.float64) for _ in range(3))
    w2c, ks = cameras(n, 6)
    world, _ = cameras(1, 7)
    base = prope_branch(q, k, v, w2c, ks)
    assert torch.allclose(prope_branch(q, k, v, w2c @ world[0], ks), base, atol=1e-9)
    shifted = w2c.clone()
    shifted[0, :3, 3] += 1.0  # one camera moved relative to the others
    assert not torch.allclose(prope_branch(q, k, v, shifted, ks), base, atol=1e-3)
