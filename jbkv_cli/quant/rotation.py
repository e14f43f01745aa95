"""Seeded randomized Hadamard rotation (QuaRot-style), block-diagonal over the head dim.

Each block of ``b`` channels (``b`` a power of two dividing the head dim) is rotated by

    R = H_b · diag(s) / √b,        s ∈ {±1}^b drawn from a generator seeded with ``seed``,

with ``H_b`` the Sylvester–Hadamard matrix, applied by a fast Walsh–Hadamard transform in
``O(b log b)``. ``R`` is orthogonal, so ``(Rq)·(Rk) = q·k``: rotating keys before quantization
spreads outliers across channels without changing attention, and the quantization noise then lives
in the rotated basis, so the Jensen bias must be computed from the rotated query ``Rq``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from jbkv_cli.utils.host_reads import device_copy


def fwht(x: torch.Tensor) -> torch.Tensor:
    """Unnormalized fast Walsh–Hadamard transform over the last dim (a power of two)."""
    n = x.shape[-1]
    if n & (n - 1):
        raise ValueError(f"Walsh–Hadamard size must be a power of two, got {n}")
    lead = x.shape[:-1]
    h = 1
    while h < n:
        pairs = x.reshape(*lead, n // (2 * h), 2, h)
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        x = torch.stack((a + b, a - b), dim=-2)
        h *= 2
    return x.reshape(*lead, n)


@dataclass(frozen=True)
class RandomHadamard:
    """A seeded, block-diagonal randomized Hadamard rotation of ``dim`` channels."""

    dim: int
    block_size: int | None = None
    seed: int = 0
    signs: torch.Tensor = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        block = self.block_size or self.dim
        if block & (block - 1) or block < 2:
            raise ValueError(f"rotation block_size must be a power of two >= 2, got {block}")
        if self.dim % block:
            raise ValueError(f"rotation block_size {block} must divide the head dim {self.dim}")
        object.__setattr__(self, "block_size", block)
        gen = torch.Generator(device="cpu").manual_seed(self.seed)
        signs = torch.randint(0, 2, (self.dim,), generator=gen).float() * 2 - 1
        object.__setattr__(self, "signs", signs)

    def _blocks(self, x: torch.Tensor) -> torch.Tensor:
        return x.unflatten(-1, (self.dim // self.block_size, self.block_size))

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """``x ↦ R x`` per block, computed in float32, returned in ``x.dtype``."""
        self._check(x)
        s = device_copy(self.signs, x.device)
        y = fwht(self._blocks(x.float() * s)) / math.sqrt(self.block_size)
        return y.flatten(-2).to(x.dtype)

    def unrotate(self, y: torch.Tensor) -> torch.Tensor:
        """``y ↦ Rᵀ y = diag(s) H y / √b`` (the inverse rotation)."""
        self._check(y)
        s = device_copy(self.signs, y.device)
        x = fwht(self._blocks(y.float())).flatten(-2) / math.sqrt(self.block_size) * s
        return x.to(y.dtype)

    def matrix(self) -> torch.Tensor:
        """The dense ``[dim, dim]`` matrix ``R`` (for tests and inspection)."""
        return self.rotate(torch.eye(self.dim)).T

    def _check(self, x: torch.Tensor) -> None:
        if x.shape[-1] != self.dim:
            raise ValueError(f"rotation expects last dim {self.dim}, got {x.shape[-1]}")
