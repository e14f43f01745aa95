"""RTN: group-wise per-token asymmetric round-to-nearest (the paper's default quantizer).

Each token's ``D`` channels are split into groups of ``g = group_size``; per group a step ``Δ``
(FP8 E4M3) and a zero point ``z`` (BF16) are stored with the ``B``-bit codes, bit-packed, so
``B_eff = B + (8 + 16)/g`` (see :mod:`jbkv_cli.quant.groupwise` for the formulas). Two grids:

- ``rtn``: the *covering* grid (Δ rounded up, z down): never clips, ``|x − x̂| ≤ Δ/2``.
- ``rtn-nearest``: Δ and z rounded to nearest and codes clamped: no systematic overshoot of the
  group's extremes, at the cost of clipping what falls outside the stored grid.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch

from jbkv_cli.quant.groupwise import RTN_BITS, pack_codes, quantize_groups
from jbkv_cli.quant.method import KVMethod, Role
from jbkv_cli.quant.rotation import RandomHadamard
from jbkv_cli.quant.tensor import ADDITIVE, GroupQuantized


def store_groups(
    x: torch.Tensor,
    bits: int,
    group_size: int,
    grid: str = "covering",
    rotation: RandomHadamard | None = None,
    scales: str = "fp8",
) -> GroupQuantized:
    """Group-wise codes of ``x`` (of ``R x`` under a rotation), packed, with FP8 steps and BF16
    zero points (FP16 both with ``scales="fp16"``)."""
    source = x if rotation is None else rotation.rotate(x.float())
    codes, step, zero = quantize_groups(source, bits, group_size, grid, scales)
    packed = pack_codes(codes, bits)
    return GroupQuantized(packed, x.shape, x.dtype, bits, group_size, step, zero, rotation)


@dataclass(frozen=True)
class RTN(KVMethod):
    """Per-token groups of ``group_size`` channels, covering grid (FP8 Δ up, BF16 z down)."""

    name: ClassVar[str] = "rtn"
    summary: ClassVar[str] = "group-wise per-token RTN, covering grid (FP8 step up, BF16 zero down)"
    SUPPORTED_BITS: ClassVar[tuple[int, ...]] = RTN_BITS
    grid: ClassVar[str] = "covering"
    noise_model: ClassVar[str] = ADDITIVE  # GroupQuantized: uniform rounding, s = +Δ²/12

    def _quantize(self, x: torch.Tensor, role: Role) -> GroupQuantized:
        return store_groups(x, self.bits, self.group_size, self.grid)


@dataclass(frozen=True)
class RTNNearest(RTN):
    """:class:`RTN` on the nearest grid: Δ and z rounded to nearest, codes clamped."""

    name: ClassVar[str] = "rtn-nearest"
    summary: ClassVar[str] = "group-wise per-token RTN, nearest grid (FP8 step nearest, clamped)"
    grid: ClassVar[str] = "nearest"
