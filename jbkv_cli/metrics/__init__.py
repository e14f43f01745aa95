"""Metrics: fidelity against a reference (PSNR, SSIM, LPIPS), VBench scores, statistics."""
