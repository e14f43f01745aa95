"""MAGI-1 attention through jbkv's per-layer :class:`~jbkv_cli.kvcache.ChunkKVCache`.

A chunk that reads ``n`` cached chunks needs absolute chunks ``[s - n, s)``, where ``s`` (the
slice point) equals the number of chunks committed so far. ``ChunkKVCache.read(last=m)`` returns
the sink chunks plus the last ``m`` regular chunks, so ``m`` is ``n`` minus the sinks inside
that range. Sink chunks (``KVSpec.sink_chunks``) are therefore attended by every chunk that reads
the cache at all; a chunk with ``n = 0`` (e.g. the refresh pass) bypasses the cache.
"""

from __future__ import annotations

import torch

from jbkv_cli.attention.diagnostics import AttentionObserver
from jbkv_cli.kvcache import ChunkKVCache
from jbkv_cli.kvcache.spec import KVSpec
from jbkv_cli.models.magi1.dit import AttendFn, plain_attend


def regular_last(cache: ChunkKVCache, n_cached: int) -> int:
    """``last`` for ``cache.read``/``attend`` so that it covers absolute chunks ``[s - n, s)``."""
    s = cache.committed
    if n_cached > s:
        raise ValueError(f"a chunk wants {n_cached} cached chunks but only {s} were committed")
    sinks = min(cache.spec.sink_chunks, s)
    regular = n_cached - max(0, sinks - (s - n_cached))
    held = cache.num_chunks - sinks
    if regular > held:
        raise ValueError(f"a chunk wants {regular} cached chunks but the cache window holds {held}")
    return regular


def cache_attend(backend: str | None = None) -> AttendFn:
    """An :data:`AttendFn` that reads ``n_cached`` chunks of the layer cache (``backend``:
    ``fused``, ``flex``, ``reference`` or None for jbkv's default)."""

    def attend(q, k, v, *, scale, cache=None, n_cached=0) -> torch.Tensor:
        if cache is None or n_cached == 0:
            return plain_attend(q, k, v, scale=scale)
        last = regular_last(cache, n_cached)
        return cache.attend(q, k, v, scale, last=last, backend=backend)

    return attend


def make_caches(
    spec: KVSpec, num_layers: int, window: int, observer: AttentionObserver | None = None
) -> list[ChunkKVCache]:
    """One cache per transformer layer, each holding at most ``window`` regular chunks (at its
    layer's widths: :meth:`~jbkv_cli.kvcache.KVSpec.at_layer`)."""
    if spec.layers is not None:
        spec.layers.check(num_layers)
    caches = [ChunkKVCache(spec.at_layer(i), window, observer=observer) for i in range(num_layers)]
    for index, cache in enumerate(caches):
        cache.layer = index  # the diagnostics record per layer
    return caches
