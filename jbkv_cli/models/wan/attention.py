"""Chunk-cached self-attention for diffusers' Wan-family transformers.

diffusers' Wan-family transformers (``WanTransformer3DModel``, ``SkyReelsV2Transformer3DModel``)
keep no KV cache. jbkv runs such a transformer on the current chunk only and lets each
self-attention layer read the finished chunks from a :class:`ChunkKVCache`:

    out = softmax(τ q [K̂_cached | K_cur]ᵀ − b) [V̂_cached | V_cur],    τ = 1/√D,

with ``b`` the cache's Jensen-bias correction on cached scores (zero for current keys).

Two pieces, installed by :func:`cached_self_attention` and removed when it exits (kvpress-style,
so one loaded model serves every variant and diffusers' code stays untouched):

* :class:`CachedSelfAttnProcessor` on every block's ``attn1`` (via ``set_processor``). Cross
  attention (``attn2``) keeps diffusers' processor: text keys are never cached.
* a forward hook on ``transformer.rope`` that shifts the frame axis of the rotary table by the
  chunk's absolute frame offset (diffusers restarts frames at 0 in every forward), so cached keys
  keep the absolute positions they were committed with.

All processors share one :class:`ChunkContext`, the mutable state the generation loop sets
before each forward: which per-layer caches to use (one set per CFG branch), whether this
forward commits its keys and values, and the frame offset. The rotary table and its offset are
:mod:`jbkv_cli.models.wan.rope`'s.

**Pre-RoPE keys** (``ChunkContext.key_rope``, from :func:`~jbkv_cli.models.wan.rope.wan_key_rope`): the processor commits
the keys before RoPE, at the chunk's frame offset, and the caches (built with the same
:class:`~jbkv_cli.kvcache.rope.KeyRope`) rotate them on read with the model's own table — as
QuantVideoGen's Self-Forcing integration does (``attn_kv_cache_prerope``). The current chunk
attends to its own rotated keys either way.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from jbkv_cli.kvcache.rope import KeyRope
from jbkv_cli.models.wan.rope import rotate_interleaved, shifted_rotary


class LayerCache(Protocol):
    """What a processor needs from one layer's cache (``jbkv_cli.kvcache.ChunkKVCache``)."""

    def attend(
        self,
        q: torch.Tensor,
        k_cur: torch.Tensor,
        v_cur: torch.Tensor,
        scale: float,
        backend: str | None = None,
        **reads: Any,
    ) -> torch.Tensor: ...

    def commit(self, k: torch.Tensor, v: torch.Tensor, position: int | None = None) -> None: ...


@dataclass
class ChunkContext:
    """State shared by the installed processors during one chunk-wise generation.

    Attributes:
        caches: one cache per transformer block, indexed like ``transformer.blocks``.
        commit: when True the forward commits each layer's post-RoPE K/V of the current chunk
            (``[B, H, L_chunk, D]``) to its cache, after attending.
        frame_offset: absolute latent-frame index of the current chunk's first frame.
        backend: jbkv attention backend (``fused``, ``flex``, ``reference``); None: the default.
        key_rope: set when the caches hold keys before RoPE: commits then carry the un-rotated
            keys and ``frame_offset`` as their position.
        reads: extra arguments of every cache read in this forward (``last``, ``positions``,
            ``sinks`` of :meth:`~jbkv_cli.kvcache.ChunkKVCache.attend`; Rolling Forcing's
            window and clean passes read different parts of the cache).
        qk_norm: ``qk_norm(norm, x)`` normalises q and k with the block's ``norm_q``/``norm_k``
            (Self-Forcing's upstream casting:
            :func:`~jbkv_cli.models.wan.self_forcing.upstream.wan_rms_norm`); None: the module
            itself (diffusers' RMSNorm).
    """

    caches: Sequence[LayerCache] = field(default_factory=list)
    commit: bool = False
    frame_offset: int = 0
    backend: str | None = None
    key_rope: KeyRope | None = None
    reads: dict[str, Any] = field(default_factory=dict)
    qk_norm: Callable[[Any, torch.Tensor], torch.Tensor] | None = None


class CachedSelfAttnProcessor:
    """Self-attention of one block over [cached chunks | current chunk].

    Same call signature as diffusers' ``WanAttnProcessor`` / ``SkyReelsV2AttnProcessor``
    (``attn, hidden_states, encoder_hidden_states, attention_mask, rotary_emb``); only
    self-attention is supported, and no mask: causality lives in the cache (a chunk sees the
    committed, earlier chunks and itself).
    """

    def __init__(self, context: ChunkContext, layer: int) -> None:
        self.context = context
        self.layer = layer

    def __call__(
        self,
        attn: Any,
        hidden_states: torch.Tensor,
        encoder_hidden_states: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        rotary_emb: tuple[torch.Tensor, torch.Tensor] | None = None,
    ) -> torch.Tensor:
        if encoder_hidden_states is not None:
            raise RuntimeError("CachedSelfAttnProcessor serves self-attention (attn1) only")
        if attention_mask is not None:
            raise RuntimeError(
                "an attention mask reached the chunk-cached processor; the transformer must run "
                "one chunk per forward without a block mask"
            )
        if getattr(attn, "fused_projections", False):
            q, k, v = attn.to_qkv(hidden_states).chunk(3, dim=-1)
        else:
            q, k, v = attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states)
        norm = self.context.qk_norm
        if norm is None:
            q, k = attn.norm_q(q), attn.norm_k(k)
        else:
            q, k = norm(attn.norm_q, q), norm(attn.norm_k, k)
        q, k, v = (t.unflatten(2, (attn.heads, -1)) for t in (q, k, v))  # [B, L, H, D]
        k_pre = k
        if rotary_emb is not None:
            q = rotate_interleaved(q, *rotary_emb)
            k = rotate_interleaved(k, *rotary_emb)
        q, k, v, k_pre = (t.transpose(1, 2) for t in (q, k, v, k_pre))  # [B, H, L, D]

        cache = self.context.caches[self.layer]
        out = cache.attend(
            q, k, v, scale=q.shape[-1] ** -0.5, backend=self.context.backend, **self.context.reads
        )  # [B, H, L, D]
        if self.context.commit and self.context.key_rope is not None:
            cache.commit(k_pre, v, position=self.context.frame_offset)
        elif self.context.commit:
            cache.commit(k, v)

        out = out.transpose(1, 2).flatten(2).type_as(q)
        out = attn.to_out[0](out)
        return attn.to_out[1](out)


@contextmanager
def cached_self_attention(transformer: Any, context: ChunkContext) -> Iterator[ChunkContext]:
    """Install chunk-cached self-attention and the RoPE frame offset on ``transformer``.

    Restores the original processors and the rope module's behaviour on exit, also when the
    body raises.
    """
    blocks = list(transformer.blocks)
    saved = [block.attn1.get_processor() for block in blocks]

    def rope_hook(module, args, output):
        if context.frame_offset == 0:
            return None
        return shifted_rotary(module, args[0], context.frame_offset)

    handle = transformer.rope.register_forward_hook(rope_hook)
    try:
        for i, block in enumerate(blocks):
            block.attn1.set_processor(CachedSelfAttnProcessor(context, i))
        yield context
    finally:
        handle.remove()
        for block, processor in zip(blocks, saved, strict=True):
            block.attn1.set_processor(processor)
