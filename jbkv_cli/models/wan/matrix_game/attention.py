"""The two ways Matrix-Game's DiT computes attention: over jbkv's chunk caches (the loop) or
over a whole sequence under upstream's block-causal local mask (the cache-free oracle).

Upstream's cached path (``CausalWanSelfAttention`` and the ActionModule's ``kv_cache_mouse`` /
``kv_cache_keyboard`` branches) writes the chunk's keys into a rolling buffer and attends to
its last ``local_attn_size`` frames (× 880 tokens for the main cache), the current chunk
included, without a mask inside the window. With chunks of ``k`` frames and ``local_attn_size``
a multiple of ``k`` that is the current chunk plus ``local/k − 1`` finished chunks:
:class:`CachedAttention` gives each :class:`~jbkv_cli.kvcache.ChunkKVCache` that window; else
(GTA: 4 frames) it commits frame by frame (``splits``) and the caches keep ``local − k`` frames.
Its training path (``_prepare_blockwise_causal_attn_mask[_action]``) lets a query of frame
``f`` see key frames ``[end(f) − local, end(f))`` with ``end(f)`` the end of ``f``'s chunk:
:class:`MaskedAttention` applies exactly that to a whole sequence.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch.nn.functional import scaled_dot_product_attention as sdpa

from jbkv_cli.kvcache import ChunkKVCache


class CachedAttention:
    """Attention over ``[cached window | current chunk]``; commits the current chunk's keys
    and values to every cache when ``commit`` is set (the clean-context pass)."""

    def __init__(
        self,
        main: Sequence[ChunkKVCache],
        mouse: Mapping[int, ChunkKVCache],
        keyboard: Mapping[int, ChunkKVCache],
        backend: str | None = None,
    ) -> None:
        self.main, self.mouse_caches, self.keyboard_caches = main, mouse, keyboard
        self.backend = backend
        self.commit = False
        # (main, action) tokens per committed piece; None: the chunk in one commit
        self.splits: tuple[int, int] | None = None

    def _run(self, cache: ChunkKVCache, q, k, v, split: int | None) -> torch.Tensor:
        out = cache.attend(q, k, v, scale=q.shape[-1] ** -0.5, backend=self.backend)
        if self.commit and split is None:
            cache.commit(k, v)
        elif self.commit:
            for kk, vv in zip(k.split(split, dim=2), v.split(split, dim=2), strict=True):
                cache.commit(kk.contiguous(), vv.contiguous())
        return out.to(v.dtype)

    def _split(self, i: int) -> int | None:
        return None if self.splits is None else self.splits[i]

    def self_attn(self, layer, q, k, v):
        return self._run(self.main[layer], q, k, v, self._split(0))

    def mouse(self, layer, q, k, v):
        return self._run(self.mouse_caches[layer], q, k, v, self._split(1))

    def keyboard(self, layer, q, k, v):
        return self._run(self.keyboard_caches[layer], q, k, v, self._split(1))


def local_mask(q_frames: torch.Tensor, k_frames: torch.Tensor, chunk: int, local: int):
    """``[Lq, Lk]`` bool: key frame in ``[end − local, end)``, ``end`` the query chunk's end."""
    end = (q_frames // chunk + 1) * chunk
    return (k_frames[None] < end[:, None]) & (k_frames[None] >= end[:, None] - local)


class MaskedAttention:
    """Cache-free attention over a whole sequence of ``frames`` latent frames of
    ``frame_tokens`` tokens each, under the block-causal local mask (module docstring)."""

    def __init__(self, frames: int, frame_tokens: int, chunk: int, local: int) -> None:
        f = torch.arange(frames)
        tok = f.repeat_interleave(frame_tokens)
        self.main_mask = local_mask(tok, tok, chunk, local)
        self.mouse_mask = local_mask(f, f, chunk, local)
        self.keyboard_mask = local_mask(tok, f, chunk, local)

    def self_attn(self, layer, q, k, v):
        return sdpa(q, k, v, attn_mask=self.main_mask)

    def mouse(self, layer, q, k, v):
        return sdpa(q, k, v, attn_mask=self.mouse_mask)

    def keyboard(self, layer, q, k, v):
        return sdpa(q, k, v, attn_mask=self.keyboard_mask)
