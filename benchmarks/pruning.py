"""Forcing-KV's cost in the cache at Self-Forcing's shapes: commit, read (dequantize and lay the
kept tokens out) and attention of one query block, pruned against unpruned, FP32 and INT2 RTN.

    python benchmarks/pruning.py [--heads 4 --queries 256 --repeat 3]

One layer's cache of Self-Forcing at 480×832 (frames of 1,560 tokens, chunks of 3 frames, a
window of 6 finished chunks, head dim 128), filled with 7 chunks of synthetic keys; half the KV
heads static, half dynamic, the previous chunk (3 frames) as anchors, the default 8 segments
and retention 0.33. The working buffer is rebuilt on every read (``keep_view=False``, the GPU
default). One process, best of ``--repeat`` rounds, one thread (compare the ratios, not the
seconds). Writes benchmarks/results/pruning.json and prints a table.
"""

from __future__ import annotations

import argparse
import json
import platform
import tempfile
import time
from pathlib import Path

import torch
from rich.console import Console
from rich.table import Table

from jbkv_cli.kvcache import FULL_PRECISION, KVSpec, layer_caches
from jbkv_cli.prune import ForcingKV
from jbkv_cli.prune.profile import FORMAT

OUT = Path(__file__).resolve().parent / "results" / "pruning.json"
FRAME, CHUNK_FRAMES, WINDOW, DIM = 1560, 3, 6, 128


def _profile(folder: Path, heads: int) -> str:
    kinds = ["static" if h < heads // 2 else "dynamic" for h in range(heads)]
    doc = {"format": FORMAT, "model": "bench", "anchor_frames": CHUNK_FRAMES, "threshold": 0.75}
    path = folder / "bench.json"
    path.write_text(json.dumps(doc | {"layers": [{"heads": kinds}]}))
    return str(path)


def _chunks(heads: int, count: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Video-like keys: each frame repeats the previous one plus a little change."""
    g = torch.Generator().manual_seed(0)
    frame = torch.randn(1, heads, FRAME, DIM, generator=g)
    out = []
    for _ in range(count):
        frames = []
        for _ in range(CHUNK_FRAMES):
            frame = frame + 0.3 * torch.randn(frame.shape, generator=g)
            frames.append(frame)
        k = torch.cat(frames, -2)
        out.append((k, torch.randn(k.shape, generator=g)))
    return out


def _time(spec: KVSpec, heads: int, data, q: torch.Tensor) -> dict[str, float]:
    layout = {"layers": 1, "kv_heads": heads, "frame_tokens": FRAME}
    (cache,) = layer_caches(spec, WINDOW, model="bench", **layout)
    cache.keep_view = False
    start = time.perf_counter()
    for k, v in data[:-1]:
        cache.commit(k, v)
    commit = (time.perf_counter() - start) / (len(data) - 1)
    start = time.perf_counter()
    cache.read()
    read = time.perf_counter() - start
    k_cur, v_cur = data[-1]
    start = time.perf_counter()
    cache.attend(q, k_cur, v_cur, DIM**-0.5)
    attend = time.perf_counter() - start
    return {"commit": commit, "read": read, "attend": attend, "bytes": cache.nbytes}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--queries", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = ap.parse_args()
    if args.heads < 2 or args.queries < 1 or args.repeat < 1:
        ap.error("--heads >= 2, --queries >= 1 and --repeat >= 1")
    torch.set_num_threads(args.threads)
    data = _chunks(args.heads, WINDOW + 2)
    q = torch.randn(1, args.heads, args.queries, DIM, generator=torch.Generator().manual_seed(1))
    with tempfile.TemporaryDirectory() as tmp:
        fkv = ForcingKV(profile=_profile(Path(tmp), args.heads))
        specs = {
            "FP32": FULL_PRECISION,
            "FP32 Forcing-KV": KVSpec(pruner=fkv),
            "INT2 rtn": KVSpec.build("rtn", 2, correction="taylor"),
            "INT2 rtn Forcing-KV": KVSpec.build("rtn", 2, correction="taylor", pruner=fkv),
        }
        best: dict[str, dict[str, float]] = {}
        for _ in range(args.repeat):  # round-robin: a noisy moment hits every variant alike
            for name, spec in specs.items():
                got = _time(spec, args.heads, data, q)
                prev = best.get(name, got)
                best[name] = {key: min(got[key], prev[key]) for key in got}
    rows = []
    for name, t in best.items():
        base = best[name.replace(" Forcing-KV", "")]
        rows.append(
            {
                "variant": name,
                **{f"{key}_ms": round(1e3 * t[key], 2) for key in ("commit", "read", "attend")},
                "bytes": int(t["bytes"]),
                "bytes_ratio": round(t["bytes"] / base["bytes"], 3),
                "read_ratio": round(t["read"] / base["read"], 2),
                "attend_ratio": round(t["attend"] / base["attend"], 2),
                "commit_ratio": round(t["commit"] / base["commit"], 2),
            }
        )
    table = Table(title=f"one layer, {args.heads} KV heads, {WINDOW} chunks of 3×{FRAME} tokens")
    shown = {"variant": "variant", "commit_ms": "commit ms", "read_ms": "read ms"}
    shown |= {"attend_ms": "attend ms", "bytes_ratio": "bytes ×", "read_ratio": "read ×"}
    shown |= {"attend_ratio": "attend ×"}
    for col in shown.values():
        table.add_column(col, justify="left" if col == "variant" else "right")
    for row in rows:
        table.add_row(*(str(row[key]) for key in shown))
    Console(width=120).print(table)
    OUT.parent.mkdir(exist_ok=True)
    meta = {"args": vars(args), "torch": torch.__version__, "machine": platform.machine()}
    OUT.write_text(json.dumps({"meta": meta, "rows": rows}, indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
