"""Chunk-cached self-attention for diffusers' ``SkyReelsV2Transformer3DModel``.

Neither SkyReels-V2's own code nor diffusers keeps a KV cache: both re-feed every finished frame
at every step under a block-causal mask. jbkv instead runs the transformer on the current chunk
only, with the shared pieces of :mod:`jbkv_cli.models.wan.attention` (cached ``attn1``
processors reading a :class:`ChunkKVCache` per layer, RoPE shifted by the chunk's frame offset),
plus one SkyReels-specific step: ``num_frame_per_block = 1`` while installed, so the model builds
no block-causal mask (the causality lives in the cache).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from jbkv_cli.models.wan.attention import (
    CachedSelfAttnProcessor,
    ChunkContext,
    LayerCache,
    cached_self_attention,
)
from jbkv_cli.models.wan.rope import rotate_interleaved, shifted_rotary

__all__ = [
    "CachedSelfAttnProcessor",
    "ChunkContext",
    "LayerCache",
    "chunk_attention",
    "rotate_interleaved",
    "shifted_rotary",
]


@contextmanager
def chunk_attention(transformer: Any, context: ChunkContext) -> Iterator[ChunkContext]:
    """Install chunk-cached self-attention on ``transformer`` for the duration of the block.

    Restores the original processors, the rope module's behaviour and ``num_frame_per_block``
    on exit, also when the body raises.
    """
    saved_block_size = transformer.config.num_frame_per_block
    try:
        transformer.register_to_config(num_frame_per_block=1)
        with cached_self_attention(transformer, context):
            yield context
    finally:
        transformer.register_to_config(num_frame_per_block=saved_block_size)
