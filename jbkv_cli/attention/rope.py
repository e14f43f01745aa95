"""Keys cached *before* RoPE: rotation on read, and what it does to the Jensen-bias correction.

A pre-RoPE cache stores ``k`` un-rotated, quantized as ``k̂ = k + ε`` (``ε_c ~ U[−Δ_c/2,
Δ_c/2]`` per channel, independent), and rotates on read at the key's position: attention sees
``R_i k̂ = R_i k + R_i ε``. ``R_i`` rotates channel pairs ``p = (c₀, c₁)`` by the angle ``θ_ip``
of key ``i``, ``(x₀, x₁) ↦ (x₀ cos θ − x₁ sin θ, x₀ sin θ + x₁ cos θ)``. Two pair layouts:

- ``interleaved``: pairs ``(2p, 2p+1)`` (Wan, diffusers' ``WanRotaryPosEmbed``);
- ``half``: pairs ``(p, p + D/2)`` ("rotate half", jbkv's embedded model).

**The score noise.** ``q·R_i ε = (R_iᵀ q)·ε = u_i·ε`` with ``u_i = R_iᵀ q``, per pair::

    u₀ = q₀ cos θ + q₁ sin θ,   u₁ = −q₀ sin θ + q₁ cos θ,   u₀² + u₁² = q₀² + q₁² = r².

So the exact bias is ``b_i = Σ_c log sinhc(τ u_ic Δ_ic / 2)`` (:func:`rope_exact_bias`): it
depends on the key's angle, not only on ``r``. The Taylor bias is ``(τ²/24) Σ_c u_ic² Δ_ic²``;
per pair, with ``Δ₀, Δ₁`` the steps of the pair's two channels::

    u₀² Δ₀² + u₁² Δ₁² = S r² + T (u₀² − u₁²),          S = (Δ₀² + Δ₁²)/2,  T = (Δ₀² − Δ₁²)/2
    u₀² − u₁² = (q₀² − q₁²) cos 2θ + 2 q₀ q₁ sin 2θ

(expand ``(q₀ c + q₁ s)² − (q₁ c − q₀ s)²``). Hence

    b_i = (τ²/24) Σ_p [ S_ip r_p² + T_ip ((q₀² − q₁²)_p cos 2θ_ip + (2 q₀ q₁)_p sin 2θ_ip) ]

(:func:`rope_taylor_bias`), bilinear in query features ``(r², q₀² − q₁², 2 q₀ q₁)`` and key
features ``(S, T cos 2θ, T sin 2θ)``.

- **Per-token groups made of whole pairs** (both channels of every pair in one group, as QVG's
  and RTN's blocks under Wan's interleaved pairs, or any group under ``half`` with one group):
  ``Δ₀ = Δ₁``, so ``T = 0`` and ``b_i = (τ²/24) Σ_j Δ_ij² ‖q_j‖²`` — the post-RoPE Taylor term,
  unchanged (:func:`whole_pairs`): ``R_i`` keeps every group's norm, ``‖(R_iᵀ q)_j‖ = ‖q_j‖``.
- **Per-channel steps** (KIVI-style keys, ``G = D``) or groups that split a pair (``half``
  with ``G > 1``): ``T ≠ 0`` and the pair terms are needed.

The exact form needs ``u`` per (query, key), ``O(Lq·Lk·D)``, in every case.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch

from jbkv_cli.attention.correction import (
    NO_NOISE_VAR,
    _expand_kv_heads,
    log_sinhc,
    taylor_bias,
    variance_bias,
)
from jbkv_cli.utils.host_reads import device_constant

Pairs = Literal["interleaved", "half"]
PAIRS: tuple[str, ...] = ("interleaved", "half")


def pair_channels(
    dim: int, pairs: str, device: torch.device | str = "cpu", group: int = 1
) -> tuple[torch.Tensor, torch.Tensor]:
    """The channels ``(c₀, c₁)`` of each of the ``D/2`` RoPE pairs (int64 ``[D/2]`` each), or
    with ``group`` the index ``c // group`` of their step groups; on ``device`` (made once per
    device and kept off the CPU: :func:`~jbkv_cli.utils.host_reads.device_constant`)."""
    if pairs not in PAIRS:
        raise ValueError(f"pairs must be one of {PAIRS}, got {pairs!r}")
    if dim % 2:
        raise ValueError(f"RoPE needs an even head dim, got {dim}")

    def make() -> torch.Tensor:
        p = torch.arange(dim // 2)
        c = torch.stack((2 * p, 2 * p + 1) if pairs == "interleaved" else (p, p + dim // 2))
        return c // group

    c0, c1 = device_constant(("rope-pairs", dim, pairs, group), make, device)
    return c0, c1


def pair_table(table: torch.Tensor, pairs: str) -> torch.Tensor:
    """A per-channel RoPE table ``[..., D]`` (each angle's cos or sin on both channels of its
    pair) as one value per pair ``[..., D/2]``."""
    return table[..., 0::2] if pairs == "interleaved" else table[..., : table.shape[-1] // 2]


def rotate_pairs(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, pairs: str) -> torch.Tensor:
    """``R x``: rotate each pair of ``x [..., L, D]`` by the angles whose per-channel tables are
    ``cos``, ``sin`` ``[L, D]`` (``x cos + rot(x) sin``, ``rot(x)`` the pair's ``(−x₁, x₀)``).
    Computed in the tables' dtype, returned in ``x``'s (as the models' own RoPE does)."""
    xt = x.to(cos.dtype)
    if pairs == "interleaved":
        rotated = torch.stack((-xt[..., 1::2], xt[..., 0::2]), dim=-1).flatten(-2)
    elif pairs == "half":
        x1, x2 = xt.chunk(2, -1)
        rotated = torch.cat((-x2, x1), -1)
    else:
        raise ValueError(f"pairs must be one of {PAIRS}, got {pairs!r}")
    return (xt * cos + rotated * sin).to(x.dtype)


@dataclass(frozen=True)
class KeyRotation:
    """The rotation every cached key got on read: ``cos``, ``sin`` ``[Lc, D/2]`` (float32) of its
    pair angles, and the ``pairs`` layout. Carried by a :class:`~jbkv_cli.attention.CachedKV`
    read from a pre-RoPE cache, for the correction's noise model."""

    cos: torch.Tensor
    sin: torch.Tensor
    pairs: str

    @property
    def num_tokens(self) -> int:
        return self.cos.shape[-2]


def whole_pairs(groups: int, dim: int, pairs: str) -> bool:
    """Whether per-token steps in ``groups`` groups of ``D/groups`` consecutive channels keep
    both channels of every RoPE pair in one group (then the Taylor term is the post-RoPE one)."""
    size = dim // groups
    return size % 2 == 0 if pairs == "interleaved" else groups == 1


def needs_pair_terms(step: torch.Tensor, dim: int, rot: KeyRotation | None, form: str) -> bool:
    """Whether the bias of steps ``[..., Lk, G]`` under ``rot`` differs from the post-RoPE one:
    always for the exact form, for Taylor unless the groups are made of whole pairs."""
    if rot is None or form == "none":
        return False
    return form == "exact" or not whole_pairs(step.shape[-1], dim, rot.pairs)


def _pair_steps(step: torch.Tensor, dim: int, pairs: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Steps ``[..., Lk, G]`` per pair channel: ``(Δ₀, Δ₁)`` ``[..., Lk, D/2]`` (float32)."""
    s = step.float()
    g0, g1 = pair_channels(dim, pairs, s.device, group=dim // step.shape[-1])
    return s[..., g0], s[..., g1]


def _check(q: torch.Tensor, step: torch.Tensor, rot: KeyRotation) -> None:
    if q.shape[-1] % step.shape[-1]:
        raise ValueError(f"{step.shape[-1]} step groups do not divide the head dim {q.shape[-1]}")
    if rot.num_tokens != step.shape[-2] or rot.cos.shape[-1] * 2 != q.shape[-1]:
        raise ValueError(
            f"key rotation {tuple(rot.cos.shape)} does not fit {step.shape[-2]} cached keys of "
            f"head dim {q.shape[-1]}"
        )


def rope_taylor_bias(
    q: torch.Tensor,
    step: torch.Tensor,
    scale: float,
    rot: KeyRotation,
    step2: torch.Tensor | None = None,
) -> torch.Tensor:
    """The Taylor bias of pre-RoPE keys (module docstring, with the pair terms):
    ``q [..., Hq, Lq, D]``, ``step [..., Hkv, Lk, G]`` -> ``[..., Hq, Lq, Lk]``. ``step2``
    (same shape) replaces ``Δ²`` per group: the signed correction's ``w = 12 v``
    (:func:`~jbkv_cli.attention.correction.variance_bias`; the derivation holds for any
    per-channel noise variance, ``w`` may be negative)."""
    _check(q, step, rot)
    dim = q.shape[-1]
    sq = step.float().square() if step2 is None else step2.float()
    if whole_pairs(step.shape[-1], dim, rot.pairs):
        return variance_bias(q, sq, scale) if step2 is not None else taylor_bias(q, step, scale)
    c0, c1 = pair_channels(dim, rot.pairs, q.device)
    qf = q.float()
    q0, q1 = qf[..., c0], qf[..., c1]  # [..., Hq, Lq, P]
    d0, d1 = (_expand_kv_heads(d, q.shape[-3]) for d in _pair_steps(sq, dim, rot.pairs))
    s, t = 0.5 * (d0 + d1), 0.5 * (d0 - d1)  # [..., Hq, Lk, P]
    cos, sin = rot.cos.float().to(q.device), rot.sin.float().to(q.device)
    cos2, sin2 = cos.square() - sin.square(), 2.0 * sin * cos  # [Lk, P]
    out = (q0.square() + q1.square()) @ s.transpose(-1, -2)
    out += (q0.square() - q1.square()) @ (t * cos2).transpose(-1, -2)
    out += (2.0 * q0 * q1) @ (t * sin2).transpose(-1, -2)
    return (scale * scale / 24.0) * out


def rope_exact_bias(
    q: torch.Tensor,
    step: torch.Tensor,
    scale: float,
    rot: KeyRotation,
    max_elements: int = 1 << 24,
) -> torch.Tensor:
    """``b_i = Σ_c log sinhc(τ u_ic Δ_ic / 2)``, ``u_i = R_iᵀ q`` (module docstring), evaluated
    per (query, key, pair) in query blocks of at most ``max_elements`` elements:
    ``q [..., Hq, Lq, D]``, ``step [..., Hkv, Lk, G]`` -> ``[..., Hq, Lq, Lk]``."""
    _check(q, step, rot)
    dim = q.shape[-1]
    c0, c1 = pair_channels(dim, rot.pairs, q.device)
    qf = q.float()
    q0, q1 = qf[..., c0], qf[..., c1]  # [..., Hq, Lq, P]
    d0, d1 = (_expand_kv_heads(d, q.shape[-3]) for d in _pair_steps(step, dim, rot.pairs))
    d0, d1 = d0.unsqueeze(-3), d1.unsqueeze(-3)  # [..., Hq, 1, Lk, P]
    cos, sin = rot.cos.float().to(q.device), rot.sin.float().to(q.device)  # [Lk, P]
    lq, lk = q.shape[-2], step.shape[-2]
    heads = max(1, q[..., 0, 0].numel())
    block = max(1, min(lq, max_elements // max(1, heads * lk * dim)))
    out = []
    for start in range(0, lq, block):
        a = q0[..., start : start + block, :].unsqueeze(-2)  # [..., Hq, b, 1, P]
        b = q1[..., start : start + block, :].unsqueeze(-2)
        u0, u1 = a * cos + b * sin, b * cos - a * sin  # [..., Hq, b, Lk, P]
        half = 0.5 * scale
        out.append((log_sinhc(half * u0 * d0) + log_sinhc(half * u1 * d1)).sum(-1))
    return torch.cat(out, dim=-2)


def rope_bias(
    q: torch.Tensor,
    step: torch.Tensor,
    scale: float,
    form: str,
    rot: KeyRotation,
    step2: torch.Tensor | None = None,
) -> torch.Tensor:
    """The bias of pre-RoPE keys in ``form`` (``taylor``, ``exact``, ``variance``: the signed
    correction's, reading ``step2``; ``none``: zeros)."""
    if form == "taylor":
        return rope_taylor_bias(q, step, scale, rot)
    if form == "exact":
        return rope_exact_bias(q, step, scale, rot)
    if form == "variance":
        if step2 is None:
            raise ValueError(NO_NOISE_VAR)
        return rope_taylor_bias(q, step, scale, rot, step2)
    if form != "none":
        raise ValueError(f"form must be taylor, exact, variance or none, got {form!r}")
    return torch.zeros((*q.shape[:-1], step.shape[-2]), dtype=torch.float32, device=q.device)
