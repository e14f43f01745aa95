"""Synthetic attention: the Jensen bias on random queries and keys, no model involved.

A query block (the current chunk) attends to ``cached`` random keys (quantized per the variant)
and to its own ``current`` keys (full precision). Keys and queries are Gaussian with a per-channel
scale drawn once (so channels differ in range, as real keys do). Everything is seeded.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from jbkv_cli.attention import AttentionRecorder
from jbkv_cli.kvcache import ChunkKVCache, KVSpec


@dataclass(frozen=True)
class SyntheticConfig:
    heads: int = 4
    head_dim: int = 64
    cached: int = 1024
    current: int = 256
    seed: int = 0


def synthetic_problem(cfg: SyntheticConfig) -> tuple[torch.Tensor, ...]:
    """``(q, k_cached, v_cached, k_cur, v_cur)`` as ``[1, H, L, D]`` float32 tensors."""
    g = torch.Generator().manual_seed(cfg.seed)
    channel_scale = torch.exp(torch.randn(cfg.head_dim, generator=g) * 0.5)

    def draw(length: int, scaled: bool = True) -> torch.Tensor:
        x = torch.randn(1, cfg.heads, length, cfg.head_dim, generator=g)
        return x * channel_scale if scaled else x

    q = draw(cfg.current)
    return q, draw(cfg.cached), draw(cfg.cached, False), draw(cfg.current), draw(cfg.current, False)


def synthetic_row(spec: KVSpec, cfg: SyntheticConfig = SyntheticConfig()) -> dict:
    """ΔP_S, JSD and output MSE of one variant on the synthetic problem."""
    q, kc, vc, k, v = synthetic_problem(cfg)
    scale = cfg.head_dim**-0.5
    rec = AttentionRecorder(max_queries=cfg.current, every=1)
    cache = ChunkKVCache(spec, observer=rec)
    cache.commit(kc, vc)
    cache.attend(q, k, v, scale)
    summary = rec.summary()
    bits = 16 if spec.is_reference else cache.nbytes * 8 / (2 * kc.numel())
    return {"variant": spec.label, "effective_bits": bits, **summary}
