"""Seconds per video of the tiny model: full-precision cache (fp32 on a CPU; the BF16 reference
of the GPU models) vs INT2 vs INT2 + Taylor.

    python benchmarks/tiny_generate.py [--repeats 3] [--threads 2]

The variants run interleaved in one process (round-robin, after a warm-up video each), so the
ratios are measured side by side. Prints a table and writes benchmarks/results/tiny_generate.json.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch

from jbkv_cli.kvcache.spec import KVSpec
from jbkv_cli.models.tiny import load_model

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "a red circle moves right on a dark background"
VARIANTS = {
    "full-precision cache (fp32)": KVSpec(),
    "INT2 rtn g32": KVSpec.build("rtn", bits=2, group_size=32),
    "INT2 rtn g32 +taylor": KVSpec.build("rtn", bits=2, group_size=32, correction="taylor"),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results" / "tiny_generate.json"
    )
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = load_model()
    times: dict[str, list[float]] = {k: [] for k in VARIANTS}
    nbytes: dict[str, int] = {}
    for name, spec in VARIANTS.items():  # warm-up
        nbytes[name] = model.generate(PROMPT, 0, spec).kv_cache_bytes
    for r in range(args.repeats):
        for name, spec in VARIANTS.items():
            t0 = time.perf_counter()
            model.generate(PROMPT, r, spec)
            times[name].append(time.perf_counter() - t0)
    base = statistics.median(times["full-precision cache (fp32)"])
    rows = {}
    print(f"{'variant':24s} {'s/video':>8s} {'ratio':>6s} {'cache bytes':>12s}")
    for name in VARIANTS:
        med = statistics.median(times[name])
        rows[name] = {
            "seconds_median": med,
            "seconds": times[name],
            "ratio_vs_full_precision": med / base,
            "kv_cache_bytes": nbytes[name],
        }
        print(f"{name:24s} {med:8.3f} {med / base:6.2f} {nbytes[name]:12d}")
    result = {
        "prompt": PROMPT,
        "settings": model.settings,
        "threads": args.threads,
        "repeats": args.repeats,
        "torch": torch.__version__,
        "machine": platform.processor() or platform.machine(),
        "variants": rows,
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
