"""Causal-Forcing / Self-Forcing / Rolling Forcing presets at default shapes: computed GPU memory.

For every non-tiny preset of the ``self-forcing`` and ``rolling-forcing`` adapters: the transformer's parameter bytes in
BF16 (``WanTransformer3DModel`` of Wan2.1-T2V-1.3B built on the meta device: no weights), the
KV cache bytes of one chunk for BF16 / INT4 / INT2 (g32 RTN; measured from the tensors a
``ChunkKVCache`` stores after committing one layer's random BF16 K/V of one chunk, × 30 layers;
sinks stay BF16), the bytes held at the cache's peak (``sink + window`` chunks, the last chunk
never committed; Rolling Forcing: the sink + 7 blocks of its 24-frame buffer) and the peak
estimate of the chunk loop: weights + VAE (fp32) + the peak cache.
Not included: activations and the attention's working copy of one layer's cache (at most a few
hundred MB at 1560–4680 current tokens; Rolling Forcing's window forward runs 15 frames,
``current_tokens`` = 23,400, so its activations are ~5× a chunk's), the VAE decode's activations, and the UMT5 encoder
(11.4 GB, on the GPU only while a new prompt is encoded). Writes JSON.

    python benchmarks/causal_forcing_memory.py [--out benchmarks/results/causal_forcing_memory.json]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

GB = 1e9


def _weight_bytes() -> tuple[int, int]:
    """(transformer in BF16, Wan 2.1 VAE in fp32) parameter bytes, built without weights."""
    import accelerate
    import diffusers

    from jbkv_cli.models.wan.self_forcing.components import WAN_T2V_1_3B

    with accelerate.init_empty_weights(include_buffers=False):
        transformer = diffusers.WanTransformer3DModel(**WAN_T2V_1_3B)
        vae = diffusers.AutoencoderKLWan()  # the Wan 2.1 VAE: base_dim 96, z_dim 16
    count = [sum(p.numel() for p in m.parameters()) for m in (transformer, vae)]
    return count[0] * 2, count[1] * 4


def _chunk_bytes(spec, tokens: int, layers: int, heads: int, head_dim: int) -> int:
    """Bytes one committed chunk holds over all layers, measured on one layer's cache."""
    from jbkv_cli.kvcache import ChunkKVCache

    g = torch.Generator().manual_seed(0)
    k = torch.randn(1, heads, tokens, head_dim, generator=g).to(torch.bfloat16)
    v = torch.randn(1, heads, tokens, head_dim, generator=g).to(torch.bfloat16)
    cache = ChunkKVCache(spec, None)
    cache.commit(k, v)
    return cache.nbytes * layers


def _row(s, model: str, specs: dict, sizes: tuple[int, int, int, int]) -> dict:
    """One preset's row: its shape, what its cache keeps at the peak, bytes per spec."""
    from jbkv_cli.kvcache.spec import FULL_PRECISION

    layers, heads, head_dim, fixed = sizes
    frame_tokens = (s.height // 16) * (s.width // 16)  # VAE 8 × patch 2
    tokens = frame_tokens * s.chunk_frames
    kept = min(s.num_chunks - 1, s.sink + (s.window if s.window is not None else s.num_chunks))
    current = tokens * (s.steps if model == "rolling-forcing" else 1)  # the rolling window
    row = {"model": model, "chunk_frames": s.chunk_frames, "num_chunks": s.num_chunks}
    row |= {"tokens": tokens, "current_tokens": current}
    row |= {"window": s.window, "sink": s.sink, "cached_chunks_at_peak": kept, "bits": {}}
    sink_chunk = _chunk_bytes(FULL_PRECISION, tokens, layers, heads, head_dim)
    for label, spec in specs.items():
        chunk = _chunk_bytes(spec, tokens, layers, heads, head_dim)
        sinks = min(s.sink, kept)
        peak_cache = sinks * sink_chunk + (kept - sinks) * chunk
        row["bits"][label] = {
            "chunk_bytes": chunk,
            "peak_cache_bytes": peak_cache,
            "loop_peak_estimate_bytes": fixed + peak_cache,
        }
    return row


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", default="benchmarks/results/causal_forcing_memory.json")
    args = ap.parse_args()

    from jbkv_cli.kvcache.spec import FULL_PRECISION, KVSpec
    from jbkv_cli.models.wan.rolling_forcing import model as rolling
    from jbkv_cli.models.wan.self_forcing.components import WAN_T2V_1_3B
    from jbkv_cli.models.wan.self_forcing.model import PRESETS, build_settings

    layers, heads = WAN_T2V_1_3B["num_layers"], WAN_T2V_1_3B["num_attention_heads"]
    head_dim = WAN_T2V_1_3B["attention_head_dim"]
    specs = {
        "bf16": FULL_PRECISION,
        "int4": KVSpec.build("rtn", bits=4),
        "int2": KVSpec.build("rtn", bits=2),
    }
    weights, vae_bytes = _weight_bytes()
    sizes = (layers, heads, head_dim, weights + vae_bytes)
    rows = {}
    # Rolling Forcing also at its README's length (126 latent frames): the 24-frame buffer full
    readme = {"rolling-forcing@42": rolling.PRESETS[rolling.NAME] | {"num_chunks": 42}}
    families = [("self-forcing", PRESETS), (rolling.NAME, rolling.PRESETS), (rolling.NAME, readme)]
    for model, presets in families:
        for name in presets:
            if name != "tiny-random":
                options = {"config": name, "device": "cpu", "dtype": "bfloat16"}
                rows[name] = _row(build_settings(options, presets, model), model, specs, sizes)
    results = {"transformer_bf16_bytes": weights, "vae_fp32_bytes": vae_bytes, "presets": rows}
    print(f"transformer {weights / GB:.2f} GB (BF16), VAE {vae_bytes / GB:.2f} GB (fp32)")
    print(
        f"{'preset':<26}{'k':>3}{'chunks':>7}{'kept':>5}  per chunk BF16/INT4/INT2 GB   peak cache GB   loop peak GB"
    )
    for name, row in rows.items():
        b = row["bits"]
        chunk = "/".join(f"{b[x]['chunk_bytes'] / GB:.3f}" for x in specs)
        peak = "/".join(f"{b[x]['peak_cache_bytes'] / GB:.2f}" for x in specs)
        loop = "/".join(f"{b[x]['loop_peak_estimate_bytes'] / GB:.1f}" for x in specs)
        print(
            f"{name:<26}{row['chunk_frames']:>3}{row['num_chunks']:>7}"
            f"{row['cached_chunks_at_peak']:>5}  {chunk:<28}{peak:<16}{loop}"
        )
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
