"""Stored vs working bytes of one cache read: the embedded model measured, MAGI-1 / SkyReels-V2 /
Self-Forcing computed from their default shapes (no GPU, no weights).

**Embedded model** (``--model tiny``, FP32, 2 prompts × seed 0): every method at INT2 and INT4
(g32), uncorrected and with the taylor correction, diagnostics off. Per variant the peak stored
cache bytes of a video (all layers, ``kv_cache_bytes``) and the working bytes of its largest
cache read (one layer: the dequantized window plus what the attend path builds;
:mod:`jbkv_cli.attention.memory`, metered during generation), mean over videos.

**Large models**, per layer read at steady state, batch 1 (one CFG branch):

- MAGI-1 4.5B-distill, 720×720: 24 query / 8 KV heads × 128; a denoising chunk of 6 latent
  frames (45 × 45 × 6 = 12,150 tokens) reads one cached chunk and attends its own keys;
- SkyReels-V2-DF-1.3B-540P, 544×960: 12 heads × 128; a chunk of 5 latent frames
  (34 × 60 × 5 = 10,200 tokens) reads the last 5 chunks (51,000 tokens);
- Self-Forcing DMD (Wan2.1-T2V-1.3B), 480×832: 12 heads × 128; a chunk of 3 latent frames
  (30 × 52 × 3 = 4,680 tokens) reads the last 6 chunks (28,080 tokens).

Stored bytes per token are measured from the tensors a ``ChunkKVCache`` stores after committing
one chunk of random BF16 K/V of that head layout (RTN, g32), times the cached tokens. Working
bytes are :func:`~jbkv_cli.attention.memory.read_bytes` of the read's shape per backend (BF16
attention; the uncorrected read takes the plain SDPA path whatever the backend; ``exact`` is the
masked path with its table over at most 127 FP8 step values).

    python benchmarks/memory.py [--out benchmarks/results/memory.json] [--skip-tiny]
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

import torch

from jbkv_cli.attention.memory import ReadShape, metering, read_bytes
from jbkv_cli.kvcache.cache import ChunkKVCache
from jbkv_cli.kvcache.spec import FULL_PRECISION, KVSpec

MB = 2**20


@dataclass(frozen=True)
class Model:
    name: str
    q_heads: int
    kv_heads: int
    queries: int  # the current chunk's tokens (queries and current keys)
    cached: int  # cached tokens one read returns


MODELS = (
    Model("MAGI-1 4.5B-distill", 24, 8, 12_150, 12_150),
    Model("SkyReels-V2 1.3B 540P", 12, 12, 10_200, 51_000),
    Model("Self-Forcing DMD", 12, 12, 4_680, 28_080),
)
VARIANTS = (  # (label, spec, correction form)
    ("BF16", FULL_PRECISION, None),
    ("INT2 g32", KVSpec.build("rtn", 2, 32, "none"), None),
    ("INT2 g32 + taylor", KVSpec.build("rtn", 2, 32, "taylor"), "taylor"),
    ("INT2 g32 + exact", KVSpec.build("rtn", 2, 32, "exact"), "exact"),
)
BACKENDS = ("fused", "flex", "reference")


def stored_per_token(spec: KVSpec, kv_heads: int, d: int = 128, tokens: int = 256) -> float:
    """Bytes a cache stores per cached token (all KV heads, K and V) for ``spec``."""
    g = torch.Generator().manual_seed(0)
    cache = ChunkKVCache(spec, window=1)
    k, v = (torch.randn(1, kv_heads, tokens, d, generator=g).bfloat16() for _ in range(2))
    cache.commit(k, v)
    return cache.nbytes / tokens


def large_models() -> list[dict]:
    out = []
    for m in MODELS:
        for label, spec, form in VARIANTS:
            stored = stored_per_token(spec, m.kv_heads) * m.cached
            groups = 0 if spec is FULL_PRECISION else 128 // 32  # steps of g32 at D = 128
            shape = ReadShape(1, m.q_heads, m.kv_heads, m.queries, m.cached, m.queries, 128, groups)
            paths = {"plain": "plain"} if form is None else {b: b for b in BACKENDS}
            if form == "exact":
                paths = {"any": "masked"}
            for backend, path in paths.items():
                r = read_bytes(shape, path, form)
                out.append(
                    {
                        "model": m.name,
                        "variant": label,
                        "backend": backend,
                        "stored_mb": round(stored / MB, 1),
                        "view_mb": round(r.view / MB, 1),
                        "working_mb": round(r.read / MB, 1),
                    }
                )
    for row in out:  # against BF16's working bytes of the same model
        bf16 = next(r for r in out if r["model"] == row["model"] and r["variant"] == "BF16")
        row["working_vs_bf16"] = round(row["working_mb"] / bf16["working_mb"], 2)
    return out


def tiny_model() -> list[dict]:
    from jbkv_cli.models.cases import Case
    from jbkv_cli.models.registry import load_model
    from jbkv_cli.quant.registry import METHODS

    model = load_model("tiny")
    prompts = (
        "a red circle moves right on a dark background",
        "a blue square moves up on a gray background",
    )
    cases = [Case.of(p) for p in prompts]
    specs = [("FP32", FULL_PRECISION)]
    for name, cls in METHODS.items():
        for bits in (4, 2):
            if bits not in cls.SUPPORTED_BITS:
                continue
            for corr in ("none", "taylor"):
                specs.append(
                    (
                        f"{name} INT{bits}" + (" + taylor" * (corr == "taylor")),
                        KVSpec.build(name, bits, 32, corr),
                    )
                )
    out = []
    for label, spec in specs:
        stored, working = [], []
        for case in cases:
            with metering() as meter:
                video = model.generate(case, 0, spec)
            stored.append(video.kv_cache_bytes)
            working.append(meter.peak.read)
        out.append(
            {
                "variant": label,
                "stored_kb": round(sum(stored) / len(stored) / 1024, 1),
                "working_kb": round(sum(working) / len(working) / 1024, 1),
            }
        )
        print(f"  {label}: {out[-1]}", file=sys.stderr)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/memory.json"))
    parser.add_argument("--skip-tiny", action="store_true")
    args = parser.parse_args(argv)
    result = {"large_models": large_models()}
    if not args.skip_tiny:
        result["tiny"] = tiny_model()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=1) + "\n")
    for row in result["large_models"]:
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
