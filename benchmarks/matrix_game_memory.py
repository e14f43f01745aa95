"""Matrix-Game-2.0 memory at its default shape (352×640, chunks of 3 latent frames, local
attention 6 frames), computed on the CPU: no GPU, no weights needed.

* **weights**: the DiT built on the meta device with upstream's config (per preset), BF16;
  besides, CLIP ViT-H/14's visual tower through block 31 and the Wan2.1 VAE (diffusers'
  ``AutoencoderKLWan`` default), also BF16 and on the meta device (``encoders_bytes``);
* **cache bytes per chunk**: one chunk's K/V committed into jbkv's ``ChunkKVCache`` per variant
  (BF16, INT4 / INT2 g32 RTN), bytes read from the stored tensors: the main cache
  ``[1, 12, 3·880, 128]`` per block (30), the mouse cache ``[880, 16, 3, 64]`` and the
  keyboard cache ``[1, 16, 3, 64]`` per action block (15), with the action caches quantized
  (``quantize_actions=true``) or BF16 (``false``). A cache holds the window's finished frames,
  ``local_attn_size − 3``: one chunk for universal/TempleRun (6 frames = current + 1 finished
  chunk), one frame for GTA (4 frames, committed frame by frame) — the bytes reported are those
  held frames' (``held_frames``);
* **peak estimate** = DiT + CLIP + VAE weights + stored caches + one layer's dequantized main
  window (BF16, what attention reads) — activations excluded.

    python benchmarks/matrix_game_memory.py [--out benchmarks/results/matrix_game_memory.json]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

from jbkv_cli.kvcache import FULL_PRECISION, ChunkKVCache, KVSpec
from jbkv_cli.models.wan.matrix_game.clip import VisionTower
from jbkv_cli.models.wan.matrix_game.config import PRESETS
from jbkv_cli.models.wan.matrix_game.dit import MatrixGameDiT

MB = 2**20
VARIANTS = {
    "BF16": FULL_PRECISION,
    "INT4": KVSpec.build("rtn", 4, correction="taylor"),
    "INT2": KVSpec.build("rtn", 2, correction="taylor"),
}


def chunk_bytes(spec: KVSpec, shape: tuple[int, ...]) -> int:
    """Bytes one committed chunk of K/V of ``shape`` holds under ``spec`` (BF16 input)."""
    g = torch.Generator().manual_seed(0)
    k = torch.randn(shape, generator=g).to(torch.bfloat16)
    v = torch.randn(shape, generator=g).to(torch.bfloat16)
    cache = ChunkKVCache(spec, window=1)
    cache.commit(k, v)
    return cache.nbytes


def encoders_bytes() -> int:
    """BF16 bytes of CLIP's visual tower (31 blocks) and the Wan2.1 VAE, built on meta."""
    import diffusers

    with torch.device("meta"):
        parts = [VisionTower(), diffusers.AutoencoderKLWan()]
    return sum(t.numel() for m in parts for t in m.parameters()) * 2


def preset_row(name: str, encoders: int) -> dict:
    p = PRESETS[name]
    d, a = p.dit, p.dit.action
    with torch.device("meta"):
        dit = MatrixGameDiT(d)
    weights = sum(t.numel() for t in dit.parameters()) * 2
    tokens = (p.height // 16) * (p.width // 16)
    k = p.chunk_frames
    held = d.local_attn_size - k
    main_shape = (1, d.heads, held * tokens, d.head_dim)
    mouse_shape = (tokens, a.heads, held, a.mouse_hidden // a.heads)
    key_shape = (1, a.heads, held, a.keyboard_hidden // a.heads)
    n_act = len(a.blocks)
    row = {
        "weights_bytes": weights,
        "encoders_bytes": encoders,
        "frame_tokens": tokens,
        "held_frames": held,
        "variants": {},
    }
    window = 2 * held * tokens * d.head_dim * d.heads * 2  # one layer's cached K+V, BF16
    for label, spec in VARIANTS.items():
        main = d.layers * chunk_bytes(spec, main_shape)
        for quantize in (True, False):
            s = spec if quantize else FULL_PRECISION
            mouse = n_act * chunk_bytes(s, mouse_shape) if a.mouse else 0
            keyboard = n_act * chunk_bytes(s, key_shape)
            key = label if quantize else f"{label} (action caches BF16)"
            if not quantize and label == "BF16":
                continue
            row["variants"][key] = {
                "main_bytes": main,
                "mouse_bytes": mouse,
                "keyboard_bytes": keyboard,
                "peak_estimate_bytes": weights + encoders + main + mouse + keyboard + window,
            }
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=Path("benchmarks/results/matrix_game_memory.json"))
    args = ap.parse_args()
    torch.set_num_threads(1)
    encoders = encoders_bytes()
    rows = {name: preset_row(name, encoders) for name in ("universal", "gta", "templerun")}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(rows, indent=2) + "\n")
    for name, row in rows.items():
        print(
            f"{name}: DiT {row['weights_bytes'] / MB:,.0f} MB, CLIP + VAE "
            f"{row['encoders_bytes'] / MB:,.0f} MB (BF16)"
        )
        for label, v in row["variants"].items():
            print(
                f"  {label:28s} main {v['main_bytes'] / MB:8.2f}  mouse {v['mouse_bytes'] / MB:8.2f}"
                f"  keyboard {v['keyboard_bytes'] / MB:6.3f} MB held · peak ≈ "
                f"{v['peak_estimate_bytes'] / MB:,.0f} MB"
            )


if __name__ == "__main__":
    main()
