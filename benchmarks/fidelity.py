"""jbkv PSNR + SSIM vs a plain scikit-image per-frame loop, side by side in one process.

Both compute the same numbers (per-frame PSNR with peak 255; SSIM with the Wang 2004 settings
``gaussian_weights=True, sigma=1.5, use_sample_covariance=False, data_range=255``) on the same
in-memory uint8 videos; decoding is excluded. Each timing is the best of ``--repeats`` runs.
Prints a table and writes ``benchmarks/results/fidelity.json``.

    .venv/bin/python benchmarks/fidelity.py [--threads 1] [--repeats 3] [--device cpu]
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import skimage
import torch
from rich.console import Console
from rich.table import Table
from skimage.metrics import peak_signal_noise_ratio, structural_similarity

from jbkv_cli.metrics.psnr import psnr_per_frame
from jbkv_cli.metrics.ssim import ssim_per_frame
from jbkv_cli.utils.atomic import write_text_atomic

CASES = [(8, 32, 64, 64), (2, 16, 256, 256)]  # (videos, frames, height, width)
RESULTS = Path(__file__).parent / "results" / "fidelity.json"


def make_videos(videos: int, frames: int, height: int, width: int, seed: int = 0) -> list:
    """(reference, test) uint8 pairs: smooth gradients + texture, test = reference + noise."""
    g = torch.Generator().manual_seed(seed)
    yy, xx = torch.meshgrid(torch.arange(height), torch.arange(width), indexing="ij")
    base = torch.stack((xx * 255.0 / width, yy * 255.0 / height, (xx + yy) * 128.0 / width), -1)
    pairs = []
    for _ in range(videos):
        ref = base + 30 * torch.rand(frames, height, width, 3, generator=g)
        test = ref + 6 * torch.randn(ref.shape, generator=g)
        pairs.append(tuple(x.clamp(0, 255).round().to(torch.uint8) for x in (ref, test)))
    return pairs


def run_jbkv(pairs: list, device: str) -> tuple[np.ndarray, np.ndarray]:
    psnr = [psnr_per_frame(r, t) for r, t in pairs]
    ssim = [ssim_per_frame(r, t, device=device) for r, t in pairs]
    return torch.cat(psnr).numpy(), torch.cat(ssim).numpy()


def run_skimage(pairs: list) -> tuple[np.ndarray, np.ndarray]:
    psnr, ssim = [], []
    for ref, test in pairs:
        for a, b in zip(ref.numpy(), test.numpy(), strict=True):
            psnr.append(peak_signal_noise_ratio(a, b, data_range=255))
            ssim.append(
                structural_similarity(
                    a,
                    b,
                    gaussian_weights=True,
                    sigma=1.5,
                    use_sample_covariance=False,
                    data_range=255,
                    channel_axis=-1,
                )
            )
    return np.array(psnr), np.array(ssim)


def best_time(fn: Callable[[], tuple[np.ndarray, np.ndarray]], repeats: int) -> tuple[float, tuple]:
    best, out = float("inf"), None
    for _ in range(repeats):
        start = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - start)
    return best, out


def max_rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a - b) / np.abs(b)))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=RESULTS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)

    rows = []
    for videos, frames, height, width in CASES:
        pairs = make_videos(videos, frames, height, width)
        run_jbkv(pairs[:1], args.device)  # warm-up
        t_jbkv, (psnr_j, ssim_j) = best_time(lambda p=pairs: run_jbkv(p, args.device), args.repeats)
        t_sk, (psnr_s, ssim_s) = best_time(lambda p=pairs: run_skimage(p), args.repeats)
        rows.append(
            {
                "videos": videos,
                "frames": frames,
                "height": height,
                "width": width,
                "skimage_s": t_sk,
                "jbkv_s": t_jbkv,
                "speedup": t_sk / t_jbkv,
                "max_rel_diff_psnr": max_rel(psnr_j, psnr_s),
                "max_rel_diff_ssim": max_rel(ssim_j, ssim_s),
            }
        )

    table = Table(
        title=f"PSNR+SSIM: jbkv ({args.device}, {args.threads} thread(s)) vs skimage loop"
    )
    for name in ["case", "skimage s", "jbkv s", "speedup", "max rel PSNR", "max rel SSIM"]:
        table.add_column(name, justify="right")
    for r in rows:
        table.add_row(
            f"{r['videos']}x{r['frames']}x{r['height']}x{r['width']}",
            f"{r['skimage_s']:.3f}",
            f"{r['jbkv_s']:.3f}",
            f"{r['speedup']:.2f}x",
            f"{r['max_rel_diff_psnr']:.1e}",
            f"{r['max_rel_diff_ssim']:.1e}",
        )
    Console().print(table)
    payload = {
        "benchmark": "fidelity PSNR+SSIM, jbkv vs scikit-image per-frame loop",
        "device": args.device,
        "torch_threads": args.threads,
        "repeats": args.repeats,
        "timing": "best of repeats, seconds, decoding excluded",
        "versions": {"torch": torch.__version__, "skimage": skimage.__version__},
        "machine": platform.processor() or platform.machine(),
        "cases": rows,
    }
    write_text_atomic(args.out, json.dumps(payload, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
