"""Self-Forcing family (Wan2.1-T2V-1.3B made causal and few-step) with jbkv's chunk KV cache.

The loop, as upstream's ``CausalInferencePipeline.inference`` (guandeh17/Self-Forcing @33593df,
``pipeline/causal_inference.py``), for ``num_chunks`` chunks of ``chunk_frames`` latent frames:

    for chunk c (frames [c·k, (c+1)·k), RoPE frames shifted by c·k):
        x ← noise
        for step i with warped timestep t_i (σ_i) — 1000, 937.5, 833.3, 625 by default:
            v  ← transformer(x, t_i | cache)          (reads the cache, commits nothing)
            x₀ ← x − σ_i v
            x  ← (1 − σ_{i+1}) x₀ + σ_{i+1} ε_i       (not after the last step)
        chunk c ← x₀
        clean-context pass: transformer(x₀, t = 0) commits every layer's post-RoPE K/V of
            chunk c to its cache (quantized once, per the KVSpec)

Upstream writes the noisy K/V of every step into the chunk's cache slots and overwrites them with
the clean pass; only the clean K/V are ever read by later chunks, which is what jbkv stores. No
classifier-free guidance (DMD-distilled). The cache keeps ``sink`` chunks (never evicted; jbkv's
cache keeps attention sinks in full precision) plus the last ``window`` chunks:

* Self-Forcing: no sink, a cache of 21 latent frames (``kv_cache_size`` 32760 tokens at
  480×832 = 21 × 1560) = the current chunk + 6 finished chunks → ``window = 6``;
* LongLive (``configs/longlive_inference.yaml``): ``local_attn_size = 12`` frames including the
  current chunk and ``sink_size = 3`` frames → ``sink = 1``, ``window = 2`` (see
  :func:`window_from_frames`). Positions stay absolute: a sink keeps the frames it was committed
  with, the current chunk sits at its own frame index (upstream's ``causal_rope_apply`` with
  ``start_frame = current_start // frame_seqlen``);
* Causal-Forcing / Causal-Forcing++ (thu-ml/Causal-Forcing @1fc7bbc1: ``inference.py``,
  ``pipeline/causal_inference.py``, ``configs/causal_forcing_dmd_{chunkwise,framewise,
  framewise_1step,framewise_2step}.yaml``, ``configs/default_config.yaml``): the same model
  code and loop (upstream's ``wan/modules/causal_model.py`` is Self-Forcing's), the same
  32760-token buffer (21 latent frames). Chunk-wise: Self-Forcing's shape, ``generator`` (the
  README runs it without ``--use_ema``). Frame-wise: ``num_frame_per_block: 1``, so chunks of
  one latent frame (1560 tokens at 480×832) read a cache of up to 20 finished frames →
  ``window = 20``; ``generator_ema``. Steps: ``denoising_step_list`` [1000, 750, 500, 250],
  [1000, 500] (2-step) or [1000] (1-step), warped; the 1- and 2-step models denoise the first
  chunk with ``denoising_step_list_first_chunk`` [1000, 750, 500, 250] (``block_index == 0``:
  the first *generated* chunk, also after an image) — ``first_chunk_steps`` here. Trained on
  ``num_training_frames: 21`` latent frames (README: "does not natively support videos longer
  than 81 frames"), so a longer video is a usage error unless ``beyond_horizon`` is set.
  Image-to-video (``--i2v``, frame-wise only: upstream asserts ``num_frame_per_block == 1``):
  the image, resized to ``height × width`` (torchvision ``Resize`` on a PIL image: bilinear) and
  scaled to [−1, 1], is VAE-encoded (the posterior mean, normalised) as latent frame 0; one
  forward at t = 0 commits it, as the finished chunks' clean-context pass, and frames 1 … F − 1
  are generated (upstream draws noise for ``num_output_frames − 1`` frames);
* CausVid (tianweiy/CausVid @ca21150: ``configs/wan_causal_dmd{,_warp_4step_cfg2}.yaml``,
  ``causvid/models/wan/causal_inference.py``, ``minimal_inference/autoregressive_inference.py``):
  the same loop with a full cache (a 32760-token buffer written at absolute positions: all 21
  frames, no window, no sink), shift 8, [1000, 757, 522] unwarped (``step_list``, ``warp``;
  :mod:`~jbkv_cli.models.wan.self_forcing.schedule`) or [1000, 750, 500, 250] warped, and
  ``model.pt["generator"]``; trained on 21 latent frames, as Causal-Forcing.

Noise: one CPU generator seeded from (seed, case name) draws, chunk after chunk (generated chunks
only), the chunk's initial noise then its re-noising ε; the same for every variant, and a longer
video starts with the same draws as a shorter one.

Precision (``-o precision``, :mod:`jbkv_cli.models.precision`): in 16 bits ``upstream`` (the
default) runs upstream's casting — every parameter in the model dtype, the transformer in
``CausalWanModel``'s order (:mod:`~jbkv_cli.models.wan.self_forcing.upstream`), the latents kept in
the model dtype (the noise rounded to it, x₀ computed in float64 and rounded, the re-noised
input computed in float32 and rounded, as upstream's ``add_noise`` ``type_as(noise)``);
``fp32-accum`` runs diffusers' transformer with its float32 modules and keeps the latents in
float32. Both decode the latents in float32.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
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
from jbkv_cli.models.precision import PRECISION, UPSTREAM, Precision
from jbkv_cli.models.seeding import noise_generator
from jbkv_cli.models.wan.attention import ChunkContext, cached_self_attention
from jbkv_cli.models.wan.decode import chunk_video, vae_scale
from jbkv_cli.models.wan.heads import WanHeads
from jbkv_cli.models.wan.options import (
    WAN_OPTIONS,
    check_frame_size,
    check_latent_frames,
    checked_options,
    chunks_for_frames,
    runtime_options,
)
from jbkv_cli.models.wan.rope import wan_phase_rope
from jbkv_cli.models.wan.self_forcing.components import (
    Components,
    WeightPaths,
    load_components,
    locate,
    planned_components,
    tiny_components,
    weight_files,
)
from jbkv_cli.models.wan.self_forcing.image import encode_image, read_image
from jbkv_cli.models.wan.self_forcing.schedule import FewStepSchedule, renoise, to_x0
from jbkv_cli.models.wan.self_forcing.upstream import (
    cast_all,
    float64_rope,
    upstream_forward,
    wan_rms_norm,
)
from jbkv_cli.models.wan.text import encode_umt5
from jbkv_cli.utils.errors import JbkvError, UsageError, shown
from jbkv_cli.utils.fields import Spec, parse_options

CLEAN_CONTEXT = "extra forward of each finished chunk at t=0 (context_noise 0), K/V committed once"


def window_from_frames(local_attn_size: int, sink_size: int, chunk_frames: int) -> tuple[int, int]:
    """``(window, sink)`` in chunks from upstream's ``local_attn_size`` / ``sink_size`` in frames.

    Upstream's buffer holds ``local_attn_size`` frames including the current chunk; the first
    ``sink_size`` frames are never rolled out. So a chunk reads ``sink_size / k`` sink chunks and
    ``(local_attn_size − sink_size) / k − 1`` recent finished chunks: LongLive's 12 and 3 with
    k = 3 give ``window = 2``, ``sink = 1``.
    """
    k = chunk_frames
    if local_attn_size % k or sink_size % k or local_attn_size - sink_size < k:
        raise UsageError(
            f"local_attn_size={local_attn_size} and sink_size={sink_size} frames are not whole "
            f"chunks of {k} frames with room for the current chunk"
        )
    return (local_attn_size - sink_size) // k - 1, sink_size // k


@dataclass(frozen=True)
class SelfForcingSettings:
    """Generation settings (JSON-able; recorded in the run manifest).

    ``steps``: N few-step timesteps ``round(1000·(1 − i/N))`` warped through the shifted table
    (N = 4: Self-Forcing's ``[1000, 750, 500, 250]``); ``first_chunk_steps``: the same for the
    first generated chunk (None: ``steps``; Causal-Forcing++'s 1-/2-step models: 4);
    ``shift``: the table's timestep shift. ``horizon``: the latent frames the generator was
    trained on (None: no limit), refused beyond unless ``beyond_horizon``.
    ``window``: finished chunks kept besides the sinks (None: all); ``sink``: first chunks kept
    for good. ``ema``: read ``generator_ema`` from a training checkpoint. ``lora_alpha``: LoRA
    scale numerator (None: the rank, i.e. scale 1). ``precision``: the 16-bit casting
    (:mod:`jbkv_cli.models.precision`).
    """

    config: str
    weights: str | None
    base: str | None
    generator: str | None
    lora: str | None
    ema: bool
    lora_alpha: float | None
    steps: int
    step_list: tuple[int, ...] | None
    warp: bool
    first_chunk_steps: int | None
    shift: float
    chunk_frames: int
    num_chunks: int
    window: int | None
    sink: int
    height: int
    width: int
    fps: int
    device: str
    dtype: str
    attention_backend: str | None
    horizon: int | None = None
    beyond_horizon: bool = False
    precision: str = UPSTREAM

    @property
    def latent_frames(self) -> int:
        return self.chunk_frames * self.num_chunks


_SELF_FORCING = dict(
    ema=True,  # upstream README: inference.py --use_ema
    lora_alpha=None,
    steps=4,
    step_list=None,  # explicit denoising_step_list (CausVid's 1000,757,522); else from steps
    warp=True,  # warp_denoising_step
    first_chunk_steps=None,
    shift=5.0,
    chunk_frames=3,
    num_chunks=7,  # 21 latent frames = 81 frames
    window=6,
    sink=0,
    height=480,
    width=832,
    fps=16,
)
_LONGLIVE_WINDOW, _LONGLIVE_SINK = window_from_frames(12, 3, 3)
# frame-wise Causal-Forcing: 21 chunks of 1 latent frame, the 21-frame buffer = current + 20
_CAUSAL_FRAMEWISE = _SELF_FORCING | dict(chunk_frames=1, num_chunks=21, window=20)
PRESETS: dict[str, dict[str, Any]] = {
    "self-forcing-dmd": _SELF_FORCING,
    "longlive": _SELF_FORCING
    | dict(
        ema=False,  # longlive_inference.yaml: use_ema false
        lora_alpha=256.0,  # adapter: rank 256, alpha 256
        num_chunks=40,  # num_output_frames 120 latent frames
        window=_LONGLIVE_WINDOW,
        sink=_LONGLIVE_SINK,
    ),
    "causal-forcing-chunkwise": _SELF_FORCING | dict(ema=False),  # README: no --use_ema
    "causal-forcing-framewise": _CAUSAL_FRAMEWISE,
    "causal-forcing-pp-2step": _CAUSAL_FRAMEWISE | dict(steps=2, first_chunk_steps=4),
    "causal-forcing-pp-1step": _CAUSAL_FRAMEWISE | dict(steps=1, first_chunk_steps=4),
    # CausVid: full cache (the 32760-token buffer holds all 21 frames), shift 8, "generator"
    "causvid": _SELF_FORCING
    | dict(ema=False, window=None, shift=8.0, steps=3, step_list="1000,757,522", warp=False),
    "causvid-warp-4step": _SELF_FORCING | dict(ema=False, window=None, shift=8.0),
    "tiny-random": _SELF_FORCING | dict(num_chunks=3, height=32, width=32),
}
# latent frames each generator was trained on (``num_training_frames: 21``), where a preset
# refuses more (Causal-Forcing's README: not natively longer than 81 frames)
HORIZONS = {name: 21 for name in PRESETS if name.startswith(("causal-forcing", "causvid"))}
_FRAMES = Spec("int", lo=0, hi=4 * 1024)
OPTIONS: dict[str, Spec] = {
    "config": Spec("str", choices=tuple(PRESETS)),
    **WAN_OPTIONS,
    "base": WAN_OPTIONS["weights"],
    "generator": WAN_OPTIONS["weights"],
    "lora": WAN_OPTIONS["weights"],
    "local_attn_size": _FRAMES,
    "sink_size": _FRAMES,
    "ema": Spec("bool"),
    "first_chunk_steps": WAN_OPTIONS["steps"],
    "step_list": Spec("str", pattern=r"\d{1,4}(,\d{1,4})*", what="timesteps like 1000,757,522"),
    "warp": Spec("bool"),
    "beyond_horizon": Spec("bool"),
    "lora_alpha": Spec("float", lo=0, lo_open=True, hi=1e6),
    "window": Spec("int", lo=0, hi=WAN_OPTIONS["num_chunks"].hi),
    "sink": Spec("int", lo=0, hi=WAN_OPTIONS["num_chunks"].hi),
    "precision": PRECISION,
}
assert set(_SELF_FORCING) <= set(OPTIONS)


class SelfForcing(WanHeads, VideoModelBase):
    """A loaded Self-Forcing-family model; ``generate`` runs the chunk loop above."""

    name = "self-forcing"

    def __init__(self, components: Components, settings: SelfForcingSettings) -> None:
        self.components = components
        self.config = settings
        s = settings
        self.precision = Precision(s.precision, dtype_from_name(s.dtype))
        self.schedule = FewStepSchedule.build(s.steps, s.shift, s.step_list, s.warp)
        first = s.first_chunk_steps
        self.first_schedule = (
            self.schedule if first is None else FewStepSchedule.build(first, s.shift, warp=s.warp)
        )
        self._texts: dict[str, torch.Tensor] = {}
        self.settings: dict[str, Any] = asdict(settings) | {
            "latent_frames": settings.latent_frames,
            "num_frames": self.num_frames,
            "timesteps": [round(t, 4) for t in self.schedule.timesteps],
            "clean_context": CLEAN_CONTEXT,
            "head_dim": components.transformer.config.attention_head_dim,
        }
        if first is not None:
            self.settings["first_chunk_timesteps"] = [
                round(t, 4) for t in self.first_schedule.timesteps
            ]

    @property
    def num_frames(self) -> int:
        return (self.config.latent_frames - 1) * vae_scale(self.components.vae)[0] + 1

    # ----------------------------------------------------------------------- pieces

    def encode_prompt(self, text: str) -> torch.Tensor:
        """UMT5 embedding ``[1, 512, 4096]`` (kept per prompt on the CPU). On a GPU the encoder
        lives on the CPU and visits the GPU only to encode."""
        if text not in self._texts:
            c, device = self.components, self.config.device
            encoder = c.text_encoder
            home = next(encoder.parameters()).device
            try:
                encoder.to(device)
                hidden = encode_umt5(
                    c.tokenizer, encoder, text, c.max_sequence_length, "cpu", c.transformer.dtype
                )
            finally:
                encoder.to(home)
            self._texts[text] = hidden
        return self._texts[text].to(self.config.device)

    def flow(self, x: torch.Tensor, t: float, text: torch.Tensor) -> torch.Tensor:
        """The generator's flow prediction ``v`` for chunk latents ``x`` ``[1, C, k, h, w]``
        (the model dtype under upstream's casting, else float32)."""
        if self.precision.upstream:
            return self.upstream_flow(x, [float(t)] * x.shape[2], text)
        transformer = self.components.transformer
        timestep = torch.full((x.shape[0],), float(t), dtype=torch.float32, device=x.device)
        out = transformer(
            hidden_states=x.to(transformer.dtype),
            timestep=timestep,
            encoder_hidden_states=text,
            return_dict=False,
        )[0]
        return out.float()

    def upstream_flow(self, x: torch.Tensor, times: list[float], text: torch.Tensor):
        """The flow of ``x`` with latent frame ``f`` at ``times[f]``, in upstream's casting
        (:func:`~jbkv_cli.models.wan.self_forcing.upstream.upstream_forward`)."""
        transformer = self.components.transformer
        t = torch.tensor([times], dtype=torch.float32)  # on the host: upstream_forward reads it
        return upstream_forward(transformer, x.to(transformer.dtype), t, text)

    def context(self, caches, rope) -> ChunkContext:
        """The cached processors' shared state, with upstream's q/k norm when it applies."""
        norm = wan_rms_norm if self.precision.upstream else None
        return ChunkContext(
            caches=caches, backend=self.config.attention_backend, key_rope=rope, qk_norm=norm
        )

    @property
    def chunk_shape(self) -> tuple[int, ...]:
        """``(1, C, k, h, w)``: one chunk's latents."""
        s = self.config
        spatial = vae_scale(self.components.vae)[1]
        channels = self.components.transformer.config.in_channels
        return (1, channels, s.chunk_frames, s.height // spatial, s.width // spatial)

    def draws(self, generator: torch.Generator, count: int) -> Iterator[torch.Tensor]:
        """The next ``count`` chunks' Gaussian latents, drawn in float32 on the CPU one chunk at
        a time, in order, and moved to the device in the dtype the sampler keeps
        (:attr:`Precision.latents`) in one copy (a copy per draw would wait for the device
        every denoising step)."""
        shape = self.chunk_shape
        noise = [torch.randn(shape, generator=generator, dtype=torch.float32) for _ in range(count)]
        if not noise:
            return iter(())
        return iter(torch.stack(noise).to(self.config.device, self.precision.latents).unbind(0))

    def encode_image(self, path: str, case: str) -> torch.Tensor:
        """The image at ``path`` as one normalised latent frame ``[1, C, 1, h, w]`` (float32)."""
        s = self.config
        return encode_image(self.components.vae, path, case, s.height, s.width, s.device)

    def resolve_kv(self, kv: KVSpec) -> KVSpec:
        """``kv`` as this model runs it; a pruner that keeps its own buffer and sink (Deep
        Forcing) refuses a config with sink chunks, and every pruner checks the chunk size
        (:class:`UsageError`)."""
        pruner = kv.pruner
        if pruner is not None:
            if pruner.owns_buffer and self.config.sink:
                raise UsageError(
                    f"{pruner.name} keeps its own sink and buffer: it cannot run on "
                    f"{self.config.config}, whose cache keeps {self.config.sink} sink chunk(s)"
                )
            try:
                pruner.check_chunks(self.config.chunk_frames)
            except ValueError as exc:
                raise UsageError(f"{pruner.name} on {self.name}: {exc}") from None
        return super().resolve_kv(kv)

    def cache_spec(self, kv: KVSpec) -> KVSpec:
        """``kv`` as this model runs it (:meth:`resolve_kv`), with its attention sinks
        (``sink`` chunks) unless it sets its own."""
        return self.resolve_kv(kv).with_sink(self.config.sink)

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
        image: torch.Tensor | None = None,
        name: str | None = None,
    ) -> tuple[torch.Tensor, dict[str, Any]]:
        """The chunk loop; returns the clean latents ``[1, C, F, h, w]`` and cache facts.

        ``probe`` (a :class:`~jbkv_cli.prune.profile.FrameMassProbe`) wraps the caches and is
        told the chunk and denoising step before each forward (``None`` for the clean pass).
        ``layout="pre-rope"``: keys cached before RoPE whatever the spec's method asks (None:
        as the spec; QVG's default here is pre-RoPE, as upstream's Self-Forcing integration).
        ``image``: the image latent ``[1, C, 1, h, w]`` (:meth:`encode_image`), latent frame 0
        (frame-wise models only); ``name``: what seeds the noise (the case's name; the
        prompt)."""
        s = self.config
        transformer = self.components.transformer
        text = self.encode_prompt(prompt)
        spec = self.cache_spec(kv)
        generator = noise_generator(seed, prompt if name is None else name)
        latents = torch.empty(self.chunk_shape, device="meta")
        rope = self.key_rope(spec, layout, latents)
        phase = None
        if spec.pruner is not None and spec.pruner.owns_buffer:  # Deep Forcing's sink
            phase = wan_phase_rope(transformer, latents)
        books = self.loop_caches(spec, rope, observer, probe, progress, phase=phase)
        context = self.context(books.layers(), rope)
        chunks = []
        first = 0
        if image is not None:
            if s.chunk_frames != 1 or tuple(image.shape) != self.chunk_shape:
                raise UsageError(
                    f"image-to-video needs the frame-wise model (chunk_frames=1) and an image "
                    f"latent of shape {self.chunk_shape}, got chunk_frames={s.chunk_frames} "
                    f"and {tuple(image.shape)}"
                )
            chunks.append(image.to(self.config.device, self.precision.latents))
            first = 1
        steps = [
            len(self.first_schedule if c == first else self.schedule)
            for c in range(first, s.num_chunks)
        ]
        noise = self.draws(generator, sum(steps))  # each chunk's, then each renoise's, in order
        with torch.no_grad(), cached_self_attention(transformer, context):
            if image is not None:  # the image latent's K/V, committed as a finished chunk's
                context.frame_offset = 0
                with books.commit_pass(0, context):
                    self.flow(chunks[0], 0.0, text)
                books.chunk_done(1)
            for c in range(first, s.num_chunks):
                context.frame_offset = c * s.chunk_frames
                schedule = self.first_schedule if c == first else self.schedule
                x = next(noise)
                for i, (t, sigma) in enumerate(
                    zip(schedule.timesteps, schedule.sigmas, strict=True)
                ):
                    books.at(c, i)
                    x0 = to_x0(x, self.flow(x, t, text), sigma)
                    if i + 1 < len(schedule):
                        x = renoise(x0, next(noise), schedule.sigmas[i + 1])
                chunks.append(x0)
                books.measure_views()
                if c + 1 < s.num_chunks:
                    with books.commit_pass(c, context):
                        self.flow(x0, 0.0, text)
                books.chunk_done(c + 1)
        info = books.facts() | {"sink_chunks": spec.sink_chunks}
        return torch.cat(chunks, dim=2), info

    def check_case(self, case: Case) -> None:
        """Refuse a case this model cannot generate (:func:`check_case`)."""
        check_case(case, self.config)

    def generate(
        self,
        case: Case | str,
        seed: int,
        kv: KVSpec,
        *,
        progress: ProgressFn | None = None,
        observer: AttentionObserver | None = None,
    ) -> Video:
        """Generate one video; the noise depends only on (case name, seed, settings). A case
        with an image (frame-wise models) starts from that image (image-to-video)."""
        case = Case.of(case)
        self.check_case(case)
        image = None if case.image is None else self.encode_image(case.image, case.name)
        latents, cache_info = self.generate_latents(
            case.prompt, seed, kv, progress=progress, observer=observer, image=image, name=case.name
        )
        info = {"timesteps": self.settings["timesteps"], "clean_context": CLEAN_CONTEXT}
        if case.image is not None:
            info["image"] = case.image
        label = self.resolve_kv(kv).label
        return chunk_video(self.components, self.config, latents.float(), label, info | cache_info)


def check_case(case: Case, settings: SelfForcingSettings) -> None:
    """Refuse a case this model cannot generate: a trajectory; an image for a chunk-wise model
    (upstream's I2V is frame-wise only); an image that is no readable picture."""
    if case.trajectory is not None:
        text_case(case, "self-forcing")  # one line naming the trajectory
    if case.image is None:
        return
    if settings.chunk_frames != 1:
        raise UsageError(
            f"case {shown(case.name)}: image-to-video needs a frame-wise config "
            f"(chunk_frames=1: causal-forcing-framewise, causal-forcing-pp-1step/2step), "
            f"not {settings.config} with chunk_frames={settings.chunk_frames}"
        )
    read_image(case.image, case.name)


# --------------------------------------------------------------------------- loading


def build_settings(
    options: dict[str, Any],
    presets: dict[str, dict[str, Any]] = PRESETS,
    model: str = "self-forcing",
) -> SelfForcingSettings:
    """Settings from checked ``options`` (``config`` set): the preset of ``presets`` (another
    adapter of this family passes its own, and its name), overridden, validated."""
    config = options["config"]
    preset = presets[config]
    values = preset | {k: v for k, v in options.items() if k in preset}
    for name in ("steps", "chunk_frames", "num_chunks", "sink", "fps"):
        values[name] = int(values[name])
        if values[name] < (0 if name == "sink" else 1):
            raise UsageError(f"{name} must be >= {0 if name == 'sink' else 1}, got {values[name]}")
    if ("local_attn_size" in options) != ("sink_size" in options):
        raise UsageError("give local_attn_size and sink_size together (frames, as upstream)")
    if "local_attn_size" in options:
        if "window" in options or "sink" in options:
            raise UsageError("give either local_attn_size/sink_size (frames) or window/sink")
        values["window"], values["sink"] = window_from_frames(
            int(options["local_attn_size"]), int(options["sink_size"]), values["chunk_frames"]
        )
    if "num_frames" in options:
        values["num_chunks"] = chunks_for_frames(
            int(options["num_frames"]), values["chunk_frames"], options.get("num_chunks")
        )
    if values["window"] is not None:
        values["window"] = int(values["window"])
        if values["window"] < 0:
            raise UsageError(
                f"window must be >= 0 chunks (or None: keep all), got {values['window']}"
            )
    if "steps" in options and "step_list" not in options:
        values["step_list"] = None  # -o steps=N replaces a preset's list
    if values["step_list"] is not None:
        values["step_list"] = parse_step_list(str(values["step_list"]))
        values["steps"] = len(values["step_list"])
    values["warp"] = bool(values["warp"])
    if values["first_chunk_steps"] is not None:
        values["first_chunk_steps"] = int(values["first_chunk_steps"])
    check_frame_size(values)
    check_latent_frames(model, config, values["chunk_frames"], values["num_chunks"])
    beyond = bool(options.get("beyond_horizon", False))
    check_horizon(config, values["chunk_frames"], values["num_chunks"], beyond)
    values["shift"] = float(values["shift"])
    values["ema"] = bool(values["ema"])
    precision = str(options.get("precision", UPSTREAM))
    if values["lora_alpha"] is not None:
        values["lora_alpha"] = float(values["lora_alpha"])
    device, dtype, backend = runtime_options(options)
    paths = {
        k: (None if options.get(k) is None else str(options[k]))
        for k in ("base", "generator", "lora")
    }
    return SelfForcingSettings(
        config=config,
        weights=None if options.get("weights") is None else str(options["weights"]),
        device=device,
        dtype=dtype,
        attention_backend=backend,
        **paths,
        **{k: values[k] for k in preset},
        horizon=HORIZONS.get(config),
        beyond_horizon=beyond,
        precision=precision,
    )


def parse_step_list(text: str) -> tuple[int, ...]:
    """``"1000,757,522"`` → (1000, 757, 522): descending timesteps in 1..1000."""
    steps = tuple(int(x) for x in text.split(","))
    if any(not 1 <= t <= 1000 for t in steps) or list(steps) != sorted(set(steps), reverse=True):
        raise UsageError(
            f"step_list={shown(text)} must be distinct descending timesteps in 1..1000 "
            "(upstream's denoising_step_list without its final 0)"
        )
    return steps


def check_horizon(config: str, chunk_frames: int, num_chunks: int, beyond: bool) -> None:
    """Refuse more latent frames than ``config``'s generator was trained on (:data:`HORIZONS`)
    unless ``beyond`` (``-o beyond_horizon=true``: the cache then rolls its window)."""
    horizon = HORIZONS.get(config)
    frames = chunk_frames * num_chunks
    if horizon is not None and frames > horizon and not beyond:
        raise UsageError(
            f"self-forcing: {config} was trained on {horizon} latent frames "
            f"({4 * (horizon - 1) + 1} frames); {num_chunks} chunks of {chunk_frames} are "
            f"{frames}: give num_chunks <= {horizon // chunk_frames}, or -o beyond_horizon=true "
            "to run past it"
        )


def _resolved(
    options: dict[str, Any],
) -> tuple[dict[str, Any], SelfForcingSettings, WeightPaths | None]:
    """Checked options, settings and the located weight files (None for tiny-random)."""
    options = parse_options(OPTIONS, options, "self-forcing", sep=": ", error=UsageError)
    options = checked_options(
        "self-forcing", options, frozenset(OPTIONS), PRESETS, "self-forcing-dmd"
    )
    given = sorted({"weights", "base", "generator", "lora"} & set(options))
    if options["config"] == "tiny-random":
        if given:
            raise UsageError(f"config=tiny-random builds random weights; do not pass {given[0]}")
        return options, build_settings(options), None
    s = build_settings(options)
    paths = locate(s.config, s.weights, s.base, s.generator, s.lora)
    lora = None if paths.lora is None else str(paths.lora)
    s = replace(s, base=str(paths.base), generator=str(paths.generator), lora=lora)
    return options, s, paths


def check_options(**options: Any) -> None:
    """Refuse what :func:`load_model` would refuse for these options (values, missing weight
    files) without building the model."""
    _resolved(options)


def input_paths(**options: Any) -> dict[str, Path]:
    """Role -> the base's parts and the checkpoint files these options read (none for
    tiny-random)."""
    _, _, paths = _resolved(options)
    return {} if paths is None else weight_files(paths)


def check_cases(cases: Iterable[Case], **options: Any) -> None:
    """Refuse, before anything is built, the first case these options cannot generate
    (:func:`check_case`: an image needs a frame-wise config and must be readable)."""
    _, settings, _ = _resolved(options)
    for case in cases:
        check_case(case, settings)


def load_model(**options: Any) -> SelfForcing:
    """Build a Self-Forcing-family model from local weights, or ``config="tiny-random"``.

    Options (None means "use the default"): ``config`` (``self-forcing-dmd`` | ``longlive`` |
    ``causal-forcing-chunkwise`` | ``causal-forcing-framewise`` | ``causal-forcing-pp-2step`` |
    ``causal-forcing-pp-1step`` | ``tiny-random``); weights: ``weights`` (root directory; else ``$JBKV_SELF_FORCING_DIR``, else
    the HF cache), ``base`` (diffusers-format Wan2.1-T2V-1.3B directory or cached repo id),
    ``generator`` / ``lora`` (checkpoint files, ``.pt`` or ``.safetensors``), ``ema`` (read
    ``generator_ema``), ``lora_alpha``; sampling: ``steps`` (4), ``first_chunk_steps`` (None;
    Causal-Forcing++: 4), ``beyond_horizon`` (false), ``shift`` (5.0),
    ``chunk_frames`` (3), ``num_chunks`` (7) or ``num_frames`` (81), ``window`` (6) and ``sink``
    (0) in chunks or ``local_attn_size`` + ``sink_size`` in frames (LongLive: 12, 3),
    ``height``/``width`` (480/832), ``fps`` (16); ``device``, ``dtype`` (bfloat16 on cuda,
    float32 on cpu), ``precision`` (``upstream`` | ``fp32-accum``, 16-bit casting),
    ``attention_backend`` (fused, flex, reference), ``init_seed`` (tiny-random weights, 0).
    """
    options, settings, paths = _resolved(options)
    dtype = dtype_from_name(settings.dtype)
    if paths is None:
        components = tiny_components(seed=int(options.get("init_seed", 0)), dtype=dtype)
    else:
        components = load_components(paths, dtype, settings.ema, settings.lora_alpha)
    rope_frames = components.transformer.config.rope_max_seq_len
    if settings.latent_frames > rope_frames:
        raise JbkvError(
            f"{settings.num_chunks} chunks of {settings.chunk_frames} latent frames exceed the "
            f"model's rotary table ({rope_frames} latent frames)"
        )
    return SelfForcing(place(components, settings), settings)


def planned_build(
    options: dict[str, Any],
    presets: dict[str, dict[str, Any]] = PRESETS,
    model: str = "self-forcing",
    spec: dict[str, Spec] | None = None,
    default: str = "self-forcing-dmd",
) -> tuple[SelfForcingSettings, Components]:
    """The settings (``cuda``, bfloat16 unless ``dtype`` says otherwise) and the components,
    placed, that ``jbkv plan`` runs for ``options`` (``model``'s ``presets`` and option
    ``spec``, ``default`` config): full-size parts on ``meta`` (:func:`planned_components`; no weight read), or the
    tiny random ones."""
    given = {k: v for k, v in options.items() if v is not None}
    given = {"dtype": "bfloat16", **given, "device": "cpu"}
    checked = parse_options(spec or OPTIONS, given, model, sep=": ", error=UsageError)
    checked = checked_options(model, checked, frozenset(spec or OPTIONS), presets, default)
    settings = replace(build_settings(checked, presets, model), device="cuda")
    dtype = dtype_from_name(settings.dtype)
    if settings.config == "tiny-random":
        components = tiny_components(seed=int(checked.get("init_seed", 0)), dtype=dtype)
    else:
        components = planned_components(dtype)
    rope_frames = components.transformer.config.rope_max_seq_len
    if settings.latent_frames > rope_frames:
        raise UsageError(
            f"{settings.num_chunks} chunks of {settings.chunk_frames} latent frames exceed the "
            f"model's rotary table ({rope_frames} latent frames)"
        )
    return settings, place(components, settings)


def plan_model(**options: Any) -> SelfForcing:
    """Self-Forcing as a GPU runs it, for ``jbkv plan`` (:func:`planned_build`)."""
    settings, components = planned_build(options)
    return SelfForcing(components, settings)


def place(components: Components, settings: SelfForcingSettings) -> Components:
    """``components`` on the settings' device, the transformer cast as its precision says:
    under upstream's rules every parameter in the model dtype and the RoPE table float64
    (:mod:`~jbkv_cli.models.wan.self_forcing.upstream`); else diffusers' float32 modules kept."""
    precision = Precision(settings.precision, dtype_from_name(settings.dtype))
    if precision.upstream:
        cast_all(components.transformer, precision.dtype)
        float64_rope(components.transformer.rope)
    components.transformer.to(settings.device)
    components.vae.to(settings.device)
    return components
