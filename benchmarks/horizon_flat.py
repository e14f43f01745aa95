"""Flat memory and time over a long rollout of the embedded model: the cache bytes after each
commit and the seconds of each chunk, 16-bit vs INT2 (RTN g32) vs INT2 + taylor
(``tiny_generate.py``'s variants), at 64 chunks (its rolling window of 2 chunks: what a cache
holds stops growing once the window is full).

    python benchmarks/horizon_flat.py [--chunks 64] [--threads 2] [--repeats 3]

Each variant runs its video after a warm-up video (a video is one loop: its chunks cannot be
interleaved with another's), so read the ratio within a row, not across rows. Per variant: the
cache bytes at chunk 8 and at the last, the chunk from which they never change, and the median
seconds per chunk over chunks 5-12 and over the last 8 of ``--repeats`` videos (seeds 0, 1, …),
with their ratio (1.0: flat). Writes benchmarks/results/horizon_flat.json.
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from pathlib import Path

import torch
from tiny_generate import PROMPT, VARIANTS  # its three variants (run as a script)

from jbkv_cli.kvcache.spec import KVSpec
from jbkv_cli.models.loop import LoopCaches
from jbkv_cli.models.tiny import load_model

ROOT = Path(__file__).resolve().parents[1]


def rollout(model, spec: KVSpec, seed: int) -> tuple[list[int], list[float]]:
    """One video: the caches' bytes after each commit pass, the seconds of each chunk."""
    held: list[int] = []
    stamps: list[float] = []
    original = LoopCaches.committed

    def committed(self: LoopCaches) -> None:
        original(self)
        held.append(sum(c.nbytes for c in self.caches))

    LoopCaches.committed = committed  # type: ignore[method-assign]
    try:
        t0 = time.perf_counter()
        stamps.append(t0)
        model.generate(
            PROMPT, seed, spec, progress=lambda done, n: stamps.append(time.perf_counter())
        )
    finally:
        LoopCaches.committed = original  # type: ignore[method-assign]
    return held, [b - a for a, b in itertools.pairwise(stamps)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--chunks", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/horizon_flat.json")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    model = load_model(num_chunks=args.chunks)
    early, late = slice(4, 12), slice(args.chunks - 8, args.chunks)
    rows = {}
    print(
        f"{'variant':28s} {'bytes @8':>10s} {'bytes @last':>11s} {'flat from':>9s} {'s/chunk 5-12':>12s} "
        f"{'s/chunk last 8':>14s} {'ratio':>6s}"
    )
    for name, spec in VARIANTS.items():
        load_model(num_chunks=8).generate(PROMPT, 0, spec)  # warm-up
        runs = [rollout(model, spec, seed) for seed in range(args.repeats)]
        held = runs[0][0]
        assert all(r[0] == held for r in runs)  # the bytes do not depend on the seed
        a = statistics.median(s for _, seconds in runs for s in seconds[early])
        b = statistics.median(s for _, seconds in runs for s in seconds[late])
        flat = next(i for i in range(len(held)) if all(h == held[i] for h in held[i:])) + 1
        rows[name] = {
            "bytes_per_commit": held,
            "seconds_per_chunk": [r[1] for r in runs],
            "bytes_at_8": held[7],
            "bytes_at_last": held[-1],
            "seconds_early": a,
            "seconds_late": b,
            "late_over_early": b / a,
        }
        print(f"{name:28s} {held[7]:10d} {held[-1]:11d} {flat:9d} {a:12.4f} {b:14.4f} {b / a:6.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {
                "chunks": args.chunks,
                "threads": args.threads,
                "settings": model.settings,
                "variants": rows,
            },
            indent=1,
        )
        + "\n"
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
