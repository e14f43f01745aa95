"""SSIM (Wang et al. 2004) per frame, batched in float64, matching scikit-image exactly.

For each frame and channel, with a Gaussian window G (σ = 1.5, truncated at 3.5σ → 11 taps,
normalized) applied separably, x = reference, y = test (values 0…255):

    μx = G∗x, μy = G∗y, σx² = G∗x² − μx², σy² = G∗y² − μy², σxy = G∗(xy) − μxμy
    S = (2μxμy + C1)(2σxy + C2) / ((μx² + μy² + C1)(σx² + σy² + C2)),
    C1 = (0.01·255)², C2 = (0.03·255)²  (population covariance)

SSIM = mean of S over the valid region (the 5-pixel border, where the window leaves the image,
is excluded), averaged over channels. This is
``skimage.metrics.structural_similarity(ref, test, gaussian_weights=True, sigma=1.5,
use_sample_covariance=False, data_range=255, channel_axis=-1)``: scikit-image filters with
'reflect' padding and then crops (win−1)/2 pixels per border, so only unpadded values survive;
here the filter is computed on the valid region directly (same values, no padding).

On a CPU the work is tiled so each tile stays in cache (the 11-tap shifted sums are
memory-bound otherwise); on CUDA whole batches go at once.
"""

from __future__ import annotations

import torch

SIGMA = 1.5
TRUNCATE = 3.5
K1 = 0.01
K2 = 0.03
DATA_RANGE = 255.0
CPU_TILE_ELEMENTS = 65_536
GPU_TILE_ELEMENTS = 1 << 22


def gaussian_taps(sigma: float = SIGMA, truncate: float = TRUNCATE) -> torch.Tensor:
    """Normalized 1-D Gaussian, float64, radius r = int(truncate·σ + 0.5) (11 taps for σ=1.5)."""
    radius = int(truncate * sigma + 0.5)
    x = torch.arange(-radius, radius + 1, dtype=torch.float64)
    taps = torch.exp(-0.5 / sigma**2 * x * x)
    return taps / taps.sum()


def window_size(sigma: float = SIGMA, truncate: float = TRUNCATE) -> int:
    """Side of the Gaussian window (11 for σ = 1.5)."""
    return 2 * int(truncate * sigma + 0.5) + 1


def ssim_per_frame(
    ref: torch.Tensor,
    test: torch.Tensor,
    *,
    device: torch.device | str | None = None,
    tile_elements: int | None = None,
) -> torch.Tensor:
    """SSIM per frame (float64 [T], on CPU) of uint8 frames [T, H, W, C]; H, W ≥ 11."""
    if ref.dtype != torch.uint8 or test.dtype != torch.uint8:
        raise ValueError(f"frames must be uint8, got {ref.dtype} and {test.dtype}")
    if ref.shape != test.shape or ref.ndim != 4:
        raise ValueError(
            f"frames must be [T, H, W, C] of equal shape, got {ref.shape}, {test.shape}"
        )
    frames, height, width, channels = ref.shape
    win = window_size()
    if height < win or width < win:
        raise ValueError(f"SSIM needs frames of at least {win}x{win} pixels, got {height}x{width}")
    device = torch.device(device) if device is not None else ref.device
    if tile_elements is None:
        tile_elements = GPU_TILE_ELEMENTS if device.type == "cuda" else CPU_TILE_ELEMENTS
    taps = [float(t) for t in gaussian_taps()]
    x = ref.to(device).permute(0, 3, 1, 2).reshape(-1, height, width).contiguous()
    y = test.to(device).permute(0, 3, 1, 2).reshape(-1, height, width).contiguous()
    sums = torch.zeros(x.shape[0], dtype=torch.float64, device=device)
    out_h, out_w = height - win + 1, width - win + 1
    images, rows = _tile_shape(x.shape[0], height, width, win, tile_elements)
    with torch.inference_mode():
        for i0 in range(0, x.shape[0], images):
            i1 = min(i0 + images, x.shape[0])
            for r0 in range(0, out_h, rows):
                r1 = min(r0 + rows, out_h)
                xs = x[i0:i1, r0 : r1 + win - 1].to(torch.float64)
                ys = y[i0:i1, r0 : r1 + win - 1].to(torch.float64)
                sums[i0:i1] += _ssim_map(xs, ys, taps).sum(dim=(-1, -2))
    per_image = sums / (out_h * out_w)
    return per_image.view(frames, channels).mean(dim=1).cpu()


def _tile_shape(n: int, height: int, width: int, win: int, budget: int) -> tuple[int, int]:
    """(images per tile, output rows per tile) keeping about ``budget`` elements per map."""
    out_h = height - win + 1
    if height * width <= budget:
        return max(1, min(n, budget // (height * width))), out_h
    rows = max(1, budget // width - (win - 1))
    return 1, min(rows, out_h)


def _ssim_map(x: torch.Tensor, y: torch.Tensor, taps: list[float]) -> torch.Tensor:
    """SSIM map on the valid region of float64 tiles x, y [n, h, w] -> [n, h−10, w−10].

    Four filtered maps instead of five, through s = x + y and d = x − y:
    μs = G∗s, μd = G∗d, and with P = μs² − μd², Q = μs² + μd²:
    2μxμy = P/2, μx² + μy² = Q/2, 2σxy = (G∗s² − G∗d² − P)/2, σx² + σy² = (G∗s² + G∗d² − Q)/2.
    """
    s = x + y
    d = x - y
    stack = torch.stack((s, d, s * s, d * d))
    mu_s, mu_d, ss, dd = _correlate(_correlate(stack, taps, dim=-2), taps, dim=-1).unbind(0)
    c1 = (K1 * DATA_RANGE) ** 2
    c2 = (K2 * DATA_RANGE) ** 2
    mu_s2 = mu_s * mu_s
    mu_d2 = mu_d * mu_d
    p = mu_s2 - mu_d2
    q = mu_s2 + mu_d2
    numerator = (0.5 * p + c1) * (0.5 * (ss - dd - p) + c2)
    denominator = (0.5 * q + c1) * (0.5 * (ss + dd - q) + c2)
    return numerator / denominator


def _correlate(t: torch.Tensor, taps: list[float], dim: int) -> torch.Tensor:
    """Valid 1-D correlation along ``dim``: out[i] = Σ_k taps[k] · t[i + k]."""
    length = t.shape[dim] - len(taps) + 1
    out = t.narrow(dim, 0, length) * taps[0]
    for k in range(1, len(taps)):
        out.add_(t.narrow(dim, k, length), alpha=taps[k])
    return out
