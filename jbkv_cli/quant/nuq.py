"""Non-uniform scalar codebooks (KVQuant's NUQ): 1-D weighted k-means, nearest-centroid codes,
the cells' variances, Q-Norm, and the percentile counts of its dense-and-sparse split.

For each row ``r`` of values ``x_r [N]`` with weights ``w_r [N] ≥ 0`` (0: left out, e.g. an
outlier) and ``k`` centroids ``c_1 ≤ … ≤ c_k``, Lloyd's algorithm in one dimension::

    init     c_j = the weighted (j + ½)/k quantile of x_r           (j = 0..k−1)
    assign   cell j = {x : b_{j−1} < x ≤ b_j},  b_j = (c_j + c_{j+1})/2   (ties: the lower cell)
    update   c_j = Σ_{cell j} w x / Σ_{cell j} w;  an empty cell keeps its centroid

``iters`` rounds, no early stop (KVQuant runs sklearn's ``KMeans(max_iter=50)``, which may stop
earlier on its tolerance). The values are sorted once; every round then reads the cells' sums
from prefix sums of ``w``, ``w x``, ``w x²`` (float64) at the boundaries, ``O(k log N)`` per
round, no host read. The cell variances ``v_j = Σ_{cell j} w (x − c_j)² / Σ_{cell j} w`` are
those of the stored centroids under nearest-centroid coding (the centroid noise the Jensen
correction reads).

Q-Norm (KVQuant's ``--norm``): ``x̃ = s ĉ + o`` with ``s = σ_x / σ_ĉ``, ``o = μ_x − s μ_ĉ`` over
the weighted values, so the reconstruction has the mean and standard deviation of the data.
"""

from __future__ import annotations

import math

import torch


def upper_count(n: int, t: float) -> int:
    """Of ``n`` distinct values, how many lie strictly above their ``t`` percentile (linear
    interpolation, numpy's default): ``n − 1 − ⌊(n − 1) t⌋``."""
    return n - 1 - math.floor(_position(n, t))


def lower_count(n: int, t: float) -> int:
    """Of ``n`` distinct values, how many lie strictly below their ``1 − t`` percentile:
    ``⌈(n − 1)(1 − t)⌉``."""
    return math.ceil(_position(n, 1.0 - t))


def upper_count_inclusive(n: int, t: float) -> int:
    """How many of ``n`` distinct values are ``≥`` their ``t`` quantile: ``n − ⌈(n − 1) t⌉``."""
    return n - math.ceil(_position(n, t))


def lower_count_inclusive(n: int, t: float) -> int:
    """How many of ``n`` distinct values are ``≤`` their ``1 − t`` quantile:
    ``⌊(n − 1)(1 − t)⌋ + 1``."""
    return math.floor(_position(n, 1.0 - t)) + 1


def _position(n: int, t: float) -> float:
    """``(n − 1) t``, snapped to an integer within 1e−9 (``t`` is a decimal fraction)."""
    p = (n - 1) * t
    return round(p) if abs(p - round(p)) < 1e-9 else p


def percentile(sorted_x: torch.Tensor, t: float, dim: int = -1) -> torch.Tensor:
    """The ``t`` quantile (linear interpolation) of values already sorted along ``dim``."""
    n = sorted_x.shape[dim]
    p = _position(n, t)
    lo = math.floor(p)
    hi = min(lo + 1, n - 1)
    a, b = sorted_x.select(dim, lo).float(), sorted_x.select(dim, hi).float()
    return a + (p - lo) * (b - a)


def _prefix(x: torch.Tensor) -> torch.Tensor:
    """``[R, N] -> [R, N + 1]`` cumulative sums from 0 (float64)."""
    zero = torch.zeros_like(x[:, :1], dtype=torch.float64)
    return torch.cat([zero, x.double().cumsum(-1)], dim=-1)


def _cells(
    xs: torch.Tensor, prefix: list[torch.Tensor], centroids: torch.Tensor
) -> list[torch.Tensor]:
    """Per cell of nearest-centroid coding: the sums ``Σw, Σwx, Σwx²`` ``[R, k]`` (float64)."""
    bounds = 0.5 * (centroids[:, 1:] + centroids[:, :-1])
    cut = torch.searchsorted(xs, bounds.to(xs.dtype).contiguous(), right=True)  # [R, k−1]
    n = xs.shape[-1]
    edges = torch.cat([torch.zeros_like(cut[:, :1]), cut, torch.full_like(cut[:, :1], n)], -1)
    return [p.gather(-1, edges).diff(dim=-1) for p in prefix]


def fit_codebook(x: torch.Tensor, weight: torch.Tensor, k: int, iters: int) -> torch.Tensor:
    """Weighted 1-D k-means on each row of ``x [R, N]`` (module docstring): ``centroids [R,
    k]`` (ascending, float32); a row with no weight gets centroids 0."""
    if iters < 1:
        raise ValueError(f"k-means needs at least 1 iteration, got {iters}")
    xs, order = x.float().sort(dim=-1)
    ws = weight.float().gather(-1, order)
    prefix = [_prefix(ws), _prefix(ws * xs), _prefix(ws * xs.square())]
    total = prefix[0][:, -1:]
    mass = (torch.arange(k, dtype=torch.float64, device=x.device) + 0.5) / k * total
    at = torch.searchsorted(prefix[0][:, 1:].contiguous(), mass.contiguous())
    centroids = xs.gather(-1, at.clamp_max(xs.shape[-1] - 1)).double()
    centroids = torch.where(total > 0, centroids, 0.0)
    for _ in range(iters):
        w, s1, _ = _cells(xs, prefix, centroids)
        means = s1 / w.clamp_min(1e-300)
        centroids = torch.where(w > 0, means, centroids).sort(dim=-1).values
    return centroids.float()


def cell_variance(x: torch.Tensor, weight: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """``v_j = Σ w (x − c_j)² / Σ w`` over each cell of ``centroids [R, k]`` (ascending; the
    stored ones) for the rows of ``x``, ``weight`` ``[R, N]``: ``[R, k]`` float32, 0 for an
    empty cell."""
    xs, order = x.float().sort(dim=-1)
    ws = weight.float().gather(-1, order)
    prefix = [_prefix(ws), _prefix(ws * xs), _prefix(ws * xs.square())]
    c = centroids.double()
    w, s1, s2 = _cells(xs, prefix, c)
    var = (s2 - 2 * c * s1 + c.square() * w) / w.clamp_min(1e-300)
    return torch.where(w > 0, var.clamp_min(0.0), 0.0).float()


def encode(x: torch.Tensor, centroids: torch.Tensor) -> torch.Tensor:
    """Nearest-centroid codes (uint8) of ``x [R, N]`` for ``centroids [R, k]`` (ascending): the
    cell ``j`` with ``b_{j−1} < x ≤ b_j`` (a tie goes to the lower centroid)."""
    c = centroids.float()
    bounds = (0.5 * (c[:, 1:] + c[:, :-1])).contiguous()
    return torch.searchsorted(bounds, x.float().contiguous()).to(torch.uint8)


def qnorm(
    x: torch.Tensor, weight: torch.Tensor, recon: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Q-Norm's ``(s, o)`` ``[R, 1]`` (float32): ``s = σ_x/σ_ĉ``, ``o = μ_x − s μ_ĉ`` over the
    weighted values of the rows of ``x`` and their reconstruction ``recon`` (``s = 1`` where
    ``σ_ĉ = 0``)."""
    w = weight.float()
    total = w.sum(-1, keepdim=True).clamp_min(1e-30)

    def moments(y: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = (w * y).sum(-1, keepdim=True) / total
        return mean, ((w * (y - mean).square()).sum(-1, keepdim=True) / total).sqrt()

    m1, s1 = moments(x.float())
    m2, s2 = moments(recon.float())
    scale = torch.where(s2 > 0, s1 / s2.clamp_min(1e-30), 1.0)
    return scale, m1 - scale * m2
