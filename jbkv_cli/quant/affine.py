"""QuantWM's residual format: affine INT-``b`` codes with integer zero points and INT8 scale
codes under one shared FP16 secondary scale (QuantWM, arXiv 2609.26425, Eq. 1–2 and App. D.1).

Per row ``n`` (one (batch, head) pair of one chunk), token ``i`` and group ``j`` of ``g``
channels, with ``m = 2^b − 1``::

    lo = min(0, min_c r_c),  hi = max(0, max_c r_c)      the group's range, holding 0
    s  = (hi − lo) / m                                    its step (Eq. 1)
    σ_n = fp16_up(max_{i,j} s / 255)                      secondary scale, FP16, one per row
    a  = ceil(s / σ_n) ∈ 1..255 (0 when s = 0)            scale code, uint8
    Δ  = a · σ_n                                          the stored step
    z  = clamp(round(−lo / Δ), 0, m)                      integer zero point, b bits
    q  = clamp(round(r / Δ) + z, 0, m)                    code, b bits (Eq. 2)
    r̂  = (q − z) · Δ

Codes are bit-packed (INT2: 4 per byte), the zero points of a row too (flattened over its
``L·G`` groups, padded to a whole byte), so the stored bits per element are
``b + (b + 8)/g + 16/(L·D)``.

Choices where the text read (``shared/docs/methods-sources.md``) is silent:

- **Zero inside the range.** An integer zero point in ``0..m`` puts 0 on every grid
  (``−z·Δ ≤ 0 ≤ (m − z)·Δ``), so the range is widened to hold 0 (as integer-zero-point affine
  quantizers commonly do). A centred residual almost always straddles 0 anyway.
- **Scale codes rounded up** (``ceil``): ``Δ ≥ s``, so with ``z`` rounded to nearest every value
  of ``[lo, hi]`` lies within ``Δ/2`` of a grid point: ``|r − r̂| ≤ Δ/2`` always (the uniform
  noise model's premise, ``tests/quant/test_quantwm.py``). A group whose step is far below its
  row's largest pays for the shared scale: its code is at least 1, so ``Δ ≥ σ_n``.
- **One secondary scale per (chunk, batch, head).** Per token it would cost ``16/D`` bits; the
  paper calls it shared.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from jbkv_cli.quant.groupwise import check_group_size, pack_codes, round_fp16, unpack_codes
from jbkv_cli.quant.tensor import QuantizedTensor

AFFINE_BITS = (2, 4)
SCALE_CODES = 255  # INT8 scale codes, 1..255 (0: an all-zero group)
SECONDARY_DTYPE = torch.float16


def _pad_pack(values: torch.Tensor, bits: int) -> torch.Tensor:
    """Pack ``values [N, n]`` (uint8 codes) at ``bits`` each, zero-padded to whole bytes."""
    per_byte = 8 // bits
    pad = -values.shape[-1] % per_byte
    if pad:
        values = torch.nn.functional.pad(values, (0, pad))
    return pack_codes(values, bits)


@dataclass
class AffineResidual(QuantizedTensor):
    """Rows ``[N, L, D]`` stored as packed codes ``[N, L, D·b/8]``, packed zero points
    ``[N, ⌈L·G·b/8⌉]``, uint8 scale codes ``[N, L, G]`` and FP16 secondary scales ``[N]``;
    ``shape`` is the caller's ``[..., L, D]``."""

    codes: torch.Tensor
    zeros: torch.Tensor
    scale_codes: torch.Tensor
    secondary: torch.Tensor
    shape: torch.Size
    dtype: torch.dtype
    bits: int
    group_size: int

    def stored(self) -> dict[str, torch.Tensor]:
        return {
            "codes": self.codes,
            "zero_points": self.zeros,
            "scale_codes": self.scale_codes,
            "secondary_scale": self.secondary,
        }

    @property
    def rows_step(self) -> torch.Tensor:
        """``Δ`` per (row, token, group) ``[N, L, G]`` (float32)."""
        return self.scale_codes.float() * self.secondary.float()[:, None, None]

    @property
    def step(self) -> torch.Tensor:
        return self.rows_step.reshape(*self.shape[:-1], -1)

    def zero_points(self) -> torch.Tensor:
        """``z`` ``[N, L, G]`` (uint8)."""
        n, length, groups = self.scale_codes.shape
        return unpack_codes(self.zeros, self.bits, self.zeros.shape[-1] * 8 // self.bits)[
            :, : length * groups
        ].reshape(n, length, groups)

    def rows(self) -> torch.Tensor:
        """``r̂`` ``[N, L, D]`` (float32)."""
        n, length, groups = self.scale_codes.shape
        dim = self.shape[-1]
        q = unpack_codes(self.codes, self.bits, dim).float().reshape(n, length, groups, -1)
        z = self.zero_points().float().unsqueeze(-1)
        return ((q - z) * self.rows_step.unsqueeze(-1)).reshape(n, length, dim)

    def dequantize(self) -> torch.Tensor:
        return self.rows().reshape(self.shape).to(self.dtype)


def check_affine(head_dim: int, bits: int, group_size: int) -> None:
    """Raise ``ValueError`` unless heads of ``head_dim`` channels can be stored."""
    check_group_size(head_dim, group_size)
    per_byte = 8 // bits
    if head_dim % per_byte:
        raise ValueError(f"INT{bits} packing needs a head dim divisible by {per_byte}")


def quantize_affine(
    rows: torch.Tensor, bits: int, group_size: int, shape: torch.Size, dtype: torch.dtype
) -> AffineResidual:
    """Store ``rows [N, L, D]`` (float32) in the format of the module docstring."""
    if bits not in AFFINE_BITS:
        raise ValueError(f"affine residual bits must be one of {AFFINE_BITS}, got {bits}")
    dim = rows.shape[-1]
    levels = (1 << bits) - 1
    groups = rows.float().unflatten(-1, (dim // group_size, group_size))  # [N, L, G, g]
    lo = groups.amin(-1).clamp_max(0.0)
    hi = groups.amax(-1).clamp_min(0.0)
    step = (hi - lo) / levels  # [N, L, G]
    secondary = round_fp16(step.flatten(1).amax(-1) / SCALE_CODES, up=True)  # [N] FP16
    sec = secondary.float()[:, None, None]
    ratio = torch.where(sec > 0, step / torch.where(sec > 0, sec, 1.0), 0.0)
    scale_codes = ratio.ceil().clamp(0, SCALE_CODES).to(torch.uint8)
    delta = scale_codes.float() * sec  # the stored step
    safe = torch.where(delta > 0, delta, 1.0)
    zero = torch.where(delta > 0, (-lo / safe).round(), 0.0).clamp(0, levels)
    q = (groups / safe.unsqueeze(-1)).round() + zero.unsqueeze(-1)
    q = torch.where(delta.unsqueeze(-1) > 0, q, zero.unsqueeze(-1)).clamp(0, levels)
    codes = pack_codes(q.to(torch.uint8).flatten(-2), bits)  # [N, L, D·b/8]
    zeros = _pad_pack(zero.to(torch.uint8).flatten(1), bits)  # [N, ⌈L·G·b/8⌉]
    return AffineResidual(
        codes=codes,
        zeros=zeros,
        scale_codes=scale_codes,
        secondary=secondary,
        shape=torch.Size(shape),
        dtype=dtype,
        bits=bits,
        group_size=group_size,
    )
