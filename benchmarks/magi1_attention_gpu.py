"""MAGI-1 attention at real shapes on a GPU: BF16 cache vs INT2 cache vs INT2 + correction.

One 4.5B-shaped attention layer (24 query / 8 KV heads of 128, hidden 3072, random weights,
BF16 with upstream's fp32 islands) and one query chunk of a 720x720 video (6 latent frames of
45x45 tokens = 12,150 tokens) reading a 5-chunk window: 4 cached chunks + itself. Times, in one
process run, (a) the core attention call ``cache.attend`` and (b) the whole layer forward, for
each cache format, prints the ratios to BF16 and writes JSON.

    python benchmarks/magi1_attention_gpu.py [--out magi1_attention.json] [--repeats 20]
"""

from __future__ import annotations

import argparse
import json
import sys
import time

import torch


def _time(fn, repeats: int) -> float:
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="magi1_attention_gpu.json")
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--cached-chunks", type=int, default=4)
    ap.add_argument("--size", type=int, default=720, help="video height = width in pixels")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("magi1_attention_gpu: no CUDA device; this benchmark needs a GPU.", file=sys.stderr)
        return 2

    from jbkv_cli.kvcache.spec import FULL_PRECISION, KVSpec
    from jbkv_cli.models.magi1.config import VARIANTS
    from jbkv_cli.models.magi1.dit import ChunkAttention, TransformerLayer
    from jbkv_cli.models.magi1.kv import cache_attend, make_caches
    from jbkv_cli.models.magi1.rope import LearnableRotaryEmbedding

    dev, dt = "cuda", torch.bfloat16
    cfg = VARIANTS["4.5B_distill"].dit
    torch.manual_seed(0)
    layer = TransformerLayer(cfg)
    with torch.no_grad():
        for p in layer.parameters():
            p.normal_(0, 0.02)
    layer = layer.to(dev, dt)
    for name, m in layer.named_modules():
        if name.endswith(("q_layernorm", "k_layernorm", "post_norm")):
            m.float()
    side = args.size // 16
    frames = 6
    lc = frames * side * side
    n_cached = args.cached_chunks
    rope = LearnableRotaryEmbedding(cfg.kv_channels).to(dev)
    cos, sin = rope(frames * (n_cached + 1), frames, side, side)
    hidden = torch.randn(1, lc, cfg.hidden_size, device=dev, dtype=dt)
    condition = torch.randn(1, 1, cfg.cond_dim, device=dev, dtype=dt)
    captions = [[torch.randn(120, cfg.xattn_dim, device=dev, dtype=dt)]]
    hd, hq, hkv = cfg.kv_channels, cfg.num_attention_heads, cfg.num_query_groups

    specs = {
        "bf16": FULL_PRECISION,
        "int2": KVSpec.build("rtn", bits=2, group_size=32, correction="none"),
        "int2+taylor": KVSpec.build("rtn", bits=2, group_size=32, correction="taylor"),
    }
    results: dict = {
        "shape": {
            "query_tokens": lc,
            "cached_tokens": n_cached * lc,
            "heads": [hq, hkv],
            "head_dim": hd,
        },
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "attention_ms": {},
        "layer_ms": {},
        "cache_bytes": {},
    }
    layout = ChunkAttention(cached=(n_cached,), first=(0,))
    q = torch.randn(1, hq, lc, hd, device=dev, dtype=dt)
    k = torch.randn(1, hkv, lc, hd, device=dev, dtype=dt)
    v = torch.randn(1, hkv, lc, hd, device=dev, dtype=dt)
    for label, spec in specs.items():
        caches = make_caches(spec, 1, window=n_cached)
        for _ in range(n_cached):
            caches[0].commit(torch.randn_like(k), torch.randn_like(v))
        cache = caches[0]
        results["cache_bytes"][label] = cache.nbytes
        attend = cache_attend("fused")
        with torch.no_grad():
            results["attention_ms"][label] = 1e3 * _time(
                lambda cache=cache, attend=attend: attend(
                    q, k, v, scale=hd**-0.5, cache=cache, n_cached=n_cached
                ),
                args.repeats,
            )
            results["layer_ms"][label] = 1e3 * _time(
                lambda cache=cache, attend=attend: layer(
                    hidden, condition, captions, cos, sin, layout, cache=cache, attend=attend
                ),
                max(3, args.repeats // 4),
            )
    base_a, base_l = results["attention_ms"]["bf16"], results["layer_ms"]["bf16"]
    results["attention_ratio"] = {k: v / base_a for k, v in results["attention_ms"].items()}
    results["layer_ratio"] = {k: v / base_l for k, v in results["layer_ms"].items()}
    results["correction_overhead"] = (
        results["attention_ms"]["int2+taylor"] / results["attention_ms"]["int2"]
    )
    print(f"MAGI-1 4.5B attention, {lc} query tokens over {n_cached} cached + 1 current chunk")
    print(f"{'cache':<14}{'attend ms':>12}{'ratio':>8}{'layer ms':>12}{'ratio':>8}{'MiB held':>10}")
    for label in specs:
        print(
            f"{label:<14}{results['attention_ms'][label]:>12.2f}{results['attention_ratio'][label]:>8.2f}"
            f"{results['layer_ms'][label]:>12.2f}{results['layer_ratio'][label]:>8.2f}"
            f"{results['cache_bytes'][label] / 2**20:>10.1f}"
        )
    print(
        f"correction overhead (int2+taylor / int2 attention): {results['correction_overhead']:.3f}"
    )
    with open(args.out, "w") as fh:
        json.dump(results, fh, indent=2)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
