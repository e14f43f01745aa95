"""QuantizedTensor: what the cache stores for one chunk's keys or values, and how to read it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from jbkv_cli.quant.rotation import RandomHadamard
from jbkv_cli.quant.rtn import dequantize_groups, unpack_codes


@dataclass
class QuantizedTensor:
    """A ``[..., L, D]`` tensor as stored: packed codes + FP8 steps + BF16 zeros, or raw.

    ``bits == 16`` means stored as-is in ``data`` (the full-precision path). Otherwise ``data`` is
    the packed uint8 codes ``[..., L, D·B/8]`` with ``step_fp8``/``zero`` ``[..., L, D/g]``. When
    ``rotation`` is set, the stored values are those of ``R x`` and :meth:`dequantize` rotates
    back, so callers always see the original basis.
    """

    data: torch.Tensor
    shape: torch.Size
    dtype: torch.dtype
    bits: int = 16
    group_size: int | None = None
    step_fp8: torch.Tensor | None = None
    zero: torch.Tensor | None = None
    rotation: RandomHadamard | None = None

    @property
    def quantized(self) -> bool:
        return self.bits < 16

    @property
    def step(self) -> torch.Tensor | None:
        """The stored step sizes Δ as float32 ``[..., L, D/g]`` (None when not quantized)."""
        return None if self.step_fp8 is None else self.step_fp8.float()

    @property
    def nbytes(self) -> int:
        """Bytes actually held by this tensor's storage (codes, steps and zero points)."""
        parts = (self.data, self.step_fp8, self.zero)
        return sum(t.numel() * t.element_size() for t in parts if t is not None)

    @property
    def effective_bits(self) -> float:
        """Stored bits per element: ``nbytes · 8 / numel``."""
        return self.nbytes * 8 / self.shape.numel()

    def dequantize(self) -> torch.Tensor:
        """``x̂`` in the original basis and dtype, ``[..., L, D]``."""
        if self.quantized:
            codes = unpack_codes(self.data, self.bits, self.shape[-1])
            x = dequantize_groups(codes, self.step_fp8, self.zero, torch.float32)
        else:
            x = self.data
        if self.rotation is not None:
            x = self.rotation.unrotate(x)
        return x.to(self.dtype)
