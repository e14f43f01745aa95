"""Does QVG's k-means smooth keys better before RoPE? Pre- vs post-RoPE keys on the embedded model.

python benchmarks/qvg_prerope.py [--prompts tiny] [--seeds 0,1,2,3] [--bits 2]
                                 [--corrections none,taylor] [--threads 2]

QuantVideoGen's Self-Forcing integration caches keys before RoPE (``jbkv_cli/quant/qvg_policy``);
the embedded model has a 3D RoPE too, so the same QVG variant is run with ``layout=post-rope``
and ``layout=pre-rope`` (everything else equal: per-chunk spans, K ≤ L/64, B = 64) on every
prompt × seed, against the 16-bit reference of that prompt × seed. Per video:

- PSNR against the reference (mean over frames, as the result tables; and pooled over frames);
- at every commit, for every layer, the stored keys' relative error ``‖k̂ − k‖² / ‖k‖²`` and
  the residual share ``‖k − Σ_s c^s‖² / ‖k‖²`` (what the centroids leave to the INT2 codes: the
  smoothing). Both in the basis the keys are quantized in; RoPE is orthogonal, so the key error
  is the same in the basis attention reads.

Printed and written to ``benchmarks/results/qvg_prerope.json``: means per layout and the paired
differences (pre − post) per prompt × seed, with a 95% t interval and how many pairs improve.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path

import torch

from jbkv_cli.cli.options import parse_seeds, read_prompts
from jbkv_cli.kvcache import ChunkKVCache, KVSpec
from jbkv_cli.kvcache.spec import FULL_PRECISION
from jbkv_cli.metrics.psnr import mse_per_frame, psnr_from_mse
from jbkv_cli.models.tiny import load_model
from jbkv_cli.quant.qvg import QVGTensor

ROOT = Path(__file__).resolve().parents[1]
LAYOUTS = ("post-rope", "pre-rope")
T95 = {n: t for n, t in [(9, 2.262), (19, 2.093), (39, 2.023), (79, 1.990)]}


class KeyErrors:
    """Wraps :meth:`ChunkKVCache.commit` to record each committed chunk's key errors."""

    def __init__(self) -> None:
        self.rel_mse: list[float] = []
        self.residual: list[float] = []
        self._commit = ChunkKVCache.commit

    def __enter__(self) -> KeyErrors:
        record = self

        def commit(cache, k, v, position=None):
            record._commit(cache, k, v, position)
            stored = cache.chunks[-1].sides["key"].parts[0]
            if isinstance(stored, QVGTensor):
                x = k.float()
                energy = float(x.square().sum())
                record.rel_mse.append(float((stored.dequantize() - x).square().sum()) / energy)
                left = x - stored.smoothing()
                record.residual.append(float(left.square().sum()) / energy)

        ChunkKVCache.commit = commit
        return self

    def __exit__(self, *exc) -> None:
        ChunkKVCache.commit = self._commit


def psnr(ref: torch.Tensor, test: torch.Tensor) -> float:
    return float(psnr_from_mse(mse_per_frame(ref, test)).mean())


def paired(diffs: list[float]) -> dict[str, float]:
    n = len(diffs)
    mean = statistics.fmean(diffs)
    sd = statistics.stdev(diffs) if n > 1 else 0.0
    t = T95.get(n - 1, 1.96)
    half = t * sd / math.sqrt(n) if n > 1 else 0.0
    return {
        "n": n,
        "mean": mean,
        "sd": sd,
        "ci95": [mean - half, mean + half],
        "positive": sum(d > 0 for d in diffs),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", default="tiny")
    ap.add_argument("--seeds", default="0,1,2,3")
    ap.add_argument("--bits", type=int, default=2)
    ap.add_argument("--corrections", default="none,taylor")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/qvg_prerope.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = load_model()
    prompts = read_prompts(args.prompts, None, "tiny")
    seeds = parse_seeds(args.seeds)
    corrections = args.corrections.split(",")
    specs = {
        (c, layout): KVSpec.build("qvg", args.bits, 64, c, layout=layout)
        for c in corrections
        for layout in LAYOUTS
    }
    rows, start = [], time.perf_counter()
    for prompt in prompts:
        for seed in seeds:
            ref = model.generate(prompt, seed, FULL_PRECISION).frames
            for (corr, layout), spec in specs.items():
                with KeyErrors() as errors:
                    video = model.generate(prompt, seed, spec)
                rows.append(
                    {
                        "prompt": prompt,
                        "seed": seed,
                        "correction": corr,
                        "layout": layout,
                        "label": video.info["kv"],
                        "psnr": psnr(ref, video.frames),
                        "psnr_pooled": float(
                            psnr_from_mse(mse_per_frame(ref, video.frames).mean())
                        ),
                        "key_rel_mse": statistics.fmean(errors.rel_mse),
                        "residual_share": statistics.fmean(errors.residual),
                        "kv_cache_bytes": video.kv_cache_bytes,
                    }
                )
            print(f"{prompt!r} seed {seed}: {time.perf_counter() - start:.0f} s", flush=True)
    summary = {}
    for corr in corrections:
        by = {
            layout: {
                (r["prompt"], r["seed"]): r
                for r in rows
                if r["correction"] == corr and r["layout"] == layout
            }
            for layout in LAYOUTS
        }
        keys = sorted(by["post-rope"])
        entry = {}
        for metric in ("psnr", "psnr_pooled", "key_rel_mse", "residual_share"):
            post = [by["post-rope"][k][metric] for k in keys]
            pre = [by["pre-rope"][k][metric] for k in keys]
            entry[metric] = {
                "post-rope": statistics.fmean(post),
                "pre-rope": statistics.fmean(pre),
                "pre_minus_post": paired([a - b for a, b in zip(pre, post, strict=True)]),
            }
        summary[corr] = entry
    for corr, entry in summary.items():
        for metric, m in entry.items():
            d = m["pre_minus_post"]
            print(
                f"{corr:7s} {metric:15s} post {m['post-rope']:.4g}  pre {m['pre-rope']:.4g}  "
                f"pre−post {d['mean']:+.4g} [{d['ci95'][0]:+.4g}, {d['ci95'][1]:+.4g}]  "
                f"pre > post in {d['positive']}/{d['n']}"
            )
    out = {
        "bits": args.bits,
        "prompts": prompts,
        "seeds": seeds,
        "summary": summary,
        "rows": rows,
        "seconds": time.perf_counter() - start,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
