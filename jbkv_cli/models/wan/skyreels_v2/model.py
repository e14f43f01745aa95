"""SkyReels-V2 (diffusion forcing, via diffusers) as a chunk-wise AR model with jbkv's KV cache.

The loop, for a video of ``num_chunks`` chunks of ``chunk_frames`` latent frames:

    for chunk c (frames [c·k, (c+1)·k), RoPE frames shifted by c·k):
        x ← initial noise of chunk c
        for t in the scheduler's timesteps (UniPC, flow shift 8, 50 steps):
            v ← CFG(transformer(x, t | cache_cond), transformer(x, t | cache_uncond))
            x ← scheduler.step(v, t, x)
        clean-context pass: transformer(x, t = 0) once per CFG branch, committing every layer's
            post-RoPE K/V of chunk c to that branch's cache (quantized once, per the KVSpec)

Noisy forwards only read the cache; the committed K/V come from the clean pass. This is what the
reference diffusion-forcing pipeline computes when its blocks are denoised one after another
(``causal_block_size = k``, ``ar_step`` ≥ steps): it re-feeds every finished block as its clean
latents at timestep 0 under a block-causal mask, so a finished block's keys and values are
exactly those of a t = 0 forward of that block over the blocks before it. jbkv computes them once
instead of at every step. Cond and uncond keep separate caches because the reference re-feeds
finished blocks with each branch's own text (their K/V differ after the first layer). With a
16-bit cache the loop reproduces diffusers' ``SkyReelsV2DiffusionForcingPipeline`` (same noise,
``ar_step = steps``) to float32 rounding; the tests check it on the tiny configuration.

Departures from the reference, by design: the cache keeps the last ``window`` chunks (default 5 =
the reference's 97-frame base length), and frame positions are absolute (the reference restarts
RoPE at its window start; within the first ``window`` chunks the two agree exactly).
"""

from __future__ import annotations

import copy
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch

from jbkv_cli.attention.diagnostics import AttentionObserver
from jbkv_cli.kvcache import KVSpec
from jbkv_cli.models.base import ProgressFn, Video, text_case
from jbkv_cli.models.cases import Case
from jbkv_cli.models.contract import VideoModelBase
from jbkv_cli.models.dtypes import dtype_from_name
from jbkv_cli.models.seeding import noise_generator
from jbkv_cli.models.wan.decode import chunk_video, decode_wan, vae_scale
from jbkv_cli.models.wan.heads import WanHeads
from jbkv_cli.models.wan.options import (
    WAN_OPTIONS,
    check_frame_size,
    check_latent_frames,
    checked_options,
    chunks_for_frames,
    runtime_options,
)
from jbkv_cli.models.wan.skyreels_v2.attention import ChunkContext, chunk_attention
from jbkv_cli.models.wan.skyreels_v2.components import (
    Components,
    load_components,
    resolve_weights_dir,
    tiny_components,
)
from jbkv_cli.models.wan.text import encode_umt5
from jbkv_cli.utils.errors import JbkvError, UsageError
from jbkv_cli.utils.fields import Spec, parse_options

BRANCHES = ("cond", "uncond")  # the CFG branches, each with its own caches
CLEAN_CONTEXT = "extra forward of each finished chunk at t=0 (clean context), K/V committed once"


@dataclass(frozen=True)
class SkyReelsSettings:
    """Generation settings (JSON-able; recorded in the run manifest).

    ``chunk_frames`` is the reference's ``causal_block_size`` (latent frames per chunk; one latent
    frame = 4 video frames, the first latent frame = 1). ``window``: cached chunks kept (None:
    all). ``guidance`` > 1 enables classifier-free guidance with ``negative_prompt``.
    """

    config: str
    weights: str | None
    steps: int
    chunk_frames: int
    num_chunks: int
    window: int | None
    height: int
    width: int
    guidance: float
    shift: float
    negative_prompt: str
    fps: int
    device: str
    dtype: str
    attention_backend: str | None

    @property
    def latent_frames(self) -> int:
        return self.chunk_frames * self.num_chunks


# Paper / reference settings for the 1.3B-540P DF checkpoint; tiny-random for CPU tests.
PRESETS: dict[str, dict[str, Any]] = {
    "df-1.3b-540p": dict(
        steps=50,
        chunk_frames=5,
        num_chunks=5,
        window=5,
        height=544,
        width=960,
        guidance=6.0,
        shift=8.0,
        negative_prompt="",
        fps=24,
    ),
    "tiny-random": dict(
        steps=4,
        chunk_frames=2,
        num_chunks=3,
        window=5,
        height=32,
        width=32,
        guidance=6.0,
        shift=8.0,
        negative_prompt="",
        fps=24,
    ),
}
OPTIONS: dict[str, Spec] = {
    "config": Spec("str", choices=tuple(PRESETS)),
    **WAN_OPTIONS,
    "window": Spec("int", lo=1, hi=WAN_OPTIONS["num_chunks"].hi),
    "guidance": Spec("float", lo=0, hi=100),
    "negative_prompt": Spec("str"),
}
assert set(PRESETS["df-1.3b-540p"]) <= set(OPTIONS)


class SkyReelsV2(WanHeads, VideoModelBase):
    """A loaded SkyReels-V2 DF model; ``generate`` runs the chunk loop above."""

    name = "skyreels-v2"

    def __init__(self, components: Components, settings: SkyReelsSettings) -> None:
        self.components = components
        self.config = settings
        self.settings: dict[str, Any] = asdict(settings) | {
            "latent_frames": settings.latent_frames,
            "num_frames": self.num_frames,
            "clean_context": CLEAN_CONTEXT,
            "head_dim": components.transformer.config.attention_head_dim,
        }

    @property
    def vae_scale(self) -> tuple[int, int]:
        """(temporal, spatial) down-sampling of the VAE (4, 8 for Wan)."""
        return vae_scale(self.components.vae)

    @property
    def num_frames(self) -> int:
        return (self.config.latent_frames - 1) * self.vae_scale[0] + 1

    # ----------------------------------------------------------------------- pieces

    def encode_prompt(self, text: str) -> torch.Tensor:
        """UMT5 embedding ``[1, max_len, text_dim]``, zero past the prompt's tokens."""
        c = self.components
        return encode_umt5(
            c.tokenizer,
            c.text_encoder,
            text,
            c.max_sequence_length,
            self.config.device,
            c.transformer.dtype,
        )

    def predict(
        self,
        context: ChunkContext,
        caches: list[list[Any]],
        texts: list[torch.Tensor],
        x: torch.Tensor,
        t: int,
        commit: bool = False,
    ) -> torch.Tensor:
        """Flow prediction for chunk latents ``x`` ``[1, C, k, h, w]`` at timestep ``t``.

        One forward per CFG branch, each over its own caches; combined as
        ``v = v_u + w (v_c − v_u)``. ``commit``: store this forward's K/V (clean pass).
        """
        transformer = self.components.transformer
        timestep = torch.full((x.shape[0], x.shape[2]), int(t), dtype=torch.long, device=x.device)
        fps = None
        if transformer.config.inject_sample_info:
            fps = [0 if self.config.fps == 16 else 1] * x.shape[0]
        context.commit = commit
        preds = []
        for branch_caches, text in zip(caches, texts, strict=True):
            context.caches = branch_caches
            out = transformer(
                hidden_states=x.to(transformer.dtype),
                timestep=timestep,
                encoder_hidden_states=text,
                enable_diffusion_forcing=True,
                fps=fps,
                return_dict=False,
            )[0]
            preds.append(out.float())
        context.commit = False
        if len(preds) == 1:
            return preds[0]
        cond, uncond = preds
        return uncond + self.config.guidance * (cond - uncond)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents ``[1, C, F, h, w]`` -> uint8 frames ``[T, H, W, 3]`` on the CPU."""
        return decode_wan(self.components.vae, latents)

    def initial_noise(self, prompt: str, seed: int) -> torch.Tensor:
        """float32 noise ``[1, C, F, h, w]`` for the whole video, drawn on the CPU chunk by
        chunk from one generator, so a longer video starts with the same noise as a shorter one.
        """
        s = self.config
        spatial = self.vae_scale[1]
        channels = self.components.transformer.config.in_channels
        shape = (1, channels, s.chunk_frames, s.height // spatial, s.width // spatial)
        generator = noise_generator(seed, prompt)
        chunks = [
            torch.randn(shape, generator=generator, dtype=torch.float32)
            for _ in range(s.num_chunks)
        ]
        return torch.cat(chunks, dim=2).to(s.device)

    # ----------------------------------------------------------------------- the loop

    def generate_latents(
        self,
        prompt: str,
        seed: int,
        kv: KVSpec,
        *,
        progress: ProgressFn | None = None,
        observer: AttentionObserver | None = None,
        probe: Any = None,
        layout: str | None = None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """The chunk loop; returns the clean latents and facts about the cache.

        ``probe`` (a :class:`~jbkv_cli.prune.profile.FrameMassProbe`) wraps every CFG branch's
        caches and is told the chunk and denoising step before each forward (``None`` for the
        clean pass). ``layout="pre-rope"``: keys cached before RoPE whatever the spec's method
        asks (None: as the spec)."""
        s = self.config
        k = s.chunk_frames
        kv = self.resolve_kv(kv)
        texts = [self.encode_prompt(prompt)]
        if s.guidance > 1.0:
            texts.append(self.encode_prompt(s.negative_prompt))
        noise = self.initial_noise(prompt, seed)
        rope = self.key_rope(kv, layout, noise[:, :, :k])
        branches = BRANCHES[: len(texts)]
        books = self.loop_caches(kv, rope, observer, probe, progress, branches)
        caches = [books.layers(b) for b in branches]
        context = ChunkContext(backend=s.attention_backend, key_rope=rope)
        latents = torch.empty_like(noise)
        sigmas = self._scheduler().sigmas.to(noise.device)  # the same every chunk
        with torch.no_grad(), chunk_attention(self.components.transformer, context):
            for c in range(s.num_chunks):
                frames = slice(c * k, (c + 1) * k)
                context.frame_offset = c * k
                scheduler = self._scheduler()
                scheduler.sigmas = sigmas  # no per-step host-to-device copy of a sigma
                x = noise[:, :, frames].clone()
                for i, t in enumerate(scheduler.timesteps):
                    books.at(c, i)
                    v = self.predict(context, caches, texts, x, int(t))
                    # In place, as both reference pipelines update their latents: UniPC keeps the
                    # step-0 input as `last_sample`, so its first corrector sees the updated x.
                    x.copy_(scheduler.step(v, t, x, return_dict=False)[0])
                latents[:, :, frames] = x
                books.measure_views()
                if c + 1 < s.num_chunks:
                    with books.commit_pass(c):
                        self.predict(context, caches, texts, x, 0, commit=True)
                books.chunk_done(c + 1)
        return latents, books.facts() | {"cfg_branches": len(texts)}

    def _scheduler(self) -> Any:
        """A fresh copy of the UniPC scheduler set to the steps, timesteps and sigmas on the
        host, as diffusers keeps its sigmas: ``int(t)`` and the scheduler's own index lookup
        then read no device value. Each step copies its sigmas to the sample's device
        (``sigmas[i].to(device)``: a blocking copy per step off the CPU), so the loop hands it
        sigmas already there, copied once per video."""
        scheduler = copy.deepcopy(self.components.scheduler)
        scheduler.set_timesteps(self.config.steps, device="cpu")
        return scheduler

    def generate(
        self,
        case: Case | str,
        seed: int,
        kv: KVSpec,
        *,
        progress: ProgressFn | None = None,
        observer: AttentionObserver | None = None,
    ) -> Video:
        """Generate one video; the initial noise depends only on (prompt, seed, settings)."""
        prompt = text_case(case, self.name).prompt
        latents, cache_info = self.generate_latents(
            prompt, seed, kv, progress=progress, observer=observer
        )
        info = {"steps": self.config.steps, "clean_context": CLEAN_CONTEXT, **cache_info}
        label = self.resolve_kv(kv).label
        return chunk_video(self.components, self.config, latents, label, info)


# --------------------------------------------------------------------------- loading


def _settings(options: dict[str, Any]) -> SkyReelsSettings:
    config = options["config"]
    values = PRESETS[config] | {k: v for k, v in options.items() if k in PRESETS[config]}
    if "num_frames" in options:
        values["num_chunks"] = chunks_for_frames(
            int(options["num_frames"]), int(values["chunk_frames"]), options.get("num_chunks")
        )
    for name in ("steps", "chunk_frames", "num_chunks"):
        values[name] = int(values[name])
        if values[name] < 1:
            raise UsageError(f"{name} must be >= 1, got {values[name]}")
    if values["window"] is not None:
        values["window"] = int(values["window"])
        if values["window"] < 1:
            raise UsageError(
                f"window must be >= 1 chunk (or None: keep all), got {values['window']}"
            )
    check_frame_size(values)
    check_latent_frames("skyreels-v2", config, values["chunk_frames"], values["num_chunks"])
    values["guidance"], values["shift"] = float(values["guidance"]), float(values["shift"])
    device, dtype, backend = runtime_options(options)
    return SkyReelsSettings(
        config=config,
        weights=options.get("weights"),
        device=device,
        dtype=dtype,
        attention_backend=backend,
        **{k: values[k] for k in PRESETS[config]},
    )


def _resolved(options: dict[str, Any]) -> tuple[dict[str, Any], SkyReelsSettings]:
    """Checked options and settings, with the weights directory located (not read)."""
    options = parse_options(OPTIONS, options, "skyreels-v2", sep=": ", error=UsageError)
    options = checked_options("skyreels-v2", options, frozenset(OPTIONS), PRESETS, "df-1.3b-540p")
    if options["config"] == "tiny-random" and "weights" in options:
        raise UsageError("config=tiny-random builds random weights; do not pass weights")
    settings = _settings(options)
    if settings.config != "tiny-random":
        settings = replace(settings, weights=str(resolve_weights_dir(settings.weights)))
    return options, settings


def check_options(**options: Any) -> None:
    """Refuse what :func:`load_model` would refuse for these options (values, missing weights)
    without building the model."""
    _resolved(options)


def input_paths(**options: Any) -> dict[str, Path]:
    """Role -> the weights folder these options read (none for tiny-random)."""
    _, settings = _resolved(options)
    return {} if settings.config == "tiny-random" else {"weights": Path(settings.weights)}


def load_model(**options: Any) -> SkyReelsV2:
    """Build SkyReels-V2 DF-1.3B from local weights, or ``config="tiny-random"``.

    Options (None means "use the default"): ``weights`` (directory or cached repo id; else
    ``$JBKV_SKYREELS_DIR``, else the HF cache of Skywork/SkyReels-V2-DF-1.3B-540P-Diffusers),
    ``config`` (``df-1.3b-540p`` | ``tiny-random``), ``steps`` (50), ``num_chunks`` (5) or
    ``num_frames`` (97), ``chunk_frames`` (5), ``window`` (5), ``height``/``width`` (544/960),
    ``guidance`` (6.0), ``shift`` (8.0), ``negative_prompt`` (""), ``fps`` (24), ``device``
    (cuda if available), ``dtype`` (bfloat16 on cuda, float32 on cpu), ``attention_backend``
    (jbkv's: fused, flex, reference), ``init_seed`` (tiny-random weights, 0).
    """
    options, settings = _resolved(options)
    dtype = dtype_from_name(settings.dtype)
    if settings.config == "tiny-random":
        components = tiny_components(seed=int(options.get("init_seed", 0)), dtype=dtype)
    else:
        components = load_components(Path(settings.weights), dtype)
    return _assembled(components, settings)


def plan_model(**options: Any) -> SkyReelsV2:
    """SkyReels-V2 as a GPU runs it (``cuda``, bfloat16 unless ``dtype`` says otherwise) at the
    configuration the options name, for ``jbkv plan``: the DF-1.3B transformer (Wan2.1-1.3B's
    config), the Wan VAE and UMT5-XXL built on ``meta`` (:mod:`jbkv_cli.models.wan.planned`;
    no weight read), diffusers' UniPC scheduler at the published settings."""
    import diffusers

    from jbkv_cli.models.wan.planned import planned_parts
    from jbkv_cli.models.wan.self_forcing.components import MAX_SEQUENCE_LENGTH, WAN_T2V_1_3B

    given = {k: v for k, v in options.items() if v is not None}
    given = {"dtype": "bfloat16", **given, "device": "cpu"}
    checked = parse_options(OPTIONS, given, "skyreels-v2", sep=": ", error=UsageError)
    checked = checked_options("skyreels-v2", checked, frozenset(OPTIONS), PRESETS, "df-1.3b-540p")
    settings = replace(_settings(checked), device="cuda")
    dtype = dtype_from_name(settings.dtype)
    if settings.config == "tiny-random":
        components = tiny_components(seed=int(checked.get("init_seed", 0)), dtype=dtype)
    else:
        transformer, vae, text_encoder, tokenizer = planned_parts(
            diffusers.SkyReelsV2Transformer3DModel, WAN_T2V_1_3B, dtype, MAX_SEQUENCE_LENGTH
        )
        scheduler = diffusers.UniPCMultistepScheduler(
            prediction_type="flow_prediction", use_flow_sigmas=True, flow_shift=8.0
        )
        components = Components(
            transformer, vae, text_encoder, tokenizer, scheduler, "planned", MAX_SEQUENCE_LENGTH
        )
    return _assembled(components, settings)


def _assembled(components: Components, settings: SkyReelsSettings) -> SkyReelsV2:
    """The model of ``components`` placed on the settings' device (what both builds share)."""
    rope_frames = components.transformer.config.rope_max_seq_len
    if settings.latent_frames > rope_frames:
        raise JbkvError(
            f"{settings.num_chunks} chunks of {settings.chunk_frames} latent frames exceed the "
            f"model's rotary table ({rope_frames} latent frames)"
        )
    components.transformer.to(settings.device)
    components.text_encoder.to(settings.device)
    components.vae.to(settings.device)
    scheduler = components.scheduler
    components.scheduler = type(scheduler).from_config(scheduler.config, flow_shift=settings.shift)
    return SkyReelsV2(components, settings)
