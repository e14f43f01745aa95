"""Every registered compression method on one chunk: quantize time relative to RTN, effective
bits measured from the stored tensors, key MSE and the logit MSE of the history's queries.

    python benchmarks/methods.py [--tokens 4680 --heads 12 --dim 128 --bits 2 --group 64]

The defaults are Self-Forcing's shapes (one chunk of 4,680 tokens, 12 heads × 128; QuantWM's
K = 256 applies uncapped there). Beside the registered methods, ``quantwm m256`` is QuantWM
scoring all 256 centroids by ``S`` instead of its top-4 prefilter by ``d_Q`` (its Table 11:
≈ 2× slower for no gain); the ``prefilter`` line gives that time ratio, measured in the same run.

One process, best of ``--repeat`` rounds over all methods (one thread by default) (these
machines are noisy: compare the ratios, not the seconds). Keys and queries are synthetic but
video-like: tokens drawn around a few centres per head, queries whose energy sits in a few
directions (what query-aware methods exploit). Writes benchmarks/results/methods.json and
prints a table.
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
    ap.add_argument("--tokens", type=int, default=4680)  # one Self-Forcing chunk (3 frames)
    ap.add_argument("--heads", type=int, default=12)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--bits", type=int, default=2)
    ap.add_argument("--group", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    k, q = _data(args.tokens, args.heads, args.dim)
    stats = QueryStats()
    stats.update(q, args.heads)
    fresh = _data(args.tokens, args.heads, args.dim)[1]  # later queries, same distribution
    methods = {name: build_method(name, args.bits, args.group) for name in METHODS}
    methods["quantwm m256"] = build_method("quantwm", args.bits, args.group, candidates=256)
    best = dict.fromkeys(methods, float("inf"))
    for _ in range(args.repeat):  # round-robin, so a noisy moment hits every method alike
        for name, method in methods.items():
            start = time.perf_counter()
            method.quantize(k, "key", stats)
            best[name] = min(best[name], time.perf_counter() - start)
    results = {}
    for name, method in methods.items():
        t = method.quantize(k, "key", stats)
        err = k.float() - t.dequantize().float()
        results[name] = {
            "seconds": best[name],
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
    prefilter = {
        "k_eff": methods["quantwm"].effective_centroids(args.tokens),
        "all_over_top4": results["quantwm m256"]["seconds"] / results["quantwm"]["seconds"],
        "top4_over_rtn": results["quantwm"]["time_ratio"],
        "all_over_rtn": results["quantwm m256"]["time_ratio"],
        "logit_mse_all_over_top4": results["quantwm m256"]["logit_mse"]
        / results["quantwm"]["logit_mse"],
    }
    Console().print(
        f"prefilter (K = {prefilter['k_eff']}): scoring all centroids takes "
        f"{prefilter['all_over_top4']:.2f}× the top-4 prefilter's time "
        f"(logit MSE {prefilter['logit_mse_all_over_top4']:.3f}×); top-4 "
        f"{prefilter['top4_over_rtn']:.1f}× rtn, all {prefilter['all_over_rtn']:.1f}× rtn"
    )
    OUT.parent.mkdir(parents=True, exist_ok=True)
    meta = {"args": vars(args), "torch": torch.__version__, "machine": platform.machine()}
    doc = {"meta": meta, "methods": results, "quantwm_prefilter": prefilter}
    OUT.write_text(json.dumps(doc, indent=2) + "\n")


if __name__ == "__main__":
    main()
