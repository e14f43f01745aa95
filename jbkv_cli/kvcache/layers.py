"""A model's stack of per-layer caches: one :class:`ChunkKVCache` per attention layer, each with
its layer's pruning plan when the variant prunes.

    caches = layer_caches(spec, window, model="self-forcing", layers=30, kv_heads=12,
                          frame_tokens=1560)

A model adapter states its :class:`HeadLayout` (``head_layout()``); a pruner turns it into one
plan per layer (:meth:`~jbkv_cli.prune.base.KVPruner.plans`), read from the pruner's head
profile for ``model``. :func:`nbytes_by_kind` sums what the stack holds per class of KV head,
and :class:`PeakBytes` keeps the most a stack held after a commit, split by class at that moment.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
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
) -> list[ChunkKVCache]:
    """One cache per layer of ``model``, with the pruner's plan for each layer when
    ``spec.pruner`` is set (``ValueError`` when its profile does not fit the layout); ``rope``:
    the caches hold keys before RoPE and rotate them on read (one table for every layer)."""
    if rope is None and spec.key_layout == "pre-rope":
        raise ValueError(f"{spec.label} caches keys before RoPE, which {model} does not support")
    plans: list = [None] * layers
    if spec.pruner is not None:
        plans = spec.pruner.plans(model, layers, kv_heads, frame_tokens)
    caches = [
        ChunkKVCache(spec, window, observer=observer, pruning=plan, rope=rope) for plan in plans
    ]
    for index, cache in enumerate(caches):
        cache.layer = index  # the diagnostics record per layer
    return caches


def nbytes_by_kind(caches: Iterable[ChunkKVCache]) -> dict[str, int]:
    """What the caches hold now, per class of KV head of their pruner (empty without one)."""
    out: dict[str, int] = {}
    for cache in caches:
        if getattr(cache, "pruning", None) is None:
            continue
        for kind, held in cache.nbytes_by_kind().items():
            out[kind] = out.get(kind, 0) + held
    return out


@dataclass
class PeakBytes:
    """The most bytes a stack of caches held (:meth:`update` after each commit), and what they
    held per class of KV head at that moment (empty without a pruner)."""

    total: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)

    def update(self, caches: Sequence[ChunkKVCache]) -> None:
        held = sum(cache.nbytes for cache in caches)
        if held >= self.total:
            self.total, self.by_kind = held, nbytes_by_kind(caches)
