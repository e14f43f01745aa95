"""Self-Forcing at real shapes on a GPU: peak memory and seconds per chunk, BF16 vs INT4 / INT2
(± Taylor) KV cache.

A Wan2.1-T2V-1.3B-shaped ``WanTransformer3DModel`` (random BF16 weights: memory and speed do not
depend on the values) and the Wan 2.1 VAE (random, fp32) run jbkv's Self-Forcing loop at
480×832: 7 chunks of 3 latent frames, 4 steps + the clean pass, a window of 6 chunks
(``--preset longlive``: sink 1 + window 2, 40 chunks). The UMT5-XXL encoder is replaced by a
random ``[1, 512, 4096]`` embedding: in jbkv it lives on the CPU and visits the GPU only to encode
a prompt, before the loop (≈ 11.4 GB in bf16 on top of the weights at that moment; computed).
Per cache variant: peak allocated GPU memory of the loop, seconds per chunk after a warm-up
video, KV bytes held at the peak; once: peak memory and seconds of the VAE decode. Writes JSON.

    python benchmarks/self_forcing_memory_gpu.py [--preset self-forcing-dmd|longlive|
        causal-forcing-chunkwise|causal-forcing-framewise|causal-forcing-pp-{2,1}step]
        [--chunks N] [--out benchmarks/results/self_forcing_memory_gpu.json]
    python benchmarks/self_forcing_memory_gpu.py --tiny    # smoke run, tiny random config, CPU ok
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch

GiB = 2**30


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def _peak(device: str) -> int | None:
    return torch.cuda.max_memory_allocated() if device.startswith("cuda") else None


def _reset(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _components(tiny: bool, device: str):
    import diffusers

    from jbkv_cli.models.wan.self_forcing.components import (
        MAX_SEQUENCE_LENGTH,
        WAN_T2V_1_3B,
        Components,
        tiny_components,
    )
    from jbkv_cli.models.wan.weights import cast_keeping_fp32

    if tiny:
        parts = tiny_components()
        parts.transformer.to(device)
        parts.vae.to(device)
        return parts
    torch.manual_seed(0)
    with torch.device(device):
        transformer = diffusers.WanTransformer3DModel(**WAN_T2V_1_3B)
        vae = diffusers.AutoencoderKLWan()  # Wan 2.1 VAE: base_dim 96, z_dim 16
    cast_keeping_fp32(transformer, torch.bfloat16)
    for module in (transformer, vae):
        module.eval().requires_grad_(False)
    return Components(transformer, vae, None, None, "random weights", MAX_SEQUENCE_LENGTH)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    from jbkv_cli.models.wan.self_forcing.model import PRESETS

    presets = [name for name in PRESETS if name != "tiny-random"]
    ap.add_argument("--preset", default="self-forcing-dmd", choices=presets)
    ap.add_argument("--chunks", type=int, default=None, help="chunks per video (preset's)")
    ap.add_argument("--tiny", action="store_true", help="tiny random config (CPU smoke run)")
    ap.add_argument("--out", default="benchmarks/results/self_forcing_memory_gpu.json")
    args = ap.parse_args()
    if not args.tiny and not torch.cuda.is_available():
        print(
            "self_forcing_memory_gpu: no CUDA device; this benchmark needs a GPU "
            "(--tiny runs a CPU smoke test of the script).",
            file=sys.stderr,
        )
        return 2

    from jbkv_cli.kvcache.spec import FULL_PRECISION, KVSpec
    from jbkv_cli.models.base import Video
    from jbkv_cli.models.wan.decode import decode_wan
    from jbkv_cli.models.wan.self_forcing.model import SelfForcing, build_settings

    device = "cuda" if torch.cuda.is_available() else "cpu"
    options = {"config": "tiny-random" if args.tiny else args.preset, "device": device}
    if args.chunks is not None:
        options["num_chunks"] = args.chunks
    settings = build_settings(options)
    components = _components(args.tiny, device)
    weights = {
        name: sum(p.numel() * p.element_size() for p in module.parameters())
        for name, module in (("transformer", components.transformer), ("vae", components.vae))
    }
    text_dim = components.transformer.config.text_dim
    length = components.max_sequence_length
    text = torch.randn(1, length, text_dim, generator=torch.Generator().manual_seed(0))
    text = text.to(device, components.transformer.dtype)

    class Bench(SelfForcing):
        def encode_prompt(self, prompt: str) -> torch.Tensor:
            return text

    model = Bench(components, settings)
    specs = {
        "bf16": FULL_PRECISION,
        "int4": KVSpec.build("rtn", bits=4),
        "int2": KVSpec.build("rtn", bits=2),
        "int2+taylor": KVSpec.build("rtn", bits=2, correction="taylor"),
    }
    results: dict = {
        "preset": options["config"],
        "settings": model.settings,
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "torch": torch.__version__,
        "weights_bytes": weights,
        "variants": {},
    }
    with torch.no_grad():
        model.generate_latents("warm-up", 0, FULL_PRECISION)  # kernels, allocator
        latents = None
        for label, spec in specs.items():
            _reset(device)
            stamps: list[float] = []

            def tick(done: int, total: int, stamps: list[float] = stamps) -> None:
                _sync(device)
                stamps.append(time.perf_counter())

            _sync(device)
            start = time.perf_counter()
            latents, info = model.generate_latents("a cat", 0, spec, progress=tick)
            per_chunk = [b - a for a, b in zip([start, *stamps[:-1]], stamps, strict=True)]
            results["variants"][label] = {
                "peak_bytes": _peak(device),
                "kv_cache_bytes": info["kv_cache_bytes"],
                "kv_working_bytes": info["kv_working_bytes"],
                "s_per_chunk": sum(per_chunk) / len(per_chunk),
                "s_per_chunk_each": per_chunk,
            }
        _reset(device)
        start = time.perf_counter()
        frames = decode_wan(components.vae, latents)
        _sync(device)
        Video(frames=frames, fps=float(settings.fps))
        results["decode"] = {
            "peak_bytes": _peak(device),
            "seconds": time.perf_counter() - start,
            "frames": int(frames.shape[0]),
        }

    s = settings
    print(
        f"Self-Forcing ({results['preset']}), {s.height}x{s.width}, {s.num_chunks} chunks of "
        f"{s.chunk_frames} latent frames, window {s.window}, sink {s.sink}, on {results['device']}"
    )
    print(
        f"weights: transformer {weights['transformer'] / GiB:.2f} GiB, VAE {weights['vae'] / GiB:.2f} GiB"
    )
    print(f"{'cache':<14}{'peak GiB':>10}{'KV GiB':>10}{'s/chunk':>10}")
    for label, row in results["variants"].items():
        peak = "n/a" if row["peak_bytes"] is None else f"{row['peak_bytes'] / GiB:.2f}"
        print(
            f"{label:<14}{peak:>10}{row['kv_cache_bytes'] / GiB:>10.3f}{row['s_per_chunk']:>10.3f}"
        )
    dec = results["decode"]
    peak = "n/a" if dec["peak_bytes"] is None else f"{dec['peak_bytes'] / GiB:.2f} GiB"
    print(f"VAE decode of {dec['frames']} frames: peak {peak}, {dec['seconds']:.2f} s")
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(results, indent=2) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
