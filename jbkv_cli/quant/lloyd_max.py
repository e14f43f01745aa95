"""Lloyd–Max scalar codebooks for the rotated coordinates TurboQuant quantizes.

TurboQuant (Zandieh et al., arXiv 2504.19874, §3.1) rotates a unit vector by a uniformly random
orthogonal matrix; each coordinate of the result is then a coordinate of a uniform point on the
sphere ``S^{d−1}``, with the density (the paper's Lemma 1)

    f_d(x) = Γ(d/2) / (√π · Γ((d−1)/2)) · (1 − x²)^{(d−3)/2},     x ∈ [−1, 1]

(a Beta((d−1)/2, (d−1)/2) law stretched to [−1, 1]), which tends to ``N(0, 1/d)`` as ``d`` grows.
The ``b``-bit codebook ``c_1 < … < c_{2^b}`` minimises ``E[(X − c(X))²]`` with ``c(X)`` the
nearest centroid (the paper's Eq. 4: a continuous 1-D k-means). Lloyd–Max alternates

    boundaries  t_k = (c_k + c_{k+1}) / 2                 (nearest centroid)
    centroids   c_k = E[X | t_{k−1} < X ≤ t_k]             (the centroid condition)

so at convergence the quantization error ``X − c(X)`` is uncorrelated with ``c(X)``: the MSE
variant's error is of *centroid type* (see :mod:`jbkv_cli.attention.correction`).

Numerics (jbkv's choices; the paper gives no routine): ``f`` on a uniform grid of ``N = 40,001``
points over ``[−a, a]``, ``a = min(1, 14/√d)`` (the mass beyond is below ``e^{−90}``), in
float64 on the CPU; cumulative trapezoid integrals of ``f``, ``x f`` and ``x² f``; the moments of
a cell by linear interpolation of those at its boundaries. Start: the conditional means of
``2^b`` equal-probability cells; stop when no boundary moves by more than ``1e−13/√d`` or after
20,000 rounds. Deterministic (no randomness, fixed order of operations). ``distribution=
"gaussian"`` uses the ``N(0, 1/d)`` limit instead of ``f_d``. Values the paper states for large
``d`` (checked in ``tests/quant/test_lloyd_max.py``): ``b = 1`` centroids ``±√(2/π)/√d``, ``b = 2``
``±0.453/√d, ±1.51/√d``; MSE of a unit vector ``d · E[(X − c)²] ≈ 0.36, 0.117, 0.03, 0.009`` for
``b = 1..4``.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field

import torch

from jbkv_cli.utils.host_reads import device_copy

DISTRIBUTIONS = ("beta", "gaussian")
GRID_POINTS = 40_001
MAX_ROUNDS = 20_000


@dataclass(frozen=True)
class Codebook:
    """A scalar quantizer for one coordinate (float64 tensors).

    ``centroids [K]`` ascending; ``boundaries [K−1]`` (a value ``x`` gets the code of the cell it
    falls in, ``searchsorted(boundaries, x)``); ``cell_prob [K]`` and ``cell_var [K]``: each cell's
    probability and the variance of ``X`` within it (``Var(X | code)``, what the centroid noise
    model reads); ``mse = E[(X − c(X))²] = Σ_k p_k · var_k``.
    """

    dim: int
    bits: int
    distribution: str
    centroids: torch.Tensor
    boundaries: torch.Tensor
    cell_prob: torch.Tensor
    cell_var: torch.Tensor
    rounds: int
    mse: float = field(init=False)  # read once on the CPU, where the codebook is made

    def __post_init__(self) -> None:
        object.__setattr__(self, "mse", float((self.cell_prob * self.cell_var).sum()))

    def encode(self, x: torch.Tensor) -> torch.Tensor:
        """Codes (uint8) of ``x``: the index of the nearest centroid."""
        bounds = device_copy(self.boundaries, x.device, torch.float32)
        return torch.searchsorted(bounds, x.float().contiguous()).to(torch.uint8)


def _density(dim: int, distribution: str) -> tuple[torch.Tensor, torch.Tensor]:
    half = min(1.0, 14.0 / math.sqrt(dim))
    x = torch.linspace(-half, half, GRID_POINTS, dtype=torch.float64)
    if distribution == "gaussian":
        return x, torch.exp(-0.5 * dim * x * x) * math.sqrt(dim / (2 * math.pi))
    if dim == 3:
        return x, torch.full_like(x, 0.5)  # uniform on [−1, 1]
    log_norm = math.lgamma(dim / 2) - math.lgamma((dim - 1) / 2) - 0.5 * math.log(math.pi)
    inside = (1 - x * x).clamp_min(1e-300)
    return x, torch.exp(log_norm + 0.5 * (dim - 3) * torch.log(inside))


def _cumulative(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """``∫_{x_0}^{x_n} y`` at every grid point (trapezoid)."""
    steps = 0.5 * (y[1:] + y[:-1]) * (x[1:] - x[:-1])
    return torch.cat([y.new_zeros(1), torch.cumsum(steps, 0)])


def _interp(x: torch.Tensor, table: torch.Tensor, at: torch.Tensor) -> torch.Tensor:
    """Piecewise-linear ``table(x)`` at the points ``at`` (clamped to the grid)."""
    at = at.clamp(float(x[0]), float(x[-1]))
    i = torch.searchsorted(x, at).clamp(1, x.numel() - 1)
    x0, x1 = x[i - 1], x[i]
    w = (at - x0) / (x1 - x0)
    return table[i - 1] + w * (table[i] - table[i - 1])


@functools.lru_cache(maxsize=32)
def lloyd_max(dim: int, bits: int, distribution: str = "beta") -> Codebook:
    """The ``bits``-bit Lloyd–Max codebook for a coordinate of a uniform point on ``S^{dim−1}``
    (``beta``) or of ``N(0, 1/dim)`` (``gaussian``); see the module docstring."""
    if distribution not in DISTRIBUTIONS:
        raise ValueError(f"distribution must be one of {DISTRIBUTIONS}, got {distribution!r}")
    if dim < 3:
        raise ValueError(f"the sphere-coordinate codebook needs dim >= 3, got {dim}")
    if not 1 <= bits <= 8:
        raise ValueError(f"codebook bits must be in 1..8, got {bits}")
    x, f = _density(dim, distribution)
    moments = [_cumulative(x, f * x**p) for p in range(3)]
    total = float(moments[0][-1])
    levels = 1 << bits
    probs = torch.arange(1, levels, dtype=torch.float64) / levels * total
    cut = torch.searchsorted(moments[0], probs).clamp(1, x.numel() - 1)
    bounds = x[cut]  # equal-probability cells (to grid precision)
    tol = 1e-13 / math.sqrt(dim)

    def cells(t: torch.Tensor) -> list[torch.Tensor]:
        edges = torch.cat([x[:1], t, x[-1:]])
        return [_interp(x, m, edges).diff() for m in moments]

    rounds, moved = 0, math.inf
    while moved > tol and rounds < MAX_ROUNDS:
        m0, m1, _ = cells(bounds)
        centroids = m1 / m0
        new = 0.5 * (centroids[1:] + centroids[:-1])
        moved = float((new - bounds).abs().max())
        bounds, rounds = new, rounds + 1
    m0, m1, m2 = cells(bounds)
    centroids = m1 / m0
    var = (m2 / m0 - centroids.square()).clamp_min(0.0)
    return Codebook(dim, bits, distribution, centroids, bounds, m0 / total, var, rounds)
