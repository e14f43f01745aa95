"""Noise models: how a method's stored key ``k̂`` relates to the true key ``k``.

The ``signed`` correction (:mod:`jbkv_cli.attention.correction`, where the derivation is) reads
each stored key through the linear model

    k̂ = a k + n,    n independent of k,    a ≤ 1 the gain (shrinkage), n zero-mean

as two tensors the stored tensor gives next to its ``step``: ``unshrink`` ``u = 1/a``
(``[..., L, 1]``, None for 1) and ``noise_step2`` ``w = 12 v``, ``v`` the variance per channel
of ``u k̂ − k`` per token and group (``[..., L, G]``, in the basis the method quantized in; in
units of a uniform step², so additive noise gives exactly ``Δ²``). Each tensor declares
which model its error follows (``QuantizedTensor.noise_model``) and derives ``(u, v)`` from what
it stores:

- ``additive``: ``k̂ = k + e`` with ``e`` independent of ``k`` (uniform rounding on a fine grid,
  an unbiased sketch): ``Cov(e, k) = 0``; ``u = 1``, ``v = Var(e)`` (``Δ²/12`` for a uniform
  step ``Δ``: ``w = Δ²``).
- ``centroid``: ``k = k̂ + e'`` with ``e'`` uncorrelated with ``k̂`` (Lloyd–Max / k-means
  centroids): ``Cov(e, k̂) = 0``. Its regression on the true key is a shrinkage: with relative
  MSE ``ρ = E‖e'‖² / E‖k‖²``, ``E[k̂ | k] = (1 − ρ) k`` (exact over TurboQuant's random
  rotation), so ``a = 1 − ρ`` and ``n`` carries ``ρ(1 − ρ)`` of the key energy: ``u = 1/(1 − ρ)``,
  ``v = ρ/(1 − ρ) · ‖k‖²/d`` (TurboQuant-MSE: ``ρ`` of its codebook, ``‖k‖`` stored).
- ``mixed``: both at once (a dead-zone grid: values near 0 shrink to the centroid 0, the others
  round outward). Measured when the chunk is stored (:func:`measure_noise`): the excess variance
  ``s_j = Var(k̂) − Var(k)`` per chunk, (batch, head) and group, kept as ``κ_j = s_j /
  mean_i(Δ_ij²/12)`` in FP8 E4M3 and counted in the bytes; ``u = 1``, ``v_ij = κ_j Δ_ij²/12``
  (``w = κ_j Δ_ij²``; an effective variance, negative where the centroid part wins).
- ``additive (assumed)``: a method that does not declare its model gets today's additive one,
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


def measure_noise(x: torch.Tensor, stored: QuantizedTensor) -> QuantizedTensor:
    """``stored`` with its measured ``κ_j`` (module docstring) attached as FP8 E4M3; the tokens'
    own steps carry the rest. Exact tensors (no step) are returned unchanged."""
    step = stored.step
    if step is None:
        return stored
    s = excess_variance(x, stored, step.shape[-1])
    uniform = (step.float().square() / 12).mean(-2, keepdim=True)
    kappa = torch.where(uniform > 0, s / uniform.clamp_min(1e-30), 0.0)
    kappa = kappa.clamp(-FP8_MAX, FP8_MAX).to(STEP_DTYPE)
    return MeasuredNoise(stored, kappa)


@dataclass
class MeasuredNoise(QuantizedTensor):
    """A stored tensor whose mixed noise was measured at commit: ``inner`` as stored, plus
    ``kappa`` FP8 ``[..., 1, G]`` (per chunk, batch, head and group; :func:`measure_noise`)."""

    inner: QuantizedTensor
    kappa: torch.Tensor

    def __post_init__(self) -> None:
        self.shape, self.dtype = self.inner.shape, self.inner.dtype
        self.rotation = self.inner.rotation
        self.noise_model = f"{self.inner.noise_model} (measured)"

    def stored(self) -> dict[str, torch.Tensor]:
        return {**self.inner.stored(), "noise_kappa": self.kappa}

    def dequantize(self) -> torch.Tensor:
        return self.inner.dequantize()

    @property
    def step(self) -> torch.Tensor | None:
        return self.inner.step

    @property
    def noise_step2(self) -> torch.Tensor:
        return self.kappa.float() * self.inner.step.square()

    @property
    def unshrink(self) -> torch.Tensor | None:
        return self.inner.unshrink


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
