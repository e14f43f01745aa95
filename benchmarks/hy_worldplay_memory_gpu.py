"""HY-WorldPlay (WorldPlay-8B) memory at 480x832: computed everywhere, measured on a GPU.

**Computed** (any machine, ``--computed``): weight bytes of every component, from modules built
on the meta device with their published shapes (the DiT and the VAE from jbkv's port /
diffusers' defaults = upstream's configs; Qwen2.5-VL-7B's language model, ByT5-small's encoder
and FLUX.1-Redux's SigLIP-so400m from their public ``config.json`` numbers, written below), and
the KV bytes of the memory: one latent's K/V (1,560 tokens, 16 heads x 128) committed into
jbkv's cache per variant (BF16, INT4 / INT2 g32 RTN, INT2 QuaRot), bytes read from the stored
tensors, times 20 memory latents x 2 branches (RoPE, PRoPE) x 54 blocks; the text K/V at its
upper bound (729 SigLIP + 256 ByT5 + 1,000 Qwen tokens) in 16 bits.

**Measured** (a CUDA GPU, the default): a random-weight WorldPlay-8B (BF16; memory and speed do
not depend on the values) runs jbkv's AR loop on random text tokens for 6 chunks of the
trajectory ``w-23`` (chunk 5 reads the most memory: 20 latents), per cache variant: peak
allocated memory, KV bytes at the peak, seconds per chunk after a warm-up; then the random VAE
(fp32, tiled) decodes the 24 latents (93 frames). The encoders are not run (jbkv keeps them on
the CPU and moves each to the GPU only to encode a case, before the loop). Writes JSON.

    python benchmarks/hy_worldplay_memory_gpu.py [--chunks 6] [--out benchmarks/results/hy_worldplay_memory_gpu.json]
    python benchmarks/hy_worldplay_memory_gpu.py --computed    # the computed table only (CPU)
    python benchmarks/hy_worldplay_memory_gpu.py --tiny        # smoke run of the loop on the CPU
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

# the public config.json numbers of the encoders upstream loads (what `jbkv plan` builds too)
from jbkv_cli.models.hy_worldplay.planned import BYT5_SMALL, QWEN_7B_TEXT, SIGLIP_SO400M

GB = 1e9
LATENT_TOKENS = 30 * 52  # 480x832 / 16
MEMORY_LATENTS = 20
TEXT_TOKENS = 729 + 256 + 1000


def _bytes(module: torch.nn.Module, element: int) -> int:
    return sum(p.numel() for p in module.parameters()) * element


def weight_bytes() -> dict[str, dict[str, float]]:
    """Parameters and bytes of each component as jbkv loads it (DiT BF16, VAE fp32, encoders
    fp16 on a GPU)."""
    from diffusers import AutoencoderKLHunyuanVideo15
    from transformers import (
        Qwen2_5_VLTextConfig,
        Qwen2_5_VLTextModel,
        SiglipVisionConfig,
        SiglipVisionModel,
        T5Config,
        T5EncoderModel,
    )

    from jbkv_cli.models.hy_worldplay.config import OFFICIAL
    from jbkv_cli.models.hy_worldplay.dit import WorldPlayDiT

    with torch.device("meta"):
        parts = {
            "dit (bf16)": (WorldPlayDiT(OFFICIAL), 2),
            "vae (fp32)": (AutoencoderKLHunyuanVideo15(), 4),
            "qwen2.5-vl-7b text (fp16)": (
                Qwen2_5_VLTextModel(Qwen2_5_VLTextConfig(**QWEN_7B_TEXT)),
                2,
            ),
            "byt5 glyph encoder (fp16)": (T5EncoderModel(T5Config(**BYT5_SMALL)), 2),
            "siglip (fp16)": (SiglipVisionModel(SiglipVisionConfig(**SIGLIP_SO400M)), 2),
        }
    return {
        name: {"params": sum(p.numel() for p in m.parameters()), "bytes": _bytes(m, e)}
        for name, (m, e) in parts.items()
    }


def specs() -> dict:
    from jbkv_cli.kvcache.spec import FULL_PRECISION, KVSpec

    return {
        "bf16": FULL_PRECISION,
        "int4": KVSpec.build("rtn", bits=4),
        "int2": KVSpec.build("rtn", bits=2),
        "int2+taylor": KVSpec.build("rtn", bits=2, correction="taylor"),
        "int2-quarot+taylor": KVSpec.build("quarot", bits=2, correction="taylor"),
    }


def cache_bytes(blocks: int = 54, heads: int = 16, dim: int = 128) -> dict[str, dict[str, float]]:
    """Memory K/V bytes per chunk (20 latents, both branches, all blocks) per variant, from one
    latent's K/V committed into jbkv's cache."""
    from jbkv_cli.kvcache import ChunkKVCache

    g = torch.Generator().manual_seed(0)
    k = torch.randn(1, heads, LATENT_TOKENS, dim, generator=g).bfloat16()
    v = torch.randn(1, heads, LATENT_TOKENS, dim, generator=g).bfloat16()
    out = {}
    for label, spec in specs().items():
        cache = ChunkKVCache(spec, window=1)
        cache.commit(k, v)
        per_latent = cache.nbytes
        memory = per_latent * MEMORY_LATENTS * 2 * blocks
        out[label] = {"bytes_per_latent_per_block_branch": per_latent, "memory_bytes": memory}
    text = 2 * heads * dim * 2 * TEXT_TOKENS * blocks  # K and V, 16-bit, every block
    for row in out.values():
        row["text_bytes"] = text
    return out


def computed() -> dict:
    return {"weights": weight_bytes(), "cache": cache_bytes()}


def print_computed(res: dict) -> None:
    print("HY-WorldPlay (WorldPlay-8B), 480x832, 20 memory latents (31,200 tokens), computed")
    for name, row in res["weights"].items():
        print(
            f"  weights {name:<28}{row['params'] / 1e9:>7.3f} B params {row['bytes'] / GB:>7.2f} GB"
        )
    text = next(iter(res["cache"].values()))["text_bytes"]
    print(f"  text K/V (<= {TEXT_TOKENS} tokens, 16-bit, 54 blocks): {text / GB:.2f} GB")
    for label, row in res["cache"].items():
        print(f"  memory K/V per chunk {label:<20}{row['memory_bytes'] / GB:>7.2f} GB")


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def measured(tiny: bool, chunks: int) -> dict:
    from jbkv_cli.kvcache.spec import FULL_PRECISION
    from jbkv_cli.models.hy_worldplay import retrieval, trajectory
    from jbkv_cli.models.hy_worldplay.config import OFFICIAL, SCHEDULE, TINY, TINY_SCHEDULE
    from jbkv_cli.models.hy_worldplay.dit import WorldPlayDiT
    from jbkv_cli.models.hy_worldplay.sampler import Conditions, rollout
    from jbkv_cli.models.hy_worldplay.vae import build_vae, decode_frames

    device = "cpu" if tiny else "cuda"
    cfg, sched = (TINY, TINY_SCHEDULE) if tiny else (OFFICIAL, SCHEDULE)
    h, w = (4, 4) if tiny else (30, 52)
    latents = 4 * chunks
    torch.manual_seed(0)
    with torch.device(device):
        dit = WorldPlayDiT(cfg).to(torch.float32 if tiny else torch.bfloat16).eval()
    traj = trajectory.load_trajectory(f"w-{latents - 1}", latents)
    seed = retrieval.points_seed(trajectory.trajectory_digest(traj))
    plan = retrieval.memory_plan(traj.w2c, retrieval.sample_points(seed))
    g = torch.Generator().manual_seed(1)
    dtype = dit.dtype
    txt = torch.randn(1, 32 if tiny else TEXT_TOKENS, cfg.hidden_size, generator=g)
    cond = torch.zeros(1, cfg.in_channels + 1, latents, h, w)
    cond[:, -1, 0] = 1.0
    noise = torch.randn(1, cfg.in_channels, latents, h, w, generator=g).to(device)
    conditions = Conditions(
        txt.to(device, dtype),
        torch.randn(1, cfg.hidden_size, generator=g).to(device, dtype),
        cond.to(device),
        traj,
        plan,
    )
    res: dict = {"device": torch.cuda.get_device_name() if not tiny else "cpu", "variants": {}}
    res["weights_bytes_dit"] = _bytes(dit, 2 if not tiny else 4)
    res["memory_latents"] = [len(p) for p in plan]
    with torch.no_grad():
        rollout(dit, conditions, noise, sched, FULL_PRECISION)  # warm-up
        out = None
        for label, spec in specs().items():
            if not tiny:
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats()
            stamps: list[float] = []
            _sync()
            start = time.perf_counter()

            def tick(done: int, total: int, stamps: list[float] = stamps) -> None:
                _sync()
                stamps.append(time.perf_counter())

            out, info = rollout(dit, conditions, noise, sched, spec, progress=tick)
            per_chunk = [b - a for a, b in zip([start, *stamps[:-1]], stamps, strict=True)]
            res["variants"][label] = {
                "peak_bytes": None if tiny else torch.cuda.max_memory_allocated(),
                "kv_cache_bytes": info["kv_cache_bytes"],
                "kv_cache_bytes_by_branch": info["kv_cache_bytes_by_branch"],
                "s_per_chunk": per_chunk,
            }
        del dit
        if not tiny:
            torch.cuda.empty_cache()
            torch.cuda.reset_peak_memory_stats()
        from jbkv_cli.models.hy_worldplay.tiny import TINY_VAE

        with torch.device(device):
            vae = build_vae(TINY_VAE if tiny else None).eval()
        start = time.perf_counter()
        frames = decode_frames(vae, out.float())
        _sync()
        res["decode"] = {
            "frames": int(frames.shape[0]),
            "seconds": time.perf_counter() - start,
            "peak_bytes": None if tiny else torch.cuda.max_memory_allocated(),
            "weights_bytes_vae": _bytes(vae, 4),
        }
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--computed", action="store_true", help="the computed numbers only (CPU)")
    ap.add_argument("--tiny", action="store_true", help="tiny random config (CPU smoke run)")
    ap.add_argument("--chunks", type=int, default=6, help="chunks (6: chunk 5 reads 20 latents)")
    ap.add_argument("--out", default="benchmarks/results/hy_worldplay_memory_gpu.json")
    args = ap.parse_args()
    if not (args.computed or args.tiny) and not torch.cuda.is_available():
        print(
            "hy_worldplay_memory_gpu: no CUDA device; --computed prints the computed numbers, "
            "--tiny runs a CPU smoke test of the loop.",
            file=sys.stderr,
        )
        return 2
    results: dict = {"torch": torch.__version__}
    if not args.tiny:
        results["computed"] = computed()
        print_computed(results["computed"])
    if not args.computed:
        results["measured"] = m = measured(args.tiny, args.chunks)
        print(
            f"measured on {m['device']}, {args.chunks} chunks, memory latents {m['memory_latents']}"
        )
        for label, row in m["variants"].items():
            peak = "n/a" if row["peak_bytes"] is None else f"{row['peak_bytes'] / GB:.2f} GB"
            s = sum(row["s_per_chunk"][1:]) / max(1, len(row["s_per_chunk"]) - 1)
            print(
                f"  {label:<20} peak {peak:>10}  KV {row['kv_cache_bytes'] / GB:.3f} GB  {s:.2f} s/chunk"
            )
        d = m["decode"]
        peak = "n/a" if d["peak_bytes"] is None else f"{d['peak_bytes'] / GB:.2f} GB"
        print(f"  VAE decode of {d['frames']} frames: peak {peak}, {d['seconds']:.1f} s")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
