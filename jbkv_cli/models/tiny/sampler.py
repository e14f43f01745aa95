"""Chunk-wise generation with the tiny model: few-step flow sampling against a KV cache.

For chunk ``i = 0 .. N-1``:

1. start from noise ``x_1 = eps_i`` and take ``S`` Euler steps of the x0-parametrised flow on
   the grid ``t_k = 1 - k/S``: ``x0_hat = f(x_tk)``, ``x_t(k+1) = x0_hat + (t_(k+1)/t_k)(x_tk - x0_hat)``;
   every step attends to the cached chunks (read through ``ChunkKVCache.attend``) and to the
   current chunk in full precision;
2. refresh pass: run the finished chunk once more at the small context noise level ``t_c``
   (``x = (1 - t_c) x0_hat + t_c eps'_i``, as in training) and commit its post-RoPE keys and values
   of every layer to the caches, where they are quantized once per the :class:`KVSpec` (keys
   before RoPE, rotated on read by the cache, when the spec's layout is ``pre-rope``).

With a pruner in the :class:`KVSpec`, each layer's cache gets its pruning state from the
pruner's profile for ``tiny`` (frames of ``(H/p)(W/p)`` tokens). A ``probe``
(:class:`~jbkv_cli.prune.profile.FrameMassProbe`) wraps the caches and is told the chunk and
denoising step of every forward (``None`` for the refresh pass). The caches' bookkeeping (peak
bytes after each refresh pass, progress) is :class:`~jbkv_cli.models.loop.LoopCaches`'.

All noise (``eps_i``, ``eps'_i``) is drawn up front on the CPU from
``noise_generator(seed, prompt)``, so every KV variant of a (prompt, seed) sees identical inputs.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

import torch

from jbkv_cli.attention.diagnostics import AttentionObserver
from jbkv_cli.kvcache.spec import KVSpec
from jbkv_cli.models.loop import LoopCaches
from jbkv_cli.models.seeding import noise_generator
from jbkv_cli.models.tiny.model import TinyDiT, key_rope, unpatchify


@dataclass(frozen=True)
class SamplerSettings:
    """Generation settings of the tiny model."""

    num_chunks: int = 8
    steps: int = 4
    window: int = 2
    ctx_noise: float = 0.1


@dataclass
class Generated:
    """Frames in [0, 1] ``[T, 3, H, W]`` and the cache facts of
    :meth:`~jbkv_cli.models.loop.LoopCaches.facts` (``kv_cache_bytes``: the peak bytes all
    layers' caches held after a refresh pass; when pruning, ``kv_cache_bytes_by_head``)."""

    frames: torch.Tensor
    facts: dict[str, Any]


def draw_noise(model: TinyDiT, num_chunks: int, seed: int, prompt: str) -> torch.Tensor:
    """``[num_chunks, 2, L_c, patch_dim]``: per chunk the initial and the refresh noise (CPU)."""
    cfg = model.cfg
    gen = noise_generator(seed, prompt)
    return torch.randn(num_chunks, 2, cfg.chunk_len, cfg.patch_dim, generator=gen)


@torch.inference_mode()
def sample(
    model: TinyDiT,
    words: list[int],
    noise: torch.Tensor,
    kv: KVSpec,
    settings: SamplerSettings,
    progress: Callable[[int, int], None] | None = None,
    observer: AttentionObserver | None = None,
    probe=None,
) -> Generated:
    """Generate ``settings.num_chunks`` chunks (see the module docstring)."""
    cfg = model.cfg
    device = next(model.parameters()).device
    pre = kv.key_layout == "pre-rope"
    rope = key_rope(cfg, device) if pre else None
    books = LoopCaches.build(
        kv,
        settings.window,
        model="tiny",
        heads=model.head_layout,
        chunks=settings.num_chunks,
        observer=observer,
        rope=rope,
        probe=probe,
        progress=progress,
    )
    layers = books.layers()
    word_ids = torch.tensor([words], device=device)
    grid = [1.0 - k / settings.steps for k in range(settings.steps + 1)]
    noise = noise.to(device)  # once per video: a copy from the host per chunk waits for the device
    chunks = []
    for i in range(settings.num_chunks):
        x = noise[i, 0][None]
        x0 = x
        for step, (t, t_next) in enumerate(pairwise(grid)):
            books.at(i, step)
            x0 = model.forward_chunk(
                x, torch.full((1,), t, device=device), word_ids, i, layers, pre_rope=pre
            )
            x = x0 + (t_next / t) * (x - x0)
        tc = settings.ctx_noise
        ctx = (1 - tc) * x0 + tc * noise[i, 1][None]
        with books.commit_pass(i):
            model.forward_chunk(
                ctx, torch.full((1,), tc, device=device), word_ids, i, layers, True, pre_rope=pre
            )
        chunks.append(x0)
        books.chunk_done(i + 1)
    tokens = torch.cat(chunks, 1)
    video = unpatchify(tokens, cfg.patch_size, cfg.channels, cfg.image_size)[0]
    frames = ((video.float().cpu() + 1) / 2).clamp(0, 1)
    return Generated(frames, books.facts())
