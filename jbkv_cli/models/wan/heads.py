"""The caches of a Wan-family adapter: its head layout (what pruners need), the spec as it runs
it, the caches' pre-RoPE key table, the loop's caches and books, and the profiling run."""

from __future__ import annotations

from typing import Any

import torch

from jbkv_cli.attention.diagnostics import AttentionObserver
from jbkv_cli.kvcache import FULL_PRECISION, HeadLayout, KeyRope, KVSpec
from jbkv_cli.models.base import ProgressFn
from jbkv_cli.models.loop import MAIN, LoopCaches
from jbkv_cli.models.wan.decode import vae_scale
from jbkv_cli.models.wan.rope import wan_key_rope
from jbkv_cli.quant.qvg_policy import LAYOUTS
from jbkv_cli.utils.errors import UsageError


def head_layout(transformer: Any, vae: Any, height: int, width: int) -> HeadLayout:
    """What a pruner needs of a Wan-family transformer generating ``height``×``width`` frames:
    its blocks, heads (multi-head attention: every head is a KV head) and the tokens of one
    latent frame, ``(height/8/p_h)·(width/8/p_w)`` (frames are the outermost token axis)."""
    spatial = vae_scale(vae)[1]
    _, p_h, p_w = transformer.config.patch_size
    return HeadLayout(
        layers=len(transformer.blocks),
        kv_heads=transformer.config.num_attention_heads,
        frame_tokens=(height // spatial // p_h) * (width // spatial // p_w),
    )


class WanHeads:
    """``head_layout()``, ``loop_caches()`` and ``profile_heads()`` of a Wan-family adapter: it
    has ``components`` (transformer, vae), a ``config`` with ``height``/``width``, ``window``
    and ``num_chunks``, and ``generate_latents(prompt, seed, kv, probe=...)``."""

    components: Any
    config: Any
    pre_rope = True  # its caches can hold keys before RoPE (:meth:`key_rope`)

    def head_layout(self) -> HeadLayout:
        """Blocks, heads and tokens per latent frame (:func:`head_layout`)."""
        c, s = self.components, self.config
        return head_layout(c.transformer, c.vae, s.height, s.width)

    @property
    def chunk_tokens(self) -> int:
        """Tokens of one chunk (``chunk_frames`` latent frames)."""
        return self.head_layout()["frame_tokens"] * self.config.chunk_frames

    def resolve_kv(self, kv: KVSpec) -> KVSpec:
        """``kv`` as this model runs it (:meth:`KVSpec.for_model` for ``name:config``)."""
        return kv.for_model(f"{self.name}:{self.config.config}", self.chunk_tokens)  # type: ignore[attr-defined]

    def key_rope(self, kv: KVSpec, layout: str | None, latents: torch.Tensor) -> KeyRope | None:
        """The caches' :class:`KeyRope` for chunks shaped like ``latents`` when keys are cached
        before RoPE — the spec's method asks for it, or ``layout`` is ``pre-rope`` (whatever the
        spec; ``post-rope`` or None: as the spec) — else None."""
        if layout is not None and layout not in LAYOUTS:
            raise UsageError(f"key layout must be one of {', '.join(LAYOUTS)}, got {layout!r}")
        if "pre-rope" not in (layout, kv.key_layout):
            return None
        return wan_key_rope(self.components.transformer, latents)

    def loop_caches(
        self,
        spec: KVSpec,
        rope: KeyRope | None,
        observer: AttentionObserver | None,
        probe: Any,
        progress: ProgressFn | None,
        branches: tuple[str, ...] = (MAIN,),
        phase: KeyRope | None = None,
    ) -> LoopCaches:
        """One cache per block and branch (e.g. per CFG branch) for ``spec``, holding
        ``config.window`` chunks, and the loop's books (working bytes measured); ``phase``: the
        RoPE table a pruner that re-phases held keys needs."""
        return LoopCaches.build(
            spec,
            self.config.window,
            model=self.name,  # type: ignore[attr-defined]
            heads=self.head_layout(),
            chunks=self.config.num_chunks,
            observer=observer,
            rope=rope,
            probe=probe,
            progress=progress,
            branches=branches,
            views=True,
            phase=phase,
        )

    def profile_heads(self, prompt: str, seed: int, probe: Any) -> None:
        """Generate ``prompt`` with the full-precision cache while ``probe`` measures every
        cache read (``jbkv profile-heads``)."""
        probe.begin_sample(prompt, seed)
        self.generate_latents(prompt, seed, FULL_PRECISION, probe=probe)  # type: ignore[attr-defined]
