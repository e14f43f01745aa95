"""PSNR per frame on uint8 RGB (peak 255), with identical frames capped instead of ``inf``."""

from __future__ import annotations

import torch

PEAK = 255.0
PSNR_CAP_DB = 100.0
"""Value reported for identical frames (MSE = 0); every per-frame PSNR is clipped to it.

A single off-by-one pixel in a 480×832 RGB frame gives 10·log10(255²·3·480·832) ≈ 109 dB, so
frames above 100 dB differ by a handful of pixel levels at most; clipping all of them keeps the
per-frame values monotone in MSE and every mean finite. The count of identical frames is reported
separately (``identical_frames``)."""


def mse_per_frame(ref: torch.Tensor, test: torch.Tensor) -> torch.Tensor:
    """Mean squared error per frame, float64 [T], of uint8 frames [T, H, W, C].

    MSE_t = (1 / HWC) Σ_{h,w,c} (ref − test)², summed exactly in int64.
    """
    _check_pair(ref, test)
    diff = ref.to(torch.int32) - test.to(torch.int32)
    sse = (diff * diff).flatten(1).sum(dim=1, dtype=torch.int64)
    return sse.to(torch.float64) / float(ref[0].numel())


def psnr_from_mse(mse: torch.Tensor, cap: float = PSNR_CAP_DB) -> torch.Tensor:
    """PSNR = min(10·log10(255² / MSE), cap) in dB; MSE = 0 gives ``cap``."""
    mse = torch.as_tensor(mse, dtype=torch.float64)
    psnr = 10.0 * torch.log10(PEAK**2 / mse)
    return torch.where(mse > 0, psnr.clamp(max=cap), torch.full_like(mse, cap))


def psnr_per_frame(ref: torch.Tensor, test: torch.Tensor, cap: float = PSNR_CAP_DB) -> torch.Tensor:
    """Per-frame PSNR (dB, float64 [T]) of uint8 frames [T, H, W, C], peak 255, capped."""
    return psnr_from_mse(mse_per_frame(ref, test), cap)


def _check_pair(ref: torch.Tensor, test: torch.Tensor) -> None:
    if ref.dtype != torch.uint8 or test.dtype != torch.uint8:
        raise ValueError(f"frames must be uint8, got {ref.dtype} and {test.dtype}")
    if ref.shape != test.shape or ref.ndim != 4:
        raise ValueError(
            f"frames must be [T, H, W, C] of equal shape, got {ref.shape}, {test.shape}"
        )
