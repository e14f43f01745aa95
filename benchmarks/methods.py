"""Every registered compression method on one chunk: quantize time relative to RTN, effective
bits measured from the stored tensors, key MSE and the logit MSE of the history's queries.

    python benchmarks/methods.py [--tokens 1560 --heads 8 --dim 128 --bits 2 --group 32]

One process, best of ``--repeat`` per method (these machines are noisy: compare the ratios, not
the seconds). Keys and queries are synthetic but video-like: tokens drawn around a few centres
per head, queries whose energy sits in a few directions (what query-aware methods exploit).
Writes benchmarks/results/methods.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from jbkv_cli.quant import METHODS, build_method
from jbkv_cli.quant.queries import QueryStats

OUT = Path(__file__).resolve().parent / "results" / "methods.json"


def _data(tokens: int, heads: int, dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    centres = 2.0 * torch.randn(1, heads, 16, dim, generator=g)
    pick = torch.randint(0, 16, (1, heads, tokens), generator=g)
    k = centres.gather(2, pick.unsqueeze(-1).expand(-1, -1, -1, dim))
    k = k + 0.5 * torch.randn(1, heads, tokens, dim, generator=g)
    basis = torch.linalg.qr(torch.randn(1, heads, dim, 4, generator=g)).Q
    q = 3.0 * torch.randn(1, heads, 2 * tokens, 4, generator=g) @ basis.transpose(-1, -2)
    return k.bfloat16(), q + 0.3 * torch.randn(q.shape, generator=g)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=1560)  # one Self-Forcing frame at 480×832
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--bits", type=int, default=2)
    ap.add_argument("--group", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    k, q = _data(args.tokens, args.heads, args.dim)
    stats = QueryStats()
    stats.update(q, args.heads)
    fresh = _data(args.tokens, args.heads, args.dim)[1]  # later queries, same distribution
    results = {}
    for name in METHODS:
        method = build_method(name, args.bits, args.group)
        best = float("inf")
        for _ in range(args.repeat):
            start = time.perf_counter()
            t = method.quantize(k, "key", stats)
            best = min(best, time.perf_counter() - start)
        err = k.float() - t.dequantize().float()
        results[name] = {
            "seconds": best,
            "effective_bits": t.effective_bits,
            "key_mse": float(err.square().mean()),
            "logit_mse": float((fresh @ err.transpose(-1, -2)).square().mean()),
        }
    base = results["rtn"]
    table = Table(
        title=f"INT{args.bits} g{args.group}, keys [1, {args.heads}, {args.tokens}, "
        f"{args.dim}] BF16, {torch.get_num_threads()} threads"
    )
    for col in ("method", "time / rtn", "eff. bits", "key MSE / rtn", "logit MSE / rtn"):
        table.add_column(col, justify="left" if col == "method" else "right")
    for name, r in results.items():
        r["time_ratio"] = r["seconds"] / base["seconds"]
        r["key_mse_ratio"] = r["key_mse"] / base["key_mse"]
        r["logit_mse_ratio"] = r["logit_mse"] / base["logit_mse"]
        table.add_row(
            name,
            f"{r['time_ratio']:.2f}×",
            f"{r['effective_bits']:.3f}",
            f"{r['key_mse_ratio']:.3f}",
            f"{r['logit_mse_ratio']:.3f}",
        )
    Console().print(table)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    meta = {"args": vars(args), "torch": torch.__version__, "machine": platform.machine()}
    OUT.write_text(json.dumps({"meta": meta, "methods": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
