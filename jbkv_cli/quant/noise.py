"""Noise models: how a method's stored key ``k̂`` relates to the true key ``k``.

The ``signed`` correction (:mod:`jbkv_cli.attention.correction`, where the derivation is) reads
each stored key through one of two rules, as tensors the stored tensor gives next to its
``step`` (``[..., L, G]``, in the basis the method quantized in, in units of a uniform step², so
additive noise gives exactly ``Δ²``):

- the **excess rule**: ``excess_step2`` ``w = 12 s``, ``s = Var(k̂) − Var(k)`` per channel;
- the **unshrink rule**, through the linear model ``k̂ = a k + n`` (``n`` independent of ``k``,
  ``a`` the gain): ``unshrink`` ``u = 1/a`` (``[..., L, 1]``, None for 1) and ``noise_step2``
  ``w = 12 v``, ``v`` the variance per channel of ``u k̂ − k``.

Each tensor declares which model its error follows (``QuantizedTensor.noise_model``) and derives
both from what it stores:

- ``additive``: ``k̂ = k + e`` with ``e`` independent of ``k`` (uniform rounding on a fine grid,
  an unbiased sketch): ``Cov(e, k) = 0``; ``a = 1``, ``s = v = Var(e)`` (``Δ²/12`` for a uniform
  step ``Δ``: ``w = Δ²`` under both rules).
- ``centroid``: ``k = k̂ + e'`` with ``e'`` uncorrelated with ``k̂`` (Lloyd–Max / k-means
  centroids): ``Cov(e, k̂) = 0``, so ``s = −Var(e')``, the cell variances (``w = −Δ²``). Its
  regression on the true key is a shrinkage: with relative MSE ``ρ = E‖e'‖² / E‖k‖²``,
  ``E[k̂ | k] = (1 − ρ) k`` for TurboQuant on average over its random rotation (approximately,
  for the one seeded rotation a run uses), so ``a = 1 − ρ`` and ``n`` carries ``ρ(1 − ρ)`` of
  the key energy: ``u = 1/(1 − ρ)``, ``v = ρ/(1 − ρ) · ‖k‖²/d`` (TurboQuant-MSE: ``ρ`` of its
  codebook, ``‖k‖`` stored).
- ``mixed``: both at once (a dead-zone grid: values near 0 shrink to the centroid 0, the others
  round outward). Measured when the chunk is stored (:func:`measure_noise`), per chunk,
  (batch, head) and group, and counted in the bytes: for the excess rule ``s_j = Var(k̂) −
  Var(k)``, kept as ``κ_j = s_j / mean_i(Δ_ij²/12)`` in FP8 E4M3 (``w = κ_j Δ_ij²``; negative
  where the centroid part wins); for the unshrink rule the gain ``a`` per (batch, head) in FP16
  (:func:`regression_gain`) and ``κ_j`` of ``v_j = Var(k̂)/a² − Var(k)``. For the diagnostics of
  a variant that does not read it, the excess rule's κ is measured but not stored.
- ``additive (assumed)``: a method that does not declare its model gets the additive one,
  labelled so.

:func:`error_covariances` classifies a method from its stored tensors: per group,
``Cov(e, k)`` and ``Cov(e, k̂)`` over tokens (channel by channel, then averaged), as fractions of
``Var(e)`` (the two differ by exactly 1): additive ≈ (0, 1), centroid ≈ (−1, 0); their sum is
the excess variance ``s = Var(k̂) − Var(k)``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from jbkv_cli.quant.groupwise import FP8_MAX, STEP_DTYPE
from jbkv_cli.quant.tensor import ADDITIVE, ASSUMED, CENTROID, MIXED, QuantizedTensor

NOISE_MODELS = (ADDITIVE, CENTROID, MIXED, ASSUMED)


def basis(x: torch.Tensor, rotation) -> torch.Tensor:
    """``x`` (float32) in the basis a method quantized in (``R x`` under a rotation)."""
    return x.float() if rotation is None else rotation.rotate(x.float())


def _group_mean(x: torch.Tensor, groups: int) -> torch.Tensor:
    """``[..., D] -> [..., G]``: the mean over each group of ``D/G`` channels."""
    return x.unflatten(-1, (groups, -1)).mean(-1)


def _centered(x: torch.Tensor) -> torch.Tensor:
    return x - x.mean(-2, keepdim=True)


def excess_variance(x: torch.Tensor, stored: QuantizedTensor, groups: int) -> torch.Tensor:
    """``s_j = Var_i(k̂) − Var_i(k)`` per (batch, head) and group, over the tokens of ``x
    [..., L, D]``: ``[..., 1, G]`` (float32, in the method's basis)."""
    k = basis(x, stored.rotation)
    k_hat = basis(stored.dequantize(), stored.rotation)
    per_channel = _centered(k_hat).square().mean(-2) - _centered(k).square().mean(-2)
    return _group_mean(per_channel, groups).unsqueeze(-2)


def regression_gain(x: torch.Tensor, stored: QuantizedTensor) -> torch.Tensor:
    """``a = Σ_c Cov(k̂_c, k_c) / Σ_c Var(k_c)`` per (batch, head) over the tokens of ``x [..., L,
    D]``: ``[..., 1, 1]`` (float32), the least-squares gain of ``k̂ ≈ a k`` (a trace, so the same
    in any orthonormal basis), clamped to ``[1e-3, ∞)``."""
    k = _centered(basis(x, stored.rotation))
    k_hat = _centered(basis(stored.dequantize(), stored.rotation))
    cov = (k_hat * k).sum((-2, -1), keepdim=True)
    var = k.square().sum((-2, -1), keepdim=True)
    return torch.where(var > 0, cov / var.clamp_min(1e-30), 1.0).clamp_min(1e-3)


def _relative(v: torch.Tensor, step: torch.Tensor) -> torch.Tensor:
    """``v_j / mean_i(Δ_ij²/12)`` as FP8 E4M3 (0 where the steps are 0)."""
    uniform = (step.float().square() / 12).mean(-2, keepdim=True)
    kappa = torch.where(uniform > 0, v / uniform.clamp_min(1e-30), 0.0)
    return kappa.clamp(-FP8_MAX, FP8_MAX).to(STEP_DTYPE)


def measure_noise(
    x: torch.Tensor, stored: QuantizedTensor, unshrink: bool = False, counted: bool = True
) -> QuantizedTensor:
    """``stored`` with its mixed noise measured against the true ``x`` (module docstring); the
    tokens' own steps carry the rest. The excess rule (``signed``): ``κ_j = s_j /
    mean_i(Δ_ij²/12)``, ``s = Var(k̂) − Var(k)``, FP8. The unshrink rule (``unshrink``, the
    ``signed-unshrink`` ablation): the gain ``a`` (:func:`regression_gain`, FP16 per chunk,
    batch and head) and ``κ_j = v_j / mean_i(Δ_ij²/12)`` with ``v = Var(k̂)/a² − Var(k)``, the
    variance of ``k̂/a − k`` per channel if ``k̂ = a k + n``, ``n`` independent of ``k``.
    ``counted=False``: kept for the diagnostics only (the method's own model, for a variant
    that does not correct with it), not in ``stored()``. Exact tensors (no step) are returned
    unchanged."""
    step = stored.step
    if step is None:
        return stored
    groups = step.shape[-1]
    if not unshrink:
        kappa = _relative(excess_variance(x, stored, groups), step)
        return MeasuredNoise(stored, kappa, counted=counted)
    gain = regression_gain(x, stored).to(torch.float16)  # as stored
    k = basis(x, stored.rotation)
    k_hat = basis(stored.dequantize(), stored.rotation)
    per_channel = _centered(k_hat).square().mean(-2) / gain.float().squeeze(-1).square()
    per_channel = per_channel - _centered(k).square().mean(-2)
    v = _group_mean(per_channel, groups).unsqueeze(-2)
    return MeasuredNoise(stored, _relative(v, step), gain, counted)


@dataclass
class MeasuredNoise(QuantizedTensor):
    """A stored tensor whose mixed noise was measured at commit: ``inner`` as stored, plus
    ``kappa`` FP8 ``[..., 1, G]`` (per chunk, batch, head and group) and, for the unshrink rule,
    ``gain`` FP16 ``[..., 1, 1]`` (:func:`measure_noise`). ``counted``: whether they are part of
    what is stored (False: measured for the diagnostics only)."""

    inner: QuantizedTensor
    kappa: torch.Tensor
    gain: torch.Tensor | None = None
    counted: bool = True

    def __post_init__(self) -> None:
        self.shape, self.dtype = self.inner.shape, self.inner.dtype
        self.rotation = self.inner.rotation
        self.noise_model = f"{self.inner.noise_model} (measured)"

    def stored(self) -> dict[str, torch.Tensor]:
        if not self.counted:
            return self.inner.stored()
        gain = {} if self.gain is None else {"noise_gain": self.gain}
        return {**self.inner.stored(), "noise_kappa": self.kappa, **gain}

    def dequantize(self) -> torch.Tensor:
        return self.inner.dequantize()

    @property
    def step(self) -> torch.Tensor | None:
        return self.inner.step

    @property
    def steps_fp8(self) -> bool:
        return self.inner.steps_fp8

    @property
    def noise_step2(self) -> torch.Tensor:
        """``w = κ Δ²``: the excess variance (excess rule) or the unshrunk noise's variance
        (unshrink rule), per token and group."""
        return self.kappa.float() * self.inner.step.square()

    @property
    def excess_step2(self) -> torch.Tensor | None:
        return self.noise_step2 if self.gain is None else None

    @property
    def unshrink(self) -> torch.Tensor | None:
        """``1/a`` per token ``[..., L, 1]`` under the unshrink rule, else None (``a = 1``)."""
        if self.gain is None:
            return None
        return (1.0 / self.gain.float()).expand(*self.shape[:-1], 1)


@dataclass(frozen=True)
class ErrorCovariances:
    """Per group (``[..., G]``, float32): ``Var(e)``, ``Cov(e, k)``, ``Cov(e, k̂)`` per channel
    (over tokens, then averaged over the group's channels)."""

    var_e: torch.Tensor
    cov_e_k: torch.Tensor
    cov_e_khat: torch.Tensor

    @property
    def centroid_share(self) -> torch.Tensor:
        """``−Cov(e, k)/Var(e)``: 0 for additive noise, 1 for centroid-type."""
        return -self.cov_e_k / self.var_e.clamp_min(1e-30)

    @property
    def additive_share(self) -> torch.Tensor:
        """``Cov(e, k̂)/Var(e)``: 1 for additive noise, 0 for centroid-type."""
        return self.cov_e_khat / self.var_e.clamp_min(1e-30)

    @property
    def excess(self) -> torch.Tensor:
        """``Cov(e, k̂) + Cov(e, k) = Var(k̂) − Var(k)``: the signed correction's ``s``."""
        return self.cov_e_khat + self.cov_e_k


def error_covariances(x: torch.Tensor, stored: QuantizedTensor, groups: int) -> ErrorCovariances:
    """Classify the error of ``stored`` against the true ``x [..., L, D]`` (module docstring):
    covariances over the ``L`` tokens, channel by channel, averaged per group -> ``[..., G]``."""
    k = _centered(basis(x, stored.rotation))
    k_hat = _centered(basis(stored.dequantize(), stored.rotation))
    e = k_hat - k
    n = x.shape[-2]
    per = [(e * y).sum(-2) / n for y in (e, k, k_hat)]
    return ErrorCovariances(*(_group_mean(t, groups) for t in per))
