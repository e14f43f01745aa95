"""``Magi1VideoModel``: MAGI-1 behind jbkv's :class:`~jbkv_cli.models.contract.VideoModel` protocol."""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any

import torch

from jbkv_cli.attention.diagnostics import AttentionObserver
from jbkv_cli.kvcache import FULL_PRECISION, HeadLayout, KVSpec
from jbkv_cli.models.base import ProgressFn, Video, text_case
from jbkv_cli.models.cases import Case
from jbkv_cli.models.contract import VideoModelBase
from jbkv_cli.models.loop import LoopCaches
from jbkv_cli.models.magi1.config import Magi1Variant
from jbkv_cli.models.magi1.dit import VideoDiT
from jbkv_cli.models.magi1.kv import cache_attend
from jbkv_cli.models.magi1.sampler import Sampler
from jbkv_cli.models.magi1.schedule import ForwardPlan, plan_forwards, validate
from jbkv_cli.models.magi1.text import SpecialTokens, T5TextEncoder, build_text_condition
from jbkv_cli.models.magi1.vae import ViTVAE, tiled_decode, to_uint8
from jbkv_cli.models.seeding import noise_generator
from jbkv_cli.utils.errors import UsageError


@dataclass
class GenerationSettings:
    height: int
    width: int
    num_chunks: int
    window: int  # cache capacity in chunks; attention ranges are capped at window + 1
    device: str
    dtype: torch.dtype
    offload: bool
    attention_backend: str | None
    nearly_clean_refine: bool = True
    tile_px: int = 256

    def latent_shape(self, variant: Magi1Variant) -> tuple[int, int, int, int, int]:
        s = variant.schedule
        return (
            1,
            variant.dit.latent_channels,
            self.num_chunks * s.chunk_width,
            self.height // s.spatial_downsample_factor,
            self.width // s.spatial_downsample_factor,
        )


class Magi1VideoModel(VideoModelBase):
    """MAGI-1 text-to-video with every finished chunk's keys/values in a jbkv cache."""

    name = "magi1"

    def __init__(
        self,
        variant: Magi1Variant,
        dit: VideoDiT,
        vae: ViTVAE,
        text_encoder: T5TextEncoder,
        special_tokens: SpecialTokens | None,
        settings: GenerationSettings,
    ) -> None:
        self.variant = variant
        self.dit = dit.eval()
        self.vae = vae.eval()
        self.text_encoder = text_encoder
        self.special_tokens = special_tokens
        self.gen = settings
        self._text_cache: OrderedDict[str, tuple[torch.Tensor, torch.Tensor]] = OrderedDict()
        sched = variant.schedule
        validate(sched)
        frames = settings.num_chunks * sched.chunk_width * sched.temporal_downsample_factor
        self.settings: dict[str, Any] = {
            "config": variant.name,
            "steps": sched.num_steps,
            "window": settings.window,
            "num_chunks": settings.num_chunks,
            "chunk_frames": sched.chunk_width * sched.temporal_downsample_factor,
            "frames": frames,
            "height": settings.height,
            "width": settings.width,
            "fps": sched.fps,
            "window_size": sched.window_size,
            "noise2clean_kvrange": list(sched.noise2clean_kvrange),
            "cfg_number": sched.cfg_number,
            "dtype": str(settings.dtype).replace("torch.", ""),
            "device": settings.device,
            "attention_backend": settings.attention_backend or "fused",
            "nearly_clean_refine": settings.nearly_clean_refine,
            "head_dim": variant.dit.kv_channels,
        }

    # -- phases -----------------------------------------------------------------------------
    def _place(self, module, on: bool):
        if self.gen.offload:
            module.to(self.gen.device if on else "cpu")

    def encode_prompt(self, prompt: str) -> tuple[torch.Tensor, torch.Tensor]:
        """T5 embedding of ``prompt`` (cached per prompt on the CPU)."""
        if prompt in self._text_cache:
            self._text_cache.move_to_end(prompt)
            return self._text_cache[prompt]
        self._place(self.text_encoder, True)
        emb, mask = self.text_encoder.encode(prompt)
        self._place(self.text_encoder, False)
        self._text_cache[prompt] = (emb.cpu(), mask.cpu())
        while len(self._text_cache) > 8:
            self._text_cache.popitem(last=False)
        return self._text_cache[prompt]

    def head_layout(self) -> HeadLayout:
        """What a pruner needs: layers, KV heads (GQA groups) and tokens per latent frame
        (tokens run ``(t h w)``, frames outermost)."""
        dit, sched = self.variant.dit, self.variant.schedule
        patch = sched.spatial_downsample_factor * dit.patch_size
        return HeadLayout(
            layers=len(self.dit.videodit_blocks.layers),
            kv_heads=dit.num_query_groups,
            frame_tokens=(self.gen.height // patch) * (self.gen.width // patch),
        )

    def sample_latents(
        self,
        prompt: str,
        seed: int,
        kv: KVSpec,
        progress: ProgressFn | None = None,
        observer: AttentionObserver | None = None,
        probe: Any = None,
    ):
        """The pipelined sampler over the caches. ``probe`` (a
        :class:`~jbkv_cli.prune.profile.FrameMassProbe`) wraps the caches; it is told the
        forward and its denoising step in its stage before each forward, and measures each
        chunk's cache read (the forward's in-flight chunks count as current)."""
        gen, variant = self.gen, self.variant
        sched = variant.schedule
        emb, mask = self.encode_prompt(prompt)
        text = build_text_condition(
            emb,
            mask,
            self.dit.y_embedder.null_caption_embedding,
            gen.num_chunks,
            self.special_tokens,
        ).to(gen.device)
        noise = torch.randn(
            variant_shape := gen.latent_shape(variant), generator=noise_generator(seed, prompt)
        )
        noise = noise.to(gen.device)
        books = LoopCaches.build(
            kv,
            gen.window,
            model=self.name,
            heads=self.head_layout(),
            chunks=gen.num_chunks,
            observer=observer,
            probe=probe,
            progress=progress,
        )
        plans = plan_forwards(gen.num_chunks, sched, max_cached=gen.window)
        sampler = Sampler(
            self.dit,
            sched,
            attend=cache_attend(gen.attention_backend),
            nearly_clean_refine=gen.nearly_clean_refine,
        )
        done = [0]

        def on_chunk(_c: int) -> None:
            done[0] += 1
            books.chunk_done(done[0])

        def after_plan(plan: ForwardPlan) -> None:
            if plan.refresh:  # the forward committed its refresh chunk in every layer
                books.committed()

        self._place(self.dit, True)
        try:
            result = sampler.sample(
                noise,
                plans,
                text,
                books.layers(),
                on_chunk=on_chunk,
                on_plan=lambda plan: books.at(plan.index, plan.denoise_idx),
                after_plan=after_plan,
            )
        finally:
            self._place(self.dit, False)
        assert result.latents.shape == variant_shape
        return replace(
            result, peak_cache_bytes=books.peak.total, peak_bytes_by_kind=books.peak.by_kind
        )

    def profile_heads(self, prompt: str, seed: int, probe: Any) -> None:
        """Generate ``prompt`` with the full-precision cache while ``probe`` measures every
        cache read (``jbkv profile-heads``)."""
        probe.begin_sample(prompt, seed)
        self.sample_latents(prompt, seed, FULL_PRECISION, probe=probe)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Clean latents ``[1, C, T, h, w]`` -> uint8 frames ``[4T, 8h, 8w, 3]``, chunk by chunk."""
        sched = self.variant.schedule
        cw = sched.chunk_width
        self._place(self.vae, True)
        try:
            dtype = next(self.vae.parameters()).dtype
            frames = []
            for c in range(latents.shape[2] // cw):
                z = (
                    latents[:, :, c * cw : (c + 1) * cw].to(self.gen.device, dtype)
                    / sched.scale_factor
                )
                video = tiled_decode(
                    self.vae, z, tile_px=self.gen.tile_px, tile_frames=sched.fps // 2
                )
                frames.append(to_uint8(video).cpu())
        finally:
            self._place(self.vae, False)
        return torch.cat(frames)

    @torch.no_grad()
    def generate(
        self,
        case: Case | str,
        seed: int,
        kv: KVSpec,
        *,
        progress: ProgressFn | None = None,
        observer: AttentionObserver | None = None,
    ) -> Video:
        prompt = text_case(case, self.name).prompt
        result = self.sample_latents(prompt, seed, kv, progress, observer)
        frames = self.decode(result.latents)
        info = {
            "config": self.variant.name,
            "steps": self.variant.schedule.num_steps,
            "dtype": self.settings["dtype"],
            "forwards": result.forwards,
            "kv": kv.label,
        }
        if kv.pruner is not None:
            info["kv_cache_bytes_by_head"] = result.peak_bytes_by_kind
        return Video(
            frames=frames,
            fps=float(self.variant.schedule.fps),
            kv_cache_bytes=int(result.peak_cache_bytes),
            info=info,
        )


def with_schedule_overrides(
    variant: Magi1Variant, steps: int | None, kv_range: tuple[int, ...] | None
) -> Magi1Variant:
    sched = variant.schedule
    if steps is not None:
        sched = replace(sched, num_steps=int(steps))
    if kv_range is not None:
        sched = replace(sched, noise2clean_kvrange=tuple(int(r) for r in kv_range))
    try:
        validate(sched)
    except ValueError as e:
        raise UsageError(f"MAGI-1 schedule: {e}") from e
    return replace(variant, schedule=sched)
