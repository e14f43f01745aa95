"""The signed correction on keys cached before RoPE (merge of issue 24 with the pre-RoPE
layout): its variance term takes the same pair terms as taylor's, with ``w`` in place of ``Δ²``."""

from __future__ import annotations

import math

import pytest
import torch

from jbkv_cli.attention import attend
from jbkv_cli.attention.attend import CachedKV
from jbkv_cli.attention.rope import KeyRotation, pair_channels, rotate_pairs

D, LK, LQ, TAU = 16, 12, 5, 0.25


def _rotation(pairs: str) -> KeyRotation:
    theta = torch.rand(LK, D // 2, generator=torch.Generator().manual_seed(0)) * 2 * math.pi
    return KeyRotation(theta.cos(), theta.sin(), pairs)


def _dense(q: torch.Tensor, w: torch.Tensor, rot: KeyRotation) -> torch.Tensor:
    """``(τ²/24) Σ_c (R_iᵀ q)_c² w_ic`` by rotating ``q`` back per key (float64)."""
    c0, c1 = pair_channels(D, rot.pairs)
    cos, sin = torch.empty(LK, D), torch.empty(LK, D)
    cos[:, c0], cos[:, c1], sin[:, c0], sin[:, c1] = rot.cos, rot.cos, rot.sin, rot.sin
    u = rotate_pairs(q.double().unsqueeze(-2), cos.double(), -sin.double(), rot.pairs)
    wc = w.double().repeat_interleave(D // w.shape[-1], dim=-1).unsqueeze(-3)
    return (TAU**2 / 24) * (u.square() * wc).sum(-1)


def _case(groups: int):
    g = torch.Generator().manual_seed(7)
    q = 2 * torch.randn(1, 2, LQ, D, generator=g)
    k, v = torch.randn(1, 2, LK, D, generator=g), torch.randn(1, 2, LK, D, generator=g)
    kc, vc = torch.randn(1, 2, 3, D, generator=g), torch.randn(1, 2, 3, D, generator=g)
    step = 0.2 + torch.rand(1, 2, LK, groups, generator=g)
    return q, k, v, kc, vc, step


@pytest.mark.parametrize(
    ("pairs", "groups"), [("interleaved", D), ("half", 4), ("interleaved", 2), ("half", 1)]
)
def test_signed_on_additive_pre_rope_keys_is_taylor(pairs, groups):
    """``w = Δ²``: signed equals taylor on every backend, pair terms included."""
    q, k, v, kc, vc, step = _case(groups)
    rot = _rotation(pairs)
    cached = CachedKV(k, v, step, key_rotation=rot, k_step2=step.square())
    for backend in ("fused", "flex", "reference"):
        want = attend(q, kc, vc, cached, scale=TAU, correction="taylor", backend=backend)
        got = attend(q, kc, vc, cached, scale=TAU, correction="signed", backend=backend)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("pairs", "groups"), [("interleaved", D), ("half", 4)])
def test_signed_pair_terms_follow_a_negative_variance(pairs, groups):
    """Centroid-type ``w < 0`` on groups that split RoPE pairs: the bias added is the dense
    reference's with ``w``, so the correction raises the cached scores."""
    q, k, v, kc, vc, step = _case(groups)
    rot = _rotation(pairs)
    w = -0.5 * step.square()
    cached = CachedKV(k, v, step, key_rotation=rot, k_step2=w)
    bias = _dense(q, w, rot).float()
    assert float(bias.max()) < 0
    mask = torch.nn.functional.pad(-bias, (0, 3))
    keys, values = torch.cat([k, kc], -2), torch.cat([v, vc], -2)
    want = torch.nn.functional.scaled_dot_product_attention(q, keys, values, mask, scale=TAU)
    for backend in ("fused", "flex", "reference"):
        got = attend(q, kc, vc, cached, scale=TAU, correction="signed", backend=backend)
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
