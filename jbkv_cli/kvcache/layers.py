"""A model's stack of per-layer caches: one :class:`ChunkKVCache` per attention layer, each with
its layer's pruning plan when the variant prunes.

    caches = layer_caches(spec, window, model="self-forcing", layers=30, kv_heads=12,
                          frame_tokens=1560)

A model adapter states its :class:`HeadLayout` (``head_layout()``); a pruner turns it into one
plan per layer (:meth:`~jbkv_cli.prune.base.KVPruner.plans`), read from the pruner's head
profile for ``model``. What a loop's stacks hold at their peak is counted by
:class:`jbkv_cli.models.loop.LoopCaches`.
"""

from __future__ import annotations

from typing import TypedDict

from jbkv_cli.attention.diagnostics import AttentionObserver
from jbkv_cli.kvcache.cache import ChunkKVCache
from jbkv_cli.kvcache.rope import KeyRope
from jbkv_cli.kvcache.spec import KVSpec


class HeadLayout(TypedDict):
    """What a pruner needs of a model: attention ``layers``, ``kv_heads`` per layer and
    ``frame_tokens`` (tokens of one latent frame, consecutive in the model's token order)."""

    layers: int
    kv_heads: int
    frame_tokens: int


def layer_caches(
    spec: KVSpec,
    window: int | None,
    *,
    model: str,
    layers: int,
    kv_heads: int,
    frame_tokens: int,
    observer: AttentionObserver | None = None,
    rope: KeyRope | None = None,
    phase: KeyRope | None = None,
) -> list[ChunkKVCache]:
    """One cache per layer of ``model``, with the pruner's plan for each layer when
    ``spec.pruner`` is set (``ValueError`` when its profile does not fit the layout), each at
    its layer's widths when they differ by layer (:meth:`KVSpec.at_layer`; ``ValueError`` when
    the per-layer spec does not fit ``layers``); ``rope``: the caches hold keys before RoPE and
    rotate them on read (one table for every layer); ``phase``: the model's RoPE table for a
    pruner that re-phases held keys (:class:`~jbkv_cli.prune.base.ReadPruning`). A pruner that
    bounds the cache itself (``owns_buffer``) gets no ``window``: it would evict the pruner's
    sink."""
    if rope is None and spec.key_layout == "pre-rope":
        raise ValueError(f"{spec.label} caches keys before RoPE, which {model} does not support")
    if spec.layers is not None:
        spec.layers.check(layers)
    plans: list = [None] * layers
    if spec.pruner is not None:
        plans = spec.pruner.plans(model, layers, kv_heads, frame_tokens)
        if spec.pruner.owns_buffer:
            window = None
    caches = [
        ChunkKVCache(
            spec.at_layer(i), window, observer=observer, pruning=plan, rope=rope, phase=phase
        )
        for i, plan in enumerate(plans)
    ]
    for index, cache in enumerate(caches):
        cache.layer = index  # the diagnostics record per layer
    return caches
