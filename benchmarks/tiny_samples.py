"""Sample frames of the tiny model as one PNG: a row per (prompt, KV variant), every 2nd frame.

python benchmarks/tiny_samples.py [--weights PATH] [--out benchmarks/results/tiny_samples.png]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
import torch
from PIL import Image

from jbkv_cli.cli.options import read_prompts
from jbkv_cli.kvcache.spec import KVSpec
from jbkv_cli.models.tiny import load_model

ROOT = Path(__file__).resolve().parents[1]
VARIANTS = {
    "full precision": KVSpec(),
    "INT4 rtn": KVSpec.build("rtn", bits=4),
    "INT2 rtn": KVSpec.build("rtn", bits=2),
    "INT2 rtn +taylor": KVSpec.build("rtn", bits=2, correction="taylor"),
}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--weights", type=Path, default=None)
    ap.add_argument("--prompts", default="tiny", help="prompt file or named set")
    ap.add_argument("--count", type=int, default=10, help="number of prompts")
    ap.add_argument("--num-chunks", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--variants", default="full precision", help="comma list, or 'all'")
    ap.add_argument(
        "--out", type=Path, default=ROOT / "benchmarks" / "results" / "tiny_samples.png"
    )
    args = ap.parse_args()
    torch.set_num_threads(2)
    model = load_model(weights=args.weights, num_chunks=args.num_chunks)
    names = list(VARIANTS) if args.variants == "all" else args.variants.split(",")
    prompts = read_prompts(args.prompts, None, "tiny")
    rows = []
    for prompt in prompts[: args.count]:
        for name in names:
            frames = model.generate(prompt, args.seed, VARIANTS[name]).frames.numpy()
            strip = np.concatenate([np.pad(f, ((1, 1), (1, 1), (0, 0))) for f in frames[::2]], 1)
            rows.append(strip)
            print(prompt, "|", name)
    image = Image.fromarray(np.concatenate(rows, 0))
    image = image.resize((image.width * 3, image.height * 3), Image.NEAREST)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    image.save(args.out)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
