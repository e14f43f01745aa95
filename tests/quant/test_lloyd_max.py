"""The Lloyd–Max codebooks TurboQuant uses: the rules Lloyd–Max states, and the values the paper
gives (arXiv 2504.19874, §3.1: b = 1 centroids ±√(2/π)/√d, b = 2 ±0.453/√d and ±1.51/√d; MSE of
a unit vector ≈ 0.36, 0.117, 0.03, 0.009 for b = 1..4)."""

from __future__ import annotations

import math

import pytest
import torch

from jbkv_cli.quant.lloyd_max import lloyd_max


def _sphere_coordinates(dim: int, n: int, seed: int = 0) -> torch.Tensor:
    """First coordinates of ``n`` uniform points on ``S^{dim−1}`` (float64)."""
    x = torch.randn(n, dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return x[:, 0] / x.norm(dim=-1)


@pytest.mark.parametrize(
    "bits, mse, rounding",
    [(1, 0.36, 0.005), (2, 0.117, 0.0005), (3, 0.03, 0.005), (4, 0.009, 5e-4)],
)
def test_the_papers_distortion_per_bit_width(bits, mse, rounding):
    """Within the paper's rounding (half a unit of its last digit, + 10%), in high dimension."""
    book = lloyd_max(4096, bits)
    assert abs(4096 * book.mse - mse) <= 1.1 * rounding
    assert abs(float(book.cell_prob.sum()) - 1) < 1e-9


def test_the_papers_centroids_at_one_and_two_bits():
    d = 4096  # "high dimensions": the Gaussian limit the paper quotes
    one = lloyd_max(d, 1).centroids * math.sqrt(d)
    two = lloyd_max(d, 2).centroids * math.sqrt(d)
    assert torch.allclose(
        one, torch.tensor([-1.0, 1.0], dtype=torch.float64) * math.sqrt(2 / math.pi), atol=1e-3
    )
    assert torch.allclose(
        two, torch.tensor([-1.51, -0.453, 0.453, 1.51], dtype=torch.float64), atol=6e-3
    )


def test_lloyd_max_conditions_hold_at_convergence():
    """Boundaries are the midpoints of neighbouring centroids; each centroid is the mean of its
    cell, which a Monte Carlo of sphere coordinates confirms (and its cell variance)."""
    book = lloyd_max(64, 3)
    c, t = book.centroids, book.boundaries
    assert torch.allclose(t, 0.5 * (c[1:] + c[:-1]), atol=1e-12)
    y = _sphere_coordinates(64, 400_000)
    codes = torch.searchsorted(t, y)
    for k in range(8):
        cell = y[codes == k]
        se = float(cell.std()) / math.sqrt(cell.numel())
        assert abs(float(cell.mean()) - float(c[k])) < 5 * se + 1e-4
        assert abs(float(cell.var()) / float(book.cell_var[k]) - 1) < 0.03
    assert abs(float((y - c[codes]).square().mean()) / book.mse - 1) < 0.01


def test_deterministic_symmetric_and_the_gaussian_limit():
    a, b = lloyd_max.__wrapped__(64, 2), lloyd_max.__wrapped__(64, 2)
    assert torch.equal(a.centroids, b.centroids) and torch.equal(a.cell_var, b.cell_var)
    assert torch.allclose(a.centroids, -a.centroids.flip(0), atol=1e-12)
    beta, gauss = lloyd_max(1024, 2), lloyd_max(1024, 2, "gaussian")
    assert torch.allclose(beta.centroids, gauss.centroids, rtol=2e-3)
    small = lloyd_max(16, 2)  # the sphere's coordinates have lighter tails than N(0, 1/d)
    assert float(small.centroids[-1]) < float(lloyd_max(16, 2, "gaussian").centroids[-1])


def test_refuses_what_it_cannot_build():
    with pytest.raises(ValueError, match="dim >= 3"):
        lloyd_max(2, 2)
    with pytest.raises(ValueError, match="distribution"):
        lloyd_max(64, 2, "laplace")
