"""What pruning costs and saves in the cache at Self-Forcing's shapes, on a CPU.

    python benchmarks/pruning.py [--heads 4 --queries 256 --repeat 3 --chunks 21]

**Bytes per chunk** (the point of Forcing-KV: a constant budget). Self-Forcing at 480×832:
frames of 1,560 tokens, chunks of 3 frames, head dim 128, bf16, 30 layers × 12 heads, the head
split of upstream's shipped profile (zju-jiyicheng/Forcing-KV@50ac1f45:
configs_head/forcingkv_heads_selfforcing.json, static heads per layer below). Every class of head
holds the same bytes per head in every layer (the same tokens; forcing-kv's deciding layer
adds its ring keys per dynamic head), so a small stack with real tensors at the full token
geometry — layer 0 and a split layer of one static and one dynamic head — is measured after every
commit and composed into the 30 × 12 model exactly. Caches without a window (upstream's
Forcing-KV path has none) for the unpruned cache, forcing-kv-history (one anchor frame, 8
segments, ρ = 0.33) and forcing-kv (its defaults); also the unpruned cache with Self-Forcing's
window of 6 chunks; 16-bit and INT2 rtn.

**Time** (one layer, as before): commit, read (dequantize and lay the kept tokens out) and
attention of one query block, pruned against unpruned, FP32 and INT2 RTN: one split layer of
``--heads`` KV heads (half static), a window of 6 finished chunks, the working buffer rebuilt on
every read (``keep_view=False``, the GPU default); forcing-kv-history with the previous chunk (3
frames) as anchors. One process, best of ``--repeat`` rounds, one thread (compare the ratios,
not the seconds). Writes benchmarks/results/pruning.json and prints tables.
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
from jbkv_cli.prune import ForcingKV, ForcingKVHistory
from jbkv_cli.prune.profile import FORMAT

OUT = Path(__file__).resolve().parent / "results" / "pruning.json"
FRAME, CHUNK_FRAMES, WINDOW, DIM = 1560, 3, 6, 128
SF_LAYERS, SF_HEADS = 30, 12
# static heads per layer in upstream's Self-Forcing profile (layer 0 is never split)
SF_STATIC = [5, 4, 5, 4, 3, 8, 4, 6, 8, 4, 3, 4, 8, 1, 6, 1, 3, 8, 1, 4, 8, 6, 1, 3, 1, 2, 5, 6]
SF_STATIC += [6, 6]


def _profile(folder: Path, layers: list[list[str]], anchor: int | None = None) -> str:
    doc = {"format": FORMAT, "model": "bench", "threshold": 0.8, "rule": "forcing-kv"}
    if anchor is not None:
        doc |= {"rule": "local-mass", "anchor_frames": anchor}
    path = folder / f"bench-{len(layers)}-{anchor}.json"
    path.write_text(json.dumps(doc | {"layers": [{"heads": h} for h in layers]}))
    return str(path)


def _chunks(heads: int, count: int, dtype=torch.float32) -> list[tuple[torch.Tensor, torch.Tensor]]:
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
        out.append((k.to(dtype), torch.randn(k.shape, generator=g).to(dtype)))
    return out


# --- bytes per chunk ----------------------------------------------------------------------------


def _per_head(spec: KVSpec, window: int | None, chunks: int) -> list[dict[str, float]]:
    """After each commit: bytes per head of each class in a stack of layer 0 and one split layer
    (static head 0, dynamic head 1), the deciding layer's ring keys per dynamic head apart."""
    layout = {"layers": 2, "kv_heads": 2, "frame_tokens": FRAME}
    caches = layer_caches(spec, window, model="bench", **layout)
    out = []
    g = torch.Generator().manual_seed(0)
    for _ in range(chunks):
        for cache in caches:
            k = torch.randn(1, 2, CHUNK_FRAMES * FRAME, DIM, generator=g).to(torch.bfloat16)
            cache.commit(k, torch.randn(k.shape, generator=g).to(torch.bfloat16))
        if spec.pruner is None:
            out.append({"unpruned": caches[0].nbytes / 2})
            continue
        first, split = caches[0].nbytes_by_kind(), caches[1].nbytes_by_kind()
        state = 0  # forcing-kv-history's pending segment means are per head, in every layer
        if spec.pruner.name == "forcing-kv":
            state = sum(caches[1].pruning.nbytes_by_kind().values())
        row = {"static": split["static"], "dynamic": split["dynamic"] - state, "state": state}
        row["layer0"] = sum(first.values()) / 2  # unsplit (forcing-kv) or as layer 1 (history)
        out.append(row)
    return out


def _model_bytes(row: dict[str, float], pruner: str | None) -> int:
    """The 30 × 12 Self-Forcing model's cache from per-head bytes (see the module docstring)."""
    if pruner is None:
        return round(row["unpruned"] * SF_LAYERS * SF_HEADS)
    total = 0.0
    for layer, static in enumerate(SF_STATIC):
        dynamic = SF_HEADS - static
        if layer == 0 and pruner == "forcing-kv":
            total += SF_HEADS * row["layer0"]
            continue
        total += static * row["static"] + dynamic * row["dynamic"]
        if layer == 1:
            total += dynamic * row["state"]  # the deciding layer's ring keys (forcing-kv)
    return round(total)


def bytes_per_chunk(folder: Path, chunks: int) -> dict[str, list[int]]:
    split = [["static", "dynamic"], ["static", "dynamic"]]
    faithful = ForcingKV(profile=_profile(folder, split))
    history = ForcingKVHistory(profile=_profile(folder, split, anchor=1))
    series = {}
    for bits in (16, 2):

        def spec(pruner, bits=bits):
            return KVSpec(pruner=pruner) if bits == 16 else KVSpec.build("rtn", 2, pruner=pruner)

        tag = "BF16" if bits == 16 else "INT2 rtn"
        for name, pruner, window in (
            (f"{tag} unpruned, window 6", None, WINDOW),
            (f"{tag} unpruned", None, None),
            (f"{tag} forcing-kv-history", history, None),
            (f"{tag} forcing-kv", faithful, None),
        ):
            rows = _per_head(spec(pruner), window, chunks)
            series[name] = [_model_bytes(r, pruner and pruner.name) for r in rows]
    return series


# --- time ---------------------------------------------------------------------------------------


def _time(spec: KVSpec, heads: int, data, q: torch.Tensor) -> dict[str, float]:
    """Commit, read and attend of layer 1 (a split layer) of a two-layer stack."""
    layout = {"layers": 2, "kv_heads": heads, "frame_tokens": FRAME}
    caches = layer_caches(spec, WINDOW, model="bench", **layout)
    for c in caches:
        c.keep_view = False
    commit = 0.0
    for k, v in data[:-1]:
        caches[0].commit(k, v)
        start = time.perf_counter()
        caches[1].commit(k, v)
        commit += time.perf_counter() - start
    cache = caches[1]
    start = time.perf_counter()
    cache.read()
    read = time.perf_counter() - start
    k_cur, v_cur = data[-1]
    start = time.perf_counter()
    cache.attend(q, k_cur, v_cur, DIM**-0.5)
    attend = time.perf_counter() - start
    return {"commit": commit / (len(data) - 1), "read": read, "attend": attend}


def timing(folder: Path, heads: int, queries: int, repeat: int) -> list[dict]:
    data = _chunks(heads, WINDOW + 2)
    q = torch.randn(1, heads, queries, DIM, generator=torch.Generator().manual_seed(1))
    kinds = ["static" if h < heads // 2 else "dynamic" for h in range(heads)]
    pruners = {
        "forcing-kv-history": ForcingKVHistory(profile=_profile(folder, [kinds] * 2, CHUNK_FRAMES)),
        "forcing-kv": ForcingKV(profile=_profile(folder, [kinds] * 2)),
    }
    specs = {"FP32": FULL_PRECISION, "INT2 rtn": KVSpec.build("rtn", 2, correction="taylor")}
    for name, p in pruners.items():
        specs[f"FP32 {name}"] = KVSpec(pruner=p)
        specs[f"INT2 rtn {name}"] = KVSpec.build("rtn", 2, correction="taylor", pruner=p)
    best: dict[str, dict[str, float]] = {}
    for _ in range(repeat):  # round-robin: a noisy moment hits every variant alike
        for name, spec in specs.items():
            got = _time(spec, heads, data, q)
            prev = best.get(name, got)
            best[name] = {key: min(got[key], prev[key]) for key in got}
    rows = []
    for name, t in best.items():
        base = best[name.split(" forcing")[0]]
        rows.append(
            {
                "variant": name,
                **{f"{key}_ms": round(1e3 * t[key], 2) for key in ("commit", "read", "attend")},
                **{f"{key}_ratio": round(t[key] / base[key], 2) for key in t},
            }
        )
    return rows


def _print_bytes(series: dict[str, list[int]], chunks: int) -> None:
    shown = [c for c in (1, 2, 3, 4, 7, 14, 21, chunks) if c <= chunks]
    shown = sorted(set(shown))
    table = Table(
        title="Self-Forcing 480×832 (30 layers × 12 heads, upstream's head split): cache MB "
        "after each chunk"
    )
    table.add_column("variant", justify="left")
    for c in shown:
        table.add_column(f"chunk {c}", justify="right")
    for name, values in series.items():
        table.add_row(name, *(f"{values[c - 1] / 2**20:.1f}" for c in shown))
    Console(width=140).print(table)


def _print_time(rows: list[dict], heads: int) -> None:
    table = Table(title=f"layer 1 of 2, {heads} KV heads, {WINDOW} chunks of 3×{FRAME} tokens")
    cols = ("variant", "commit_ms", "read_ms", "attend_ms")
    cols += ("commit_ratio", "read_ratio", "attend_ratio")
    for col in cols:
        table.add_column(col.replace("_", " "), justify="left" if col == "variant" else "right")
    for row in rows:
        table.add_row(*(str(row[c]) for c in cols))
    Console(width=140).print(table)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--queries", type=int, default=256)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--chunks", type=int, default=21, help="chunks for the bytes per chunk")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads")
    args = ap.parse_args()
    if args.heads < 2 or args.queries < 1 or args.repeat < 1 or args.chunks < 3:
        ap.error("--heads >= 2, --queries >= 1, --repeat >= 1 and --chunks >= 3")
    torch.set_num_threads(args.threads)
    with tempfile.TemporaryDirectory() as tmp:
        series = bytes_per_chunk(Path(tmp), args.chunks)
        rows = timing(Path(tmp), args.heads, args.queries, args.repeat)
    _print_bytes(series, args.chunks)
    _print_time(rows, args.heads)
    OUT.parent.mkdir(exist_ok=True)
    meta = {"args": vars(args), "torch": torch.__version__, "machine": platform.machine()}
    doc = {"meta": meta, "bytes_per_chunk": series, "rows": rows}
    OUT.write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
