"""Cost of the correction: fused/flex/dense-mask corrected attention vs uncorrected, one run.

Ratios are measured side by side in one process (best of N), because these machines are noisy.
Also: the ``signed`` correction in the same fused form (on RTN keys, where it is taylor's
channels, and on TurboQuant-MSE keys, which it also unshrinks), the fused form with its channels
zero-padded to a multiple of 8 (the default) vs unpadded vs plain SDPA on the same keys (the
three timed round-robin), the padding floor (plain SDPA with the head dim padded to the fused
form's width), quantize throughput (GB/s of BF16 input) and measured cache bytes vs a BF16 cache.

    python benchmarks/attention.py [--repeats 5] [--quick]
"""

from __future__ import annotations

import argparse
import importlib
import json
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.table import Table

from jbkv_cli.attention import CachedKV, attend
from jbkv_cli.attention.attend import sdpa
from jbkv_cli.attention.correction import fused_width
from jbkv_cli.kvcache import ChunkKVCache, KVSpec
from jbkv_cli.quant import quantize_kv


def best_of(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def best_of_each(fns: dict, repeats: int) -> dict[str, float]:
    """Best time of each function, timed round-robin so drift hits all of them alike."""
    for fn in fns.values():
        fn()  # warm-up
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(repeats):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return {name: min(ts) for name, ts in times.items()}


def compiled_flex(q, k, v, cached: CachedKV, scale: float):
    """FlexAttention compiled with the Taylor score_mod (None if compile is unavailable)."""
    from torch.nn.attention.flex_attention import flex_attention

    groups = cached.k_step.shape[-1]
    qn2 = q.float().unflatten(-1, (groups, -1)).square().sum(-1)
    d2 = cached.k_step.square()
    lc, coef = cached.num_tokens, -scale * scale / 24.0

    def score_mod(score, b, h, q_idx, kv_idx):
        kv = torch.clamp(kv_idx, max=lc - 1)
        bias = qn2[b, h, q_idx, 0] * d2[b, h, kv, 0]
        for j in range(1, groups):
            bias = bias + qn2[b, h, q_idx, j] * d2[b, h, kv, j]
        return score + torch.where(kv_idx < lc, coef * bias, 0.0)

    fn = torch.compile(flex_attention, dynamic=False)
    try:
        fn(q, k, v, score_mod=score_mod, scale=scale)
    except Exception as exc:  # no compiler / unsupported on this build
        return None, f"{type(exc).__name__}"
    return (lambda: fn(q, k, v, score_mod=score_mod, scale=scale)), None


def run(d: int, heads: int, lq: int, lc: int, repeats: int, group: int = 32) -> dict:
    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, heads, lq, d, generator=g)
    kc, vc = torch.randn(1, heads, lc, d, generator=g), torch.randn(1, heads, lc, d, generator=g)
    k, v = torch.randn(1, heads, lq, d, generator=g), torch.randn(1, heads, lq, d, generator=g)
    scale = d**-0.5
    cached = CachedKV.from_quantized(quantize_kv(kc, 2, group), quantize_kv(vc, 2, group))
    kk, vv = torch.cat([cached.k, k], -2), torch.cat([cached.v, v], -2)

    # the baseline pays the same [cached | current] concatenation as the corrected call
    base = best_of(lambda: attend(q, k, v, cached, scale=scale, correction="none"), repeats)
    row = {"d": d, "heads": heads, "lq": lq, "cached": lc, "current": lq, "uncorrected_s": base}
    for name in ("fused", "reference", "flex"):
        if name == "flex" and lq * lc > 1 << 22:
            row["flex_eager_ratio"] = None  # eager flex materialises scores per head: too slow
            continue
        t = best_of(
            lambda n=name: attend(q, k, v, cached, scale=scale, correction="taylor", backend=n),
            repeats,
        )
        row[f"{name}_ratio"] = t / base
    signed = best_of(lambda: attend(q, k, v, cached, scale=scale, correction="signed"), repeats)
    row["signed_ratio"] = signed / base
    tq = CachedKV.from_quantized(*(quantize_kv(t, 2, group, "turboquant-mse") for t in (kc, vc)))
    tq_base = best_of(lambda: attend(q, k, v, tq, scale=scale, correction="none"), repeats)
    tq_signed = best_of(lambda: attend(q, k, v, tq, scale=scale, correction="signed"), repeats)
    tq_taylor = best_of(lambda: attend(q, k, v, tq, scale=scale, correction="taylor"), repeats)
    row["tq_signed_ratio"], row["tq_taylor_ratio"] = tq_signed / tq_base, tq_taylor / tq_base
    groups = cached.k_step.shape[-1]
    fused = importlib.import_module("jbkv_cli.attention.attend")._fused
    pad_t = best_of_each(
        {
            "padded": lambda: fused(q, k, v, cached, scale, -1.0, "taylor", multiple=8),
            "unpadded": lambda: fused(q, k, v, cached, scale, -1.0, "taylor", multiple=1),
            "sdpa": lambda: sdpa(q, kk, vv, scale),
        },
        repeats,
    )
    row["width_padded"], row["width_unpadded"] = fused_width(d, groups), d + groups
    row["padded_over_unpadded"] = pad_t["padded"] / pad_t["unpadded"]
    row["padded_over_sdpa"] = pad_t["padded"] / pad_t["sdpa"]
    row["unpadded_over_sdpa"] = pad_t["unpadded"] / pad_t["sdpa"]
    padded = [F.pad(x, (0, fused_width(d, groups) - d)) for x in (q, kk, vv)]
    row["padded_floor_ratio"] = best_of(lambda: sdpa(*padded, scale), repeats) / best_of(
        lambda: sdpa(q, kk, vv, scale), repeats
    )
    fn, why = compiled_flex(q, kk, vv, cached, scale)
    row["flex_compiled_ratio"] = best_of(fn, repeats) / base if fn else None
    row["flex_compiled_note"] = why

    x = torch.randn(1, heads, lc, d).bfloat16()
    t = best_of(lambda: quantize_kv(x, 2, group), repeats)
    row["quantize_gb_s"] = x.numel() * 2 / t / 1e9
    bf16, int2 = ChunkKVCache(KVSpec()), ChunkKVCache(KVSpec.build("rtn", 2, group_size=group))
    for c in (bf16, int2):
        c.commit(x, x)
    row["cache_bytes_bf16"], row["cache_bytes_int2"] = bf16.nbytes, int2.nbytes
    row["cache_ratio"] = int2.nbytes / bf16.nbytes
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="small shapes (smoke run)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/attention.json"))
    args = parser.parse_args()
    lq, lc = (128, 512) if args.quick else (1024, 4096)
    rows = [run(d, 8, lq, lc, args.repeats) for d in (64, 128)]

    table = Table(
        title=f"Corrected attention cost, CPU, {torch.get_num_threads()} threads, "
        f"Lq={lq}, cached={lc}, current={lq}, 8 heads, INT2 g=32 (best of {args.repeats})"
    )
    for col in (
        "d",
        "uncorrected ms",
        "padded SDPA",
        "fused/unc",
        "signed/unc",
        "TQ-MSE taylor | signed",
        "dense mask/unc",
        "flex eager/unc",
        "flex compiled/unc",
        "quantize GB/s",
        "INT2 bytes / BF16",
    ):
        table.add_column(col, justify="right")

    def fmt(x):
        return "n/a" if x is None else f"{x:.3f}x"

    for r in rows:
        table.add_row(
            str(r["d"]),
            f"{r['uncorrected_s'] * 1e3:.1f}",
            fmt(r["padded_floor_ratio"]),
            fmt(r["fused_ratio"]),
            fmt(r["signed_ratio"]),
            f"{fmt(r['tq_taylor_ratio'])} | {fmt(r['tq_signed_ratio'])}",
            fmt(r["reference_ratio"]),
            fmt(r.get("flex_ratio", r.get("flex_eager_ratio"))),
            fmt(r["flex_compiled_ratio"]),
            f"{r['quantize_gb_s']:.2f}",
            f"{r['cache_ratio']:.4f}",
        )
    console = Console(width=190)
    console.print(table)
    pads = Table(title="Fused taylor form, channels zero-padded to a multiple of 8 (round-robin)")
    for col in ("d", "width", "padded / unpadded", "padded / SDPA", "unpadded / SDPA"):
        pads.add_column(col, justify="right")
    for r in rows:
        pads.add_row(
            str(r["d"]),
            f"{r['width_unpadded']} -> {r['width_padded']}",
            fmt(r["padded_over_unpadded"]),
            fmt(r["padded_over_sdpa"]),
            fmt(r["unpadded_over_sdpa"]),
        )
    console.print(pads)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps(
            {"torch": torch.__version__, "threads": torch.get_num_threads(), "rows": rows}, indent=2
        )
    )
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
