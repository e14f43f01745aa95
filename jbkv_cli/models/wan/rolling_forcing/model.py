"""Rolling Forcing (Wan2.1-T2V-1.3B, causal, rolling-window denoising) with jbkv's KV cache.

TencentARC/RollingForcing @a1477d09 (``pipeline/rolling_forcing_inference.py``,
``wan/modules/causal_model.py``, ``configs/rolling_forcing_dmd.yaml``,
``configs/default_config.yaml``, ``inference.py``, ``README.md``). The same Wan2.1 causal
generator as Self-Forcing (the ``self-forcing`` adapter's parts, checkpoint reader and cached
processor are reused), a different loop — hence a sibling adapter, not a preset: windows of N
blocks denoised jointly (one forward over every block of the window, each block at its own
timestep), per-token timesteps, and three kinds of cache read (:mod:`.plan`):

    for window w (blocks s … e, block b at step w − b; :func:`~.plan.windows`):
        block w enters as pure noise (w < B)
        x₀ ← one forward over the window's blocks, timesteps t_{w−b} per block, reading the
             sink (re-placed at frame s − W − 3) + the W newest clean blocks (W = 21 − Q − 3
             frames at most) + the window itself, unmasked
        each block not at its last step: x_b ← (1 − σ_{w−b+1}) x₀_b + σ_{w−b+1} ε
        block s at its last step: its x₀ is final; a clean pass at t = 0 commits its K/V
             (reading blocks max(0, s − 6) … s; the sink un-rotated, the others post-RoPE)

Defaults (upstream's): ``denoising_step_list`` [1000, 800, 600, 400, 200] warped through the
shift-5 table (the window: 5 blocks = 15 latent frames), blocks of 3 latent frames, a buffer of
24 frames (the sink + 7 blocks: ``window = 7``, ``sink = 1``), at most 21 frames attended,
480×832, ``generator_ema`` of ``checkpoints/rolling_forcing_dmd.pt`` (README:
``--use_ema``; ``_fsdp_wrapped_module.`` stripped), no classifier-free guidance at inference
(``guidance_scale: 3.0`` is the DMD teacher's, in training). ``num_chunks`` 7 (``inference.py``'s
default ``--num_output_frames 21`` latent frames = 81 frames; the README runs 126 = 42 blocks;
the model is built for minutes). No trained-horizon limit; positions are absolute
(``causal_rope_apply`` at ``current_start_frame``), so the length limit is the RoPE table
(1024 latent frames; tiny-random: 32), refused as a usage error before anything is built.

``causal-forcing-longvideo``: Causal-Forcing's long-video generator (thu-ml/Causal-Forcing
@1fc7bbc1 ``long_video/``: this code unchanged, ``denoising_step_list`` [1000, 750, 500, 250], so
a window of 4 blocks; ``chunkwise/longvideo.pt`` of ``zhuhz22/Causal-Forcing``, ``--use_ema``).

**The cache.** Upstream keeps the sink before RoPE and the other blocks rotated. jbkv's caches
do the same (a :class:`~jbkv_cli.kvcache.rope.KeyRope` with ``sinks_only``): regular blocks are
rotated at commit and then stored by the variant's method, the sink (kept 16-bit as every jbkv
sink) is rotated on each read at the frame the read asks for. A method that caches keys before
RoPE (QVG; or ``layout="pre-rope"``) keeps every block before RoPE; its correction then carries
the rotation (:mod:`jbkv_cli.attention.rope`).

**Differences from upstream.** Noise: one CPU generator seeded from (seed, case name) draws, per
window, the entering block's noise, then the re-noise ε of each block of the window in block
order (upstream draws a window-sized ``randn_like`` per block and keeps its slice). Blocks are
committed once, after their last step, and the last block not at all (upstream rewrites
provisional copies that are never read, module :mod:`.plan`). For fewer blocks than steps
jbkv keeps the staggered rule, every block through every step; upstream's window branches
assume at least as many blocks as steps, and with fewer they re-feed the newest block its
initial noise, repeat timesteps and skip steps (``docs/models.md``). No image-to-video:
upstream's ``--i2v`` does not run either (an assertion with the default
``independent_first_frame: false``, ``current_start_frame`` read before it is set with
``true``).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from jbkv_cli.attention.diagnostics import AttentionObserver
from jbkv_cli.kvcache import KVSpec
from jbkv_cli.kvcache.rope import KeyRope
from jbkv_cli.models.base import ProgressFn, text_case
from jbkv_cli.models.cases import Case
from jbkv_cli.models.dtypes import dtype_from_name
from jbkv_cli.models.loop import LoopCaches
from jbkv_cli.models.seeding import noise_generator
from jbkv_cli.models.wan.attention import ChunkContext, cached_self_attention
from jbkv_cli.models.wan.options import checked_options
from jbkv_cli.models.wan.rolling_forcing import plan
from jbkv_cli.models.wan.rope import wan_key_rope
from jbkv_cli.models.wan.self_forcing import model as sf
from jbkv_cli.models.wan.self_forcing.components import (
    load_components,
    locate,
    tiny_components,
    weight_files,
)
from jbkv_cli.models.wan.self_forcing.schedule import renoise, to_x0
from jbkv_cli.models.wan.self_forcing.upstream import time_sinusoid
from jbkv_cli.utils.errors import UsageError, shown
from jbkv_cli.utils.fields import parse_options
from jbkv_cli.utils.host_reads import device_values, prefetch_values

NAME = "rolling-forcing"
CLEAN_CONTEXT = (
    "extra forward of each window's cleanest block at t=0 (context_noise 0), its K/V committed "
    "once; the sink before RoPE, re-placed on every window read"
)

_ROLLING = dict(
    ema=True,  # README: inference.py --use_ema
    lora_alpha=None,
    steps=5,  # denoising_step_list [1000, 800, 600, 400, 200]
    step_list=None,
    warp=True,  # warp_denoising_step: true
    first_chunk_steps=None,
    shift=5.0,  # timestep_shift
    chunk_frames=plan.BLOCK_FRAMES,
    num_chunks=7,  # inference.py: --num_output_frames 21 latent frames (81 frames)
    window=plan.cache_window(),  # the 24-frame buffer: sink + 7 blocks
    sink=plan.SINK_BLOCKS,
    height=480,
    width=832,
    fps=16,
)
PRESETS: dict[str, dict[str, Any]] = {
    NAME: _ROLLING,
    # thu-ml/Causal-Forcing @1fc7bbc1 long_video/: Rolling Forcing's code unchanged (pipeline,
    # causal_model.py, inference.py are identical), configs/rolling_forcing_dmd.yaml with
    # denoising_step_list [1000, 750, 500, 250] (a 4-block window), chunkwise/longvideo.pt
    # with --use_ema; its README runs --num_output_frames 252
    "causal-forcing-longvideo": _ROLLING | dict(steps=4),
    # 10 blocks of 4 tokens per frame: every read kind (sink re-placed, eviction, a clean pass
    # without the sink, short end windows) within the tiny table's 32 latent frames
    "tiny-random": _ROLLING | dict(num_chunks=10, height=32, width=32),
}
_KEPT = [
    "weights",
    "base",
    "generator",
    "ema",
    "steps",
    "step_list",
    "warp",
    "shift",
    "num_chunks",
    "num_frames",
    "height",
    "width",
    "fps",
    "device",
    "dtype",
    "attention_backend",
    "init_seed",
    "precision",
]
OPTIONS = {k: v for k, v in sf.OPTIONS.items() if k in _KEPT} | {
    "config": sf.Spec("str", choices=tuple(PRESETS)),
}


class RollingForcing(sf.SelfForcing):
    """A loaded Rolling Forcing model; ``generate`` runs the rolling-window loop above."""

    name = NAME

    def __init__(self, components: Any, settings: sf.SelfForcingSettings) -> None:
        super().__init__(components, settings)
        self.settings |= {
            "clean_context": CLEAN_CONTEXT,
            "rolling_window_blocks": len(self.schedule),
            "attention_frames": plan.ATTENTION_FRAMES,
        }

    def resolve_kv(self, kv: KVSpec) -> KVSpec:
        """``kv`` as this model runs it; a pruner is a :class:`UsageError` (jbkv's pruned caches
        have no pre-RoPE layout, and this model's sink is always kept before RoPE)."""
        if kv.pruner is not None:
            raise UsageError(
                f"{kv.pruner.name} cannot prune {NAME}: its sink is cached before RoPE, which "
                "pruned caches do not implement"
            )
        return super().resolve_kv(kv)

    def key_rope(self, kv: KVSpec, layout: str | None, latents: torch.Tensor) -> KeyRope:
        """Always a :class:`KeyRope`: the whole cache before RoPE when the method (or
        ``layout="pre-rope"``) asks, else only the sink (``sinks_only``), as upstream."""
        whole = super().key_rope(kv, layout, latents)
        if whole is not None:
            return whole
        return replace(wan_key_rope(self.components.transformer, latents), sinks_only=True)

    def host_times(self, times: list[float]) -> torch.Tensor:
        """What :meth:`flow_frames` copies to the device for ``times`` (once per distinct
        value, :func:`~jbkv_cli.utils.host_reads.device_values`): the per-frame timesteps, or
        under upstream's casting their sinusoidal embedding."""
        t = torch.tensor(times, dtype=torch.float32)
        if self.precision.upstream:
            return time_sinusoid(self.components.transformer, t[None])
        return t

    def flow_frames(self, x: torch.Tensor, times: list[float], text: torch.Tensor) -> torch.Tensor:
        """The flow ``v`` of a window ``x`` ``[1, C, F, h, w]`` whose frame ``f`` is at
        timestep ``times[f]`` (per-token timesteps: frames are the outer token axis; under
        upstream's casting per frame, as ``CausalWanModel``)."""
        if self.precision.upstream:
            return self.upstream_flow(x, times, text)
        transformer = self.components.transformer
        per_frame = device_values(self.host_times(times), x.device)
        timestep = per_frame.repeat_interleave(self.head_layout()["frame_tokens"])[None]
        out = transformer(
            hidden_states=x.to(transformer.dtype),
            timestep=timestep,
            encoder_hidden_states=text,
            return_dict=False,
        )[0]
        return out.float()

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
        """The rolling loop; returns the clean latents ``[1, C, F, h, w]`` and cache facts.

        ``probe`` is told ``(window, 0)`` before each window forward and ``(block, None)``
        before each clean pass; ``layout`` as the ``self-forcing`` adapter; ``image`` must be
        None (no image-to-video); ``name`` seeds the noise (default: the prompt)."""
        if image is not None:
            raise UsageError(f"{NAME}: image-to-video is not supported")
        s, k = self.config, self.config.chunk_frames
        schedule = self.schedule
        text = self.encode_prompt(prompt)
        spec = self.cache_spec(kv)
        generator = noise_generator(seed, prompt if name is None else name)
        rope = self.key_rope(spec, layout, torch.empty(self.chunk_shape, device="meta"))
        books = self.loop_caches(spec, rope, observer, probe, progress)
        context = self.context(books.layers(), rope)
        noisy: dict[int, torch.Tensor] = {}
        final: list[torch.Tensor | None] = [None] * s.num_chunks
        plan_ = plan.windows(s.num_chunks, len(schedule))
        transformer = self.components.transformer
        noise = self.draws(generator, s.num_chunks * len(schedule))  # a block's, each renoise's
        times_of = {
            w.index: [schedule.timesteps[w.step(b)] for b in w.blocks for _ in range(k)]
            for w in plan_
        }
        # the windows that fill and drain the rolling window take timesteps no other window
        # repeats: every window's (and the clean pass's t = 0) are copied to the device
        # together, before the first forward
        clean = [0.0] * k
        prefetch_values([self.host_times(t) for t in (*times_of.values(), clean)], s.device)
        with torch.no_grad(), cached_self_attention(transformer, context):
            for window in plan_:
                if window.index < s.num_chunks:
                    noisy[window.index] = next(noise)
                blocks = list(window.blocks)
                x = torch.cat([noisy[b] for b in blocks], dim=2)
                times = times_of[window.index]
                read = plan.window_read(window, k)
                context.reads = {} if read is None else {"last": read[0], "positions": {0: read[1]}}
                context.frame_offset = window.start * k
                books.at(window.index, 0)
                v = self.flow_frames(x, times, text)
                books.measure_views()
                for j, b in enumerate(blocks):
                    step = window.step(b)
                    part = slice(j * k, (j + 1) * k)
                    x0 = to_x0(x[:, :, part], v[:, :, part], schedule.sigmas[step])
                    if step + 1 < len(schedule):
                        noisy[b] = renoise(x0, next(noise), schedule.sigmas[step + 1])
                    else:  # its last step: final, out of the window
                        final[b] = x0
                        del noisy[b]
                done = window.start
                if window.step(done) == len(schedule) - 1 and done + 1 < s.num_chunks:
                    self._commit(books, context, done, final[done], text)
                books.chunk_done(min(window.index + 1, s.num_chunks))
        info = books.facts() | {"sink_chunks": spec.sink_chunks}
        return torch.cat(final, dim=2), info

    def _commit(
        self,
        books: LoopCaches,
        context: ChunkContext,
        block: int,
        x0: torch.Tensor,
        text: torch.Tensor,
    ) -> None:
        """The clean pass of a finished block: one forward at t = 0 that reads blocks
        ``max(0, block − 6) … block`` and commits the block's K/V."""
        k = self.config.chunk_frames
        last, sinks = plan.clean_read(block, k)
        context.reads = {"last": last, "sinks": sinks}
        context.frame_offset = block * k
        try:
            with books.commit_pass(block, context):
                self.flow(x0, 0.0, text)
        finally:
            context.reads = {}

    def check_case(self, case: Case) -> None:
        """Refuse a case with a trajectory or an image (:func:`check_case`)."""
        check_case(case)


def check_case(case: Case) -> None:
    """Refuse a case with a trajectory or an image (text-to-video only)."""
    if case.image is not None:
        raise UsageError(f"case {shown(case.name)}: {NAME} generates from text only (no --image)")
    text_case(case, NAME)


def _resolved(options: dict[str, Any]) -> tuple[dict[str, Any], sf.SelfForcingSettings, Any]:
    """Checked options, settings and the located weight files (None for tiny-random)."""
    options = parse_options(OPTIONS, options, NAME, sep=": ", error=UsageError)
    options = checked_options(NAME, options, frozenset(OPTIONS), PRESETS, NAME)
    settings = sf.build_settings(options, PRESETS, NAME)
    if options["config"] == "tiny-random":
        given = sorted({"weights", "base", "generator"} & set(options))
        if given:
            raise UsageError(f"config=tiny-random builds random weights; do not pass {given[0]}")
        return options, settings, None
    paths = locate(settings.config, settings.weights, settings.base, settings.generator)
    settings = replace(settings, base=str(paths.base), generator=str(paths.generator))
    return options, settings, paths


def check_options(**options: Any) -> None:
    """Refuse what :func:`load_model` would refuse (values, lengths, missing weight files)
    without building the model."""
    _resolved(options)


def input_paths(**options: Any) -> dict[str, Path]:
    """Role -> the base's parts and the checkpoint these options read (none for tiny-random)."""
    _, _, paths = _resolved(options)
    return {} if paths is None else weight_files(paths)


def check_cases(cases: Any, **options: Any) -> None:
    """Refuse, before anything is built, the first case this model cannot generate."""
    _resolved(options)
    for case in cases:
        check_case(case)


def load_model(**options: Any) -> RollingForcing:
    """Build Rolling Forcing from local weights, or ``config="tiny-random"``.

    Options (None: the default): ``config`` (``rolling-forcing`` | ``causal-forcing-longvideo``
    | ``tiny-random``); weights:
    ``weights`` (root directory laid out as ``ROOT/Wan2.1-T2V-1.3B-Diffusers/`` and
    ``ROOT/checkpoints/rolling_forcing_dmd.pt``; else ``$JBKV_SELF_FORCING_DIR``, else the HF
    cache), ``base``, ``generator``, ``ema`` (true: ``generator_ema``); sampling: ``steps`` (5;
    the window's blocks) or ``step_list``, ``warp``, ``shift`` (5.0), ``num_chunks`` (7 blocks
    of 3 latent frames) or ``num_frames``, ``height``/``width`` (480/832), ``fps`` (16);
    ``device``, ``dtype``, ``precision`` (16-bit casting, as ``self-forcing``),
    ``attention_backend``, ``init_seed`` (tiny-random weights, 0).
    """
    options, settings, paths = _resolved(options)
    dtype = dtype_from_name(settings.dtype)
    if paths is None:
        components = tiny_components(seed=int(options.get("init_seed", 0)), dtype=dtype)
    else:
        components = load_components(paths, dtype, settings.ema, None)
    return RollingForcing(sf.place(components, settings), settings)


def plan_model(**options: Any) -> RollingForcing:
    """Rolling Forcing as a GPU runs it, for ``jbkv plan``
    (:func:`~jbkv_cli.models.wan.self_forcing.model.planned_build`)."""
    settings, components = sf.planned_build(options, PRESETS, NAME, OPTIONS, NAME)
    return RollingForcing(components, settings)
