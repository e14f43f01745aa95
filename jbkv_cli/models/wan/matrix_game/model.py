"""Matrix-Game-2.0's chunk loop with jbkv's caches: the main self-attention cache and the
ActionModule's mouse and keyboard caches, all stored through one :class:`KVSpec`.

The loop, as upstream's ``CausalInferencePipeline.inference`` (SkyworkAI/Matrix-Game
@5a4fa8b2:Matrix-Game-2/pipeline/causal_inference.py) for ``num_chunks`` chunks of 3 latent
frames (chunk ``c`` = frames ``[3c, 3c + 3)``, RoPE at those absolute frames):

    x ← noise
    for t_i in warp(preset.steps) (shift 5; σ_i; universal and GTA [1000, 666, 333],
                                   TempleRun [1000, 750, 500, 250]):
        v ← DiT(x, t_i, cond_concat[chunk], CLIP, actions | caches)   (reads, commits nothing)
        x₀ ← x − σ_i v;  x ← (1 − σ_{i+1}) x₀ + σ_{i+1} ε          (not after the last step)
    chunk c ← x₀
    clean pass: DiT(x₀, t = 0 (context_noise), …) commits, in every block, the chunk's
        post-RoPE self-attention K/V (``[B, 12, 3·880, 128]``), and in blocks 0–14 the mouse
        K/V (``[B·880, 16, 3, 64]``, one token per position and frame) and keyboard K/V
        (``[B, 16, 3, 64]``)

Every cache keeps ``local_attn_size / 3 − 1`` finished chunks (6 frames: 1), no sink, as
upstream's rolling buffers of ``local_attn_size`` frames read up to ``local_attn_size`` frames
including the current chunk. When ``local_attn_size`` is not whole chunks (GTA: 4 frames), the
clean pass commits each latent frame as its own piece and the caches keep
``local_attn_size − 3`` of them (GTA: the previous chunk's last frame) — the same window, at
frame granularity (methods then see one frame per commit; pruning is refused). Upstream writes each step's noisy K/V into the buffer and
overwrites them with the clean pass; only clean K/V are read later — what jbkv stores. The last
chunk's clean pass (which upstream runs; nothing reads it) is skipped. Conditioning
(upstream ``inference.py``): the image, centre-cropped to 352:640 and resized, is VAE-encoded
followed by ``4(F − 1)`` black frames (``img_cond``, F latent frames); ``cond_concat`` =
``[mask (4 ch, 1 on latent 0), img_cond (16 ch)]``; ``visual_context`` = CLIP of the image.

Choices where upstream is silent or differs in form: noise is drawn chunk by chunk from one
CPU generator seeded by (seed, case name) (upstream draws all of it up front); the image is
resized with PIL bilinear (upstream: torchvision ``Resize(antialias=True)``). ``quantize_actions
= False`` keeps the mouse and keyboard caches in full precision (the main cache still follows
the spec). A pruner in the spec prunes the main cache only. The diagnostics observer sees the
main caches.

Precision (``-o precision``, :mod:`jbkv_cli.models.precision`): the DiT casts as upstream's in
both (its port keeps ``causal_model.py``'s order); in 16 bits ``upstream`` (the default) keeps
the sampler's latents in the model dtype, as upstream (``inference.py`` draws bf16 noise; x₀ in
float64 rounded to bf16, ``add_noise`` in float32 rounded to bf16), ``fp32-accum`` in float32.
The latents are decoded in float32 either way.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import asdict, dataclass, replace
from typing import Any

import torch
from torch import nn

from jbkv_cli.attention.diagnostics import AttentionObserver
from jbkv_cli.kvcache import FULL_PRECISION, ChunkKVCache, KVSpec, layer_caches
from jbkv_cli.kvcache.layers import HeadLayout
from jbkv_cli.models.base import ProgressFn, Video
from jbkv_cli.models.cases import Case
from jbkv_cli.models.contract import VideoModelBase
from jbkv_cli.models.dtypes import dtype_from_name
from jbkv_cli.models.loop import LoopCaches
from jbkv_cli.models.precision import UPSTREAM, Precision
from jbkv_cli.models.seeding import noise_generator
from jbkv_cli.models.wan.decode import decode_wan
from jbkv_cli.models.wan.matrix_game.actions import Actions, read_actions
from jbkv_cli.models.wan.matrix_game.attention import CachedAttention
from jbkv_cli.models.wan.matrix_game.config import Preset
from jbkv_cli.models.wan.matrix_game.dit import MatrixGameDiT
from jbkv_cli.models.wan.self_forcing.image import read_image
from jbkv_cli.models.wan.self_forcing.schedule import FewStepSchedule, renoise, to_x0
from jbkv_cli.utils.errors import UsageError, shown
from jbkv_cli.utils.host_reads import device_copy

CLEAN_CONTEXT = "extra forward of each finished chunk at t=0 (context_noise 0), K/V committed once"


@dataclass(frozen=True)
class Settings:
    """Generation settings (JSON-able; recorded in the run manifest)."""

    config: str
    num_chunks: int
    chunk_frames: int
    window: int  # committed pieces each cache keeps besides the current chunk
    height: int
    width: int
    fps: int
    device: str
    dtype: str
    quantize_actions: bool = True
    attention_backend: str | None = None
    commit_frames: int = 3  # latent frames per committed piece: the chunk, or 1 (GTA)
    precision: str = UPSTREAM  # 16-bit casting of the sampler (jbkv_cli.models.precision)

    @property
    def latent_frames(self) -> int:
        return self.num_chunks * self.chunk_frames

    @property
    def num_frames(self) -> int:
        return 4 * (self.latent_frames - 1) + 1


@dataclass
class Conditions:
    """One case's inputs as the DiT reads them."""

    cond: torch.Tensor  # [1, 20, F, h, w]: mask + image latent
    clip: torch.Tensor  # [1, tokens, clip_dim]
    actions: Actions


class TinyImageEncoder(nn.Module):
    """tiny-random's stand-in for CLIP ViT-H/14 (``clip.encode_video``): the image at 16 × 16
    cut into four 8 × 8 patches, a linear map of each and of their mean (a class token) to
    ``clip_dim`` — random weights, ``tokens`` = 5. Not CLIP; shapes the cross-attention only."""

    def __init__(self, clip_dim: int) -> None:
        super().__init__()
        self.proj = nn.Linear(3 * 8 * 8, clip_dim)

    def forward(self, pixels: torch.Tensor) -> torch.Tensor:
        x = nn.functional.interpolate(pixels, size=(16, 16), mode="bilinear", antialias=True)
        patches = x.unfold(2, 8, 8).unfold(3, 8, 8)  # [1, 3, 2, 2, 8, 8]
        patches = patches.permute(0, 2, 3, 1, 4, 5).reshape(1, 4, -1)
        tokens = torch.cat([patches.mean(1, keepdim=True), patches], dim=1)
        return self.proj(tokens)


def crop_resize(path: str, case: str, height: int, width: int) -> torch.Tensor:
    """The image as ``[1, 3, H, W]`` in [−1, 1]: centre crop to ``H:W`` (upstream
    ``_resizecrop``), bilinear resize."""
    img = read_image(path, case)
    w, h = img.size
    if h / w > height / width:
        nw, nh = w, int(w * height / width)
    else:
        nw, nh = int(h * width / height), h
    left, top = (w - nw) / 2, (h - nh) / 2
    img = img.crop((left, top, left + nw, top + nh)).resize((width, height), resample=2)
    pix = torch.frombuffer(bytearray(img.tobytes()), dtype=torch.uint8).view(height, width, 3)
    return (pix.permute(2, 0, 1).float() / 127.5 - 1.0)[None]


class MatrixGame2(VideoModelBase):
    """A loaded Matrix-Game-2.0; ``generate`` runs the chunk loop (module docstring)."""

    name = "matrix-game-2"
    profiles_cases = True  # profile_heads takes a case (profile-heads --cases)

    def __init__(
        self, dit: MatrixGameDiT, vae: Any, image_encoder: nn.Module, preset: Preset, s: Settings
    ):
        self.dit, self.vae, self.image_encoder = dit, vae, image_encoder
        self.preset, self.config = preset, s
        self.source = "tiny-random" if s.config == "tiny-random" else s.config
        self.precision = Precision(s.precision, dtype_from_name(s.dtype))
        self.schedule = FewStepSchedule.build(
            len(preset.steps), preset.shift, preset.steps, warp=preset.warp
        )
        self.settings: dict[str, Any] = asdict(s) | {
            "latent_frames": s.latent_frames,
            "num_frames": s.num_frames,
            "local_attn_size": preset.dit.local_attn_size,
            "timesteps": [round(t, 4) for t in self.schedule.timesteps],
            "clean_context": CLEAN_CONTEXT,
            "action_blocks": list(preset.dit.action.blocks),
            "tokens_per_chunk": self.frame_tokens * s.commit_frames,
            "head_dim": preset.dit.head_dim,
        }

    @property
    def frame_tokens(self) -> int:
        s, p = self.config, self.preset.dit.patch
        return (s.height // 8 // p[1]) * (s.width // 8 // p[2])

    def head_layout(self) -> HeadLayout:
        d = self.preset.dit
        return HeadLayout(layers=d.layers, kv_heads=d.heads, frame_tokens=self.frame_tokens)

    def resolve_kv(self, kv: KVSpec) -> KVSpec:
        bound = [m for m in (kv.key, kv.value) if m is not None and m.at_layer(0) != m]
        if self.config.quantize_actions and bound:
            raise UsageError(
                f"{bound[0].label}: its tables are per video layer (a calibration file); the "
                "action caches cannot take them (set -o quantize_actions=false)"
            )
        tokens = self.frame_tokens * self.config.commit_frames
        return kv.for_model(f"{self.name}:{self.config.config}", tokens)

    # ------------------------------------------------------------------ inputs

    def conditions(self, case: Case) -> Conditions:
        """Image latent, mask, CLIP tokens and actions of ``case`` (checked by
        :func:`check_case` first)."""
        s, a = self.config, self.preset.dit.action
        check_case(case, s, self.preset)
        actions = read_actions(
            str(case.trajectory), case.name, s.num_frames, a.keyboard_dim, a.mouse_dim
        )
        pixels = crop_resize(str(case.image), case.name, s.height, s.width).to(s.device)
        with torch.no_grad():
            video = torch.cat(
                [pixels[:, :, None], pixels.new_zeros(1, 3, s.num_frames - 1, s.height, s.width)],
                dim=2,
            )
            mu = self.vae.encode(video.to(self.vae.dtype)).latent_dist.mode().float()
            cfg = self.vae.config
            mean = torch.tensor(cfg.latents_mean).view(1, -1, 1, 1, 1).to(mu)
            std = torch.tensor(cfg.latents_std).view(1, -1, 1, 1, 1).to(mu)
            latent = (mu - mean) / std
            mask = torch.zeros_like(latent[:, :4])
            mask[:, :, 0] = 1
            clip = self.image_encoder(pixels.to(next(self.image_encoder.parameters())))
        return Conditions(torch.cat([mask, latent], dim=1), clip.float(), actions)

    # ------------------------------------------------------------------ the loop

    def caches(
        self,
        kv: KVSpec,
        observer: AttentionObserver | None = None,
        probe: Any = None,
        progress: ProgressFn | None = None,
    ) -> LoopCaches:
        """The loop's caches for spec ``kv``, by part: ``main`` (one per block, probed) and the
        ActionModule's ``mouse`` and ``keyboard`` (one per action block each)."""
        s, d = self.config, self.preset.dit
        spec = self.resolve_kv(kv)
        if spec.pruner is not None and s.commit_frames != s.chunk_frames:
            raise UsageError(
                f"{spec.label}: pruning needs whole-chunk commits; {s.config}'s local attention "
                f"of {self.preset.dit.local_attn_size} frames caches frame by frame"
            )
        main = layer_caches(
            spec, s.window, model=self.name, observer=observer, **self.head_layout()
        )
        action_spec = replace(spec, pruner=None) if s.quantize_actions else FULL_PRECISION
        blocks = d.action.blocks
        per_block = [action_spec.at_layer(b) for b in blocks]  # the block's widths
        mouse = [ChunkKVCache(a, s.window) for a in per_block] if d.action.mouse else []
        keyboard = [ChunkKVCache(a, s.window) for a in per_block]
        parts = {"main": main, "mouse": mouse, "keyboard": keyboard}
        return LoopCaches(parts, s.num_chunks, probe=probe, progress=progress, probed=["main"])

    def flow(self, x, t: float, f0: int, cond: Conditions, attn) -> torch.Tensor:
        """The DiT's flow prediction for chunk latents ``x`` at latent frame ``f0`` (in the
        dtype the sampler keeps, :attr:`Precision.latents`)."""
        k = x.shape[2]
        a = cond.actions
        dt = self.dit.patch_embedding.weight.dtype
        dev = self.config.device
        timestep = torch.full((1, k), float(t), device=dev)
        # the video's actions, copied to the device once (not every step: host_reads)
        mouse = None if a.mouse is None else device_copy(a.mouse, dev, dt)
        out = self.dit(
            x.to(dt),
            timestep,
            f0,
            cond.cond[:, :, f0 : f0 + k].to(dt),
            cond.clip.to(dt),
            mouse,
            device_copy(a.keyboard, dev, dt),
            attn,
        )
        return out.to(self.precision.latents)

    def draws(self, generator: torch.Generator, count: int) -> Iterator[torch.Tensor]:
        """The next ``count`` chunks' noise, drawn in float32 on the CPU one chunk at a time, in
        order, in the sampler's dtype, moved to the device in one copy (a copy per draw would
        wait for the device every denoising step)."""
        s = self.config
        shape = (1, 16, s.chunk_frames, s.height // 8, s.width // 8)
        noise = [torch.randn(shape, generator=generator) for _ in range(count)]
        if not noise:
            return iter(())
        return iter(torch.stack(noise).to(s.device, self.precision.latents).unbind(0))

    def generate_latents(
        self,
        cond: Conditions,
        seed: int,
        name: str,
        kv: KVSpec,
        *,
        progress: ProgressFn | None = None,
        observer: AttentionObserver | None = None,
        probe: Any = None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """The chunk loop; the clean latents ``[1, 16, F, h, w]`` and the caches' bytes.
        ``probe`` (a :class:`~jbkv_cli.prune.profile.FrameMassProbe`) wraps the main caches and
        is told the chunk and step before each forward (``None`` for the clean pass)."""
        s = self.config
        books = self.caches(kv, observer, probe, progress)
        blocks = self.preset.dit.action.blocks  # no mouse (TempleRun): no mouse caches
        mouse, keyboard = (
            dict(zip(blocks, books.parts[p], strict=False)) for p in ("mouse", "keyboard")
        )
        attn = CachedAttention(books.layers(), mouse, keyboard, s.attention_backend)
        if s.commit_frames != s.chunk_frames:  # a window that is not whole chunks: by frame
            attn.splits = (self.frame_tokens * s.commit_frames, s.commit_frames)
        generator = noise_generator(seed, name)
        sched = self.schedule
        chunks: list[torch.Tensor] = []
        noise = self.draws(generator, s.num_chunks * len(sched))  # each chunk's, each renoise's
        with torch.no_grad():
            for c in range(s.num_chunks):
                f0 = c * s.chunk_frames
                x = next(noise)
                for i, (t, sigma) in enumerate(zip(sched.timesteps, sched.sigmas, strict=True)):
                    books.at(c, i)
                    x0 = to_x0(x, self.flow(x, t, f0, cond, attn), sigma)
                    if i + 1 < len(sched):
                        x = renoise(x0, next(noise), sched.sigmas[i + 1])
                chunks.append(x0)
                if c + 1 < s.num_chunks:
                    with books.commit_pass(c, attn):
                        self.flow(x0, 0.0, f0, cond, attn)
                books.chunk_done(c + 1)
        info = books.facts(split="kv_cache_bytes_by_cache")
        return torch.cat(chunks, dim=2), info | {"quantize_actions": s.quantize_actions}

    def profile_heads(self, case: Case | str, seed: int, probe: Any) -> None:
        """Generate ``case`` (an image and actions: ``jbkv profile-heads --cases FILE``) with
        full-precision caches while ``probe`` measures every main-cache read."""
        case = Case.of(case)
        cond = self.conditions(case)
        probe.begin_sample(case.name, seed)
        self.generate_latents(cond, seed, case.name, FULL_PRECISION, probe=probe)

    def generate(
        self,
        case: Case | str,
        seed: int,
        kv: KVSpec,
        *,
        progress: ProgressFn | None = None,
        observer: AttentionObserver | None = None,
    ) -> Video:
        """One video of ``case`` (an image and an actions file)."""
        case = Case.of(case)
        cond = self.conditions(case)
        latents, info = self.generate_latents(
            cond, seed, case.name, kv, progress=progress, observer=observer
        )
        with torch.no_grad():
            frames = decode_wan(self.vae, latents.float())
        s = self.config
        record = {
            "dtype": s.dtype,
            "device": s.device,
            "chunk_frames": s.chunk_frames,
            "num_chunks": s.num_chunks,
            "window": s.window,
            "kv": self.resolve_kv(kv).label,
            "weights": self.source,
            "timesteps": self.settings["timesteps"],
            "clean_context": CLEAN_CONTEXT,
            "image": case.image,
            "actions": case.trajectory,
            **info,
        }
        return Video(frames=frames, fps=float(s.fps), kv_cache_bytes=peak_of(info), info=record)


def peak_of(info: dict[str, Any]) -> int:
    return int(info["kv_cache_bytes"])


def check_case(case: Case, s: Settings, preset: Preset) -> None:
    """A case needs a readable image and an actions file of ``s.num_frames`` frames."""
    if case.image is None:
        raise UsageError(
            f"case {shown(case.name)}: matrix-game-2 needs an image (a case file with an image "
            "column: --cases FILE)"
        )
    if case.trajectory is None:
        raise UsageError(
            f"case {shown(case.name)}: matrix-game-2 needs an actions file (a .json in the case "
            "file's pose column; format in docs/models.md)"
        )
    read_image(case.image, case.name)
    a = preset.dit.action
    read_actions(str(case.trajectory), case.name, s.num_frames, a.keyboard_dim, a.mouse_dim)
