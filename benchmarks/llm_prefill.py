"""Corrected partial-prefill attention at A = B = 8k and 16k: jbkv's fused path vs the paper's
dense float mask, on a CPU, as ratios measured in one run.

One attention layer with a 7B-like head layout (Llama-3.1-8B / Mistral-7B: 32 query heads over
8 KV heads, head dim 128), float32, batch 1. The cached prefix (``A`` tokens) is stored INT2
(RTN, group 32); the current chunk (``B`` tokens) is exact and causal. Cases:

- ``sdpa``: uncorrected, ``attend(correction="none", causal=True)`` (blocked SDPA over the
  dequantized prefix and the chunk): the baseline of every ratio;
- ``fused``: corrected (Taylor), ``attend(correction="taylor", causal=True)``: the augmented
  channels through the same blocked SDPA, no ``[Hq, B, A+B]`` tensor;
- ``sdpa-1call``: uncorrected as one SDPA call with a ``[B, A+B]`` boolean causal mask (the way
  transformers' ``sdpa`` attention runs a chunk after a cache);
- ``dense``: corrected the paper's way, one SDPA call with a dense float mask ``[1, Hq, B, A+B]``
  (−bias on cached columns, −inf above the diagonal), whose size grows as ``Hq·B·(A+B)``.

Peak memory: each case runs once in its own fresh process under the same address-space cap
(``--cap-gib``), so the dense mask that does not fit fails to allocate there (the paper's OOM,
reproduced) while the others run; its mask size is reported exactly (``numel × 4`` bytes). The
peak is the rise of the process's resident set during the call (``VmHWM`` after resetting it,
minus ``VmRSS`` before; glibc's mmap threshold fixed, so freed buffers leave the resident set).
Time: one more process per size runs the cases that fit, alternating them for ``--rounds``
rounds, and keeps each case's best wall time; alternating in one process shares the machine's
changing load between the cases (these machines are shared and noisy).

    nice -n 10 python benchmarks/llm_prefill.py [--sizes 2048,8192,16384] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

CASES = ("sdpa", "fused", "sdpa-1call", "dense")
HQ, HKV, D, GROUP = 32, 8, 128, 32


def _status(key: str) -> int:
    """A ``/proc/self/status`` field in bytes."""
    text = Path("/proc/self/status").read_text()
    return int(re.search(rf"{key}:\s+(\d+) kB", text).group(1)) * 1024


def _inputs(n: int):
    import torch

    from jbkv_cli.attention import CachedKV
    from jbkv_cli.quant import quantize_kv

    g = torch.Generator().manual_seed(0)
    q = torch.randn(1, HQ, n, D, generator=g)
    k, v = torch.randn(1, HKV, n, D, generator=g), torch.randn(1, HKV, n, D, generator=g)
    kc, vc = torch.randn(1, HKV, n, D, generator=g), torch.randn(1, HKV, n, D, generator=g)
    cached = CachedKV.from_quantized(quantize_kv(kc, 2, GROUP), quantize_kv(vc, 2, GROUP))
    return q, k, v, cached


def _case(name: str, q, k, v, cached):
    import torch
    import torch.nn.functional as F

    from jbkv_cli.attention import attend
    from jbkv_cli.attention.attend import concat_kv, visible
    from jbkv_cli.attention.correction import taylor_bias

    scale = D**-0.5
    if name == "sdpa":
        return lambda: attend(q, k, v, cached, scale=scale, correction="none", causal=True)
    if name == "fused":
        return lambda: attend(q, k, v, cached, scale=scale, correction="taylor", causal=True)
    lc, n = cached.num_tokens, q.shape[-2]
    if name == "sdpa-1call":

        def one_call():
            kk, vv = concat_kv(cached, k, v)
            mask = visible(0, n, lc, lc + n)
            return F.scaled_dot_product_attention(
                q, kk, vv, attn_mask=mask, scale=scale, enable_gqa=True
            )

        return one_call

    def dense():
        kk, vv = concat_kv(cached, k, v)
        mask = torch.zeros(1, HQ, n, lc + n)  # the paper's [H, B, A+B] score-sized tensor
        mask[..., :lc] = -taylor_bias(q, cached.k_step, scale)
        mask.masked_fill_(~visible(0, n, lc, lc + n), float("-inf"))
        return F.scaled_dot_product_attention(
            q, kk, vv, attn_mask=mask, scale=scale, enable_gqa=True
        )

    return dense


def worker(name: str, n: int, rounds: int, threads: int) -> dict:
    """``name``: one case, its first call's peak memory and time; ``time:A,B,..``: those
    cases alternated for ``rounds`` rounds, each one's best time."""
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    q, k, v, cached = _inputs(n)
    if not name.startswith("time:"):
        fn = _case(name, q, k, v, cached)
        before = _status("VmRSS")
        Path("/proc/self/clear_refs").write_text("5")  # reset VmHWM to the current RSS
        start = time.perf_counter()
        out = fn()
        seconds = time.perf_counter() - start
        peak = _status("VmHWM") - before
        del out
        return {"case": name, "n": n, "seconds": seconds, "peak_bytes": peak}
    cases = name.removeprefix("time:").split(",")
    fns = {c: _case(c, q, k, v, cached) for c in cases}
    best = dict.fromkeys(cases, float("inf"))
    for _ in range(rounds):
        for c in cases:
            start = time.perf_counter()
            out = fns[c]()
            best[c] = min(best[c], time.perf_counter() - start)
            del out
    return {"n": n, "best_seconds": best}


def run_case(name: str, n: int, rounds: int, cap_gib: float, threads: int) -> dict:
    """``worker`` in a child process under an address-space cap; a failure is recorded."""
    cap = int(cap_gib * 2**30)

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))

    cmd = [sys.executable, __file__, "--worker", name, "--n", str(n), "--rounds", str(rounds)]
    cmd += ["--threads", str(threads)]
    # a fixed mmap threshold: glibc's dynamic one would keep freed per-block buffers in the
    # heap, so the resident set would count memory no longer live
    env = dict(os.environ, OMP_NUM_THREADS=str(threads), MALLOC_MMAP_THRESHOLD_="131072")
    proc = subprocess.run(cmd, capture_output=True, text=True, preexec_fn=limit, env=env)
    if proc.returncode == 0:
        return json.loads(proc.stdout.strip().splitlines()[-1])
    tail = (proc.stderr.strip().splitlines() or ["?"])[-1]
    return {"case": name, "n": n, "seconds": None, "peak_bytes": None, "failed": tail[:200]}


def dense_mask_bytes(n: int) -> int:
    return HQ * n * (2 * n) * 4


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="2048,8192,16384", help="A = B values")
    parser.add_argument("--rounds", type=int, default=3, help="alternating rounds for time")
    parser.add_argument("--cap-gib", type=float, default=12.0, help="address-space cap per case")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per case")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/llm_prefill.json"))
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(args.worker, args.n, args.rounds, args.threads)))
        return

    import torch
    from rich.console import Console
    from rich.table import Table

    sizes = [int(s) for s in args.sizes.split(",")]
    rows = []
    for n in sizes:
        results = {c: run_case(c, n, 1, args.cap_gib, args.threads) for c in CASES}
        fit = [c for c in CASES if not results[c].get("failed")]
        timed = run_case("time:" + ",".join(fit), n, args.rounds, args.cap_gib, args.threads)
        for c in fit:
            results[c]["first_call_seconds"] = results[c]["seconds"]
            results[c]["seconds"] = timed.get("best_seconds", {}).get(c)
        base = results["sdpa"]
        row = {"A": n, "B": n, "dense_mask_bytes": dense_mask_bytes(n), "cases": results}
        for c in CASES[1:]:
            r = results[c]
            ok = r.get("seconds") is not None and base.get("seconds")
            row[f"{c}_time_ratio"] = r["seconds"] / base["seconds"] if ok else None
            ok = r.get("peak_bytes") is not None and base.get("peak_bytes")
            row[f"{c}_peak_ratio"] = r["peak_bytes"] / base["peak_bytes"] if ok else None
        rows.append(row)
        print(json.dumps(row), flush=True)

    table = Table(
        title=f"Partial-prefill attention, one layer, {HQ} q / {HKV} kv heads, d={D}, fp32, INT2 "
        f"g{GROUP} prefix, CPU {args.threads} thread(s), cap {args.cap_gib:g} GiB/case, best of "
        f"{args.rounds} rounds; "
        "ratios vs uncorrected blocked SDPA"
    )
    for col in (
        "A = B",
        "sdpa s",
        "sdpa peak GiB",
        "fused time",
        "fused peak",
        "1-call time",
        "1-call peak",
        "dense time",
        "dense peak",
        "dense mask GiB",
    ):
        table.add_column(col, justify="right")

    def ratio(x):
        return "—" if x is None else f"{x:.2f}x"

    for r in rows:
        base = r["cases"]["sdpa"]
        dense = r["cases"]["dense"]
        table.add_row(
            str(r["A"]),
            "—" if base["seconds"] is None else f"{base['seconds']:.1f}",
            "—" if base["peak_bytes"] is None else f"{base['peak_bytes'] / 2**30:.2f}",
            ratio(r["fused_time_ratio"]),
            ratio(r["fused_peak_ratio"]),
            ratio(r["sdpa-1call_time_ratio"]),
            ratio(r["sdpa-1call_peak_ratio"]),
            ratio(r["dense_time_ratio"]) if "failed" not in dense else "failed",
            ratio(r["dense_peak_ratio"]) if "failed" not in dense else "OOM",
            f"{r['dense_mask_bytes'] / 2**30:.1f}",
        )
    Console(width=180).print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    meta = {"torch": torch.__version__, "threads": args.threads, "cap_gib": args.cap_gib}
    meta["rounds"] = args.rounds
    args.out.write_text(json.dumps({**meta, "rows": rows}, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
