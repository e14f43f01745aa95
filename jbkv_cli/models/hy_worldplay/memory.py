"""HY-WorldPlay's reconstituted context memory, held in jbkv caches.

Upstream (``worldplay_video_pipeline.py:_ar_rollout_inner``, ``attention.py:
sequence_parallel_attention_vision``) keeps per block ``k_txt, v_txt`` (the text pass, once)
and ``k_vision, v_vision`` (both branches, refilled by every chunk's memory pass); a denoising
forward attends ``[text | memory | current]`` and caches nothing of the current chunk. Here:

- per block one text :class:`~jbkv_cli.kvcache.ChunkKVCache` (committed once by the text pass,
  read by both branches) and one memory cache per branch (``rope``: post-RoPE keys; ``prope``:
  ``P^-1`` keys and values), window 1: a chunk's memory pass commits the memory latents' K/V,
  which quantizes them once (the memory is rebuilt from clean latents every chunk, so there is
  nothing older to keep) and evicts the previous chunk's memory;
- the text stays 16-bit unless ``quantize_text`` (then the variant's methods store it too);
- attention (:meth:`WorldPlayCache.attend`): the memory pass reads ``[text | its own tokens]``
  (exact: quantization enters with the commit after it); a denoising forward reads
  ``[text | memory | current]`` with the variant's correction on every cached key whose step
  is known, each branch with its own query (the PRoPE branch's ``P^T q``: its scores are
  ``P^T q . P^-1 k``, so its quantization error is seen through that query);
- bytes per part (text, each branch's memory) from the stored tensors, counted by the rollout's
  :class:`~jbkv_cli.models.loop.LoopCaches` after the text pass and after each memory pass.

Diagnostics (an :class:`~jbkv_cli.attention.diagnostics.AttentionObserver`) see every
``observer.every``-th denoising read of each (block, branch), with the full-precision copies.
"""

from __future__ import annotations

from dataclasses import replace

import torch

from jbkv_cli.attention.attend import CachedKV, attend
from jbkv_cli.attention.diagnostics import AttentionObserver
from jbkv_cli.kvcache import ChunkKVCache, KVSpec
from jbkv_cli.models.hy_worldplay.dit import BRANCHES

TEXT = "text"


def text_spec(kv: KVSpec, quantize_text: bool) -> KVSpec:
    """How the text K/V are stored: 16-bit, or (``quantize_text``) as the memory."""
    if not quantize_text or not kv.quantized:
        return KVSpec()
    return replace(kv, pruner=None, sink_chunks=0)


def combine(views: list[CachedKV | None]) -> CachedKV | None:
    """One cached segment from consecutive ones (text, then memory): keys, values, steps
    (zeros where a segment has none), the signed correction's terms (``k_step2`` zeros and
    ``k_unshrink`` ones where a segment has no step; None when a segment with a step has
    none), whether every step is an FP8 value by format, rotation and the full-precision
    copies when every segment has them."""
    views = [v for v in views if v is not None and v.num_tokens]
    if len(views) <= 1:
        return views[0] if views else None
    k = torch.cat([v.k for v in views], dim=-2)
    val = torch.cat([v.v for v in views], dim=-2)
    stepped = [v for v in views if v.k_step is not None]
    step = None
    if stepped:
        groups = stepped[0].k_step.shape[-1]
        step = _joined(views, lambda v: v.k_step, 0.0, groups)
    rotation = next((v.rotation for v in views if v.rotation is not None), None)
    out = CachedKV(k, val, step, rotation, steps_fp8=all(v.steps_fp8 for v in stepped))
    if stepped and all(v.k_step2 is not None for v in stepped):
        out.k_step2 = _joined(views, lambda v: v.k_step2, 0.0, groups)
        if any(v.k_unshrink is not None for v in stepped):
            out.k_unshrink = _joined(views, lambda v: v.k_unshrink, 1.0, 1)
    if all(v.k_ref is not None for v in views):
        out.k_ref = torch.cat([v.k_ref for v in views], dim=-2)
        out.v_ref = torch.cat([v.v_ref for v in views], dim=-2)
    return out


def _joined(views: list[CachedKV], part, fill: float, width: int) -> torch.Tensor:
    """``part(view)`` ``[..., L, width]`` of each view concatenated over tokens, ``fill``
    where a view has none (an exact segment: no step, no noise, no unshrinking)."""
    known = next(p for v in views if (p := part(v)) is not None)
    return torch.cat(
        [
            p
            if (p := part(v)) is not None
            else torch.full((*v.k.shape[:-1], width), fill, dtype=known.dtype, device=v.k.device)
            for v in views
        ],
        dim=-2,
    )


class WorldPlayCache:
    """Text and memory caches of every block, and the attention that reads them."""

    def __init__(
        self,
        kv: KVSpec,
        layers: int,
        *,
        quantize_text: bool = False,
        observer: AttentionObserver | None = None,
        backend: str | None = None,
    ) -> None:
        if kv.pruner is not None:
            raise ValueError("HY-WorldPlay's memory is rebuilt every chunk; it is not pruned")
        self.kv = kv
        if kv.layers is not None:
            kv.layers.check(layers)
        per_layer = [kv.at_layer(i) for i in range(layers)]  # its widths, per layer
        self.text = [
            ChunkKVCache(text_spec(s, quantize_text), observer=observer) for s in per_layer
        ]
        self.memory = {
            b: [ChunkKVCache(s, window=1, observer=observer) for s in per_layer] for b in BRANCHES
        }
        self.observer = observer
        self.backend = backend
        self.memory_pass = False
        self._calls: dict[tuple[int, str], int] = {}

    # ------------------------------------------------------------------ filling

    def store_text(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """The text pass's K/V of ``layer`` (``[1, H, L_txt, D]``), committed once."""
        self.text[layer].commit(k, v)

    # ------------------------------------------------------------------ reading

    def attend(
        self, layer: int, branch: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> torch.Tensor:
        """Attention of one block's branch (``dit.Attend``): in the memory pass over ``[text |
        these tokens]``, then the tokens are committed; else over ``[text | memory | these]``."""
        text, mem = self.text[layer], self.memory[branch][layer]
        caches = [text] if self.memory_pass else [text, mem]
        cached = combine([c.read() for c in caches])
        scale = q.shape[-1] ** -0.5
        correction = self.kv.correction_
        out = attend(q, k, v, cached, scale=scale, correction=correction, backend=self.backend)
        for cache in caches:
            if cache.queries is not None:
                cache.queries.update(q, k.shape[-3])
        if self.memory_pass:
            mem.commit(k, v)
        else:
            self._observe(layer, branch, q, k, v, cached, scale)
        return out

    def _observe(self, layer, branch, q, k, v, cached: CachedKV | None, scale: float) -> None:
        obs = self.observer
        if obs is None or cached is None or cached.k_ref is None or cached.k_step is None:
            return
        key = (layer, branch)
        self._calls[key] = self._calls.get(key, 0) + 1
        if self._calls[key] % obs.every == 0:
            obs.observe(q, k, v, cached, scale, self.kv.correction_)
