"""Quality floors of the tiny model: KV variants vs the full-precision cache, paired.

    python benchmarks/tiny_eval.py [--seeds 4] [--prompts prompts/tiny.txt] [--weights PATH]

For every (prompt, seed) the full-precision video is generated once; every variant is compared
with it (PSNR on uint8 frames, peak 255, per frame then mean; identical frames count as 100 dB
and are reported). ΔP_S comes from an ``AttentionRecorder`` observing the variant's generation.
Prints a table (mean ± standard error over videos) and writes benchmarks/results/tiny_eval.json.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from jbkv_cli.attention import AttentionRecorder
from jbkv_cli.cli.options import read_prompts
from jbkv_cli.kvcache.spec import KVSpec
from jbkv_cli.metrics.psnr import PSNR_CAP_DB, mse_per_frame, psnr_from_mse
from jbkv_cli.metrics.stats import aggregate
from jbkv_cli.models.tiny import load_model

ROOT = Path(__file__).resolve().parents[1]


def variants() -> dict[str, KVSpec]:
    """INT4 (uncorrected) and INT2 (none / taylor / exact), for RTN and QuaRot, g = 32."""
    out = {}
    for q in ("rtn", "quarot"):
        out[f"INT4 {q} g32 none"] = KVSpec.build(q, bits=4, group_size=32)
        for corr in ("none", "taylor", "exact"):
            out[f"INT2 {q} g32 {corr}"] = KVSpec(
                quantizer=q, bits=2, group_size=32, correction=corr
            )
    return out


def paired(a: list[float], b: list[float]) -> tuple[float, float]:
    """Mean ± SE of the per-video differences ``a - b``."""
    return mean_se([x - y for x, y in zip(a, b, strict=True)])


def psnr(a: torch.Tensor, b: torch.Tensor) -> float:
    """jbkv's per-frame PSNR (uint8, peak 255, identical frames capped), mean over frames."""
    return float(psnr_from_mse(mse_per_frame(a, b)).mean())


def mean_se(xs: list[float]) -> tuple[float, float]:
    agg = aggregate(xs)
    return agg["mean"], agg["se"] or 0.0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--prompts", default="tiny", help="prompt file or named set")
    ap.add_argument("--seeds", type=int, default=4)
    ap.add_argument("--weights", type=Path, default=None)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", default=None, help="substring filter on variant names")
    ap.add_argument(
        "--exact-seeds",
        type=int,
        default=None,
        help="run the exact correction only for seeds below this (default: all)",
    )
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "tiny_eval.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = load_model(weights=args.weights)
    prompts = read_prompts(args.prompts, None, "tiny")
    specs = {k: v for k, v in variants().items() if args.only is None or args.only in k}
    exact_seeds = args.seeds if args.exact_seeds is None else args.exact_seeds
    rows: dict[str, dict[str, list]] = {k: {"psnr": [], "dps": [], "keys": []} for k in specs}
    start = time.time()
    for prompt in prompts:
        for seed in range(args.seeds):
            ref = model.generate(prompt, seed, KVSpec()).frames
            for name, spec in specs.items():
                if spec.correction == "exact" and seed >= exact_seeds:
                    continue
                rec = AttentionRecorder(max_queries=64, noise_model=False)
                video = model.generate(prompt, seed, spec, observer=rec).frames
                rows[name]["psnr"].append(psnr(video, ref))
                rows[name]["dps"].append(rec.summary()["delta_ps"])
                rows[name]["keys"].append((prompt, seed))
    result = {"settings": model.settings, "prompts": prompts, "seeds": args.seeds, "variants": {}}
    print(f"{'variant':28s} {'PSNR dB':>16s} {'ΔP_S':>22s}")
    for name, r in rows.items():
        if not r["psnr"]:
            continue
        p, pse = mean_se(r["psnr"])
        d, dse = mean_se(r["dps"])
        result["variants"][name] = {
            "psnr_mean": p,
            "psnr_se": pse,
            "delta_ps_mean": d,
            "delta_ps_se": dse,
            "videos": len(r["psnr"]),
            "psnr": r["psnr"],
            "delta_ps": r["dps"],
            "identical_frames_as_db": PSNR_CAP_DB,
        }
        print(f"{name:28s} {p:8.2f} ± {pse:5.2f} {d:+.5f} ± {dse:.5f}")
    result["recovery"] = {}
    for q in ("rtn", "quarot"):
        base = f"INT2 {q} g32 none"
        if base not in rows or f"INT4 {q} g32 none" not in rows:
            continue
        for corr in ("taylor", "exact"):
            name = f"INT2 {q} g32 {corr}"
            if name not in rows or not rows[name]["psnr"]:
                continue
            keys = set(rows[name]["keys"])

            def on(variant: str, keys: set = keys) -> list[float]:
                r = rows[variant]
                return [x for x, k in zip(r["psnr"], r["keys"], strict=True) if k in keys]

            gap, gap_se = paired(on(f"INT4 {q} g32 none"), on(base))
            gain, gain_se = paired(on(name), on(base))
            frac = gain / gap if gap else float("nan")
            result["recovery"][f"{q} {corr}"] = {
                "gain_db": gain,
                "gain_se": gain_se,
                "gap_db": gap,
                "gap_se": gap_se,
                "fraction_of_gap": frac,
                "videos": len(keys),
            }
            print(
                f"{q} +{corr} ({len(keys)} videos): {gain:+.2f} ± {gain_se:.2f} dB over INT2, "
                f"INT4-INT2 gap {gap:.2f} ± {gap_se:.2f} dB: {100 * frac:.0f}% recovered"
            )
    result["wall_seconds"] = round(time.time() - start, 1)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out} ({result['wall_seconds']} s)")


if __name__ == "__main__":
    main()
