"""Matrix-Game-2.0's architecture and sampling constants, read from upstream.

Source: SkyworkAI/Matrix-Game (v2, folder ``Matrix-Game-2``), at the files
``configs/distilled_model/{universal,gta_drive,templerun}/config.json``,
``configs/inference_yaml/inference_{universal,gta_drive,templerun}.yaml``,
``wan/modules/causal_model.py``, ``wan/modules/action_module.py``,
``pipeline/causal_inference.py`` and ``inference.py``
(read through the forks that carry the folder verbatim, e.g. zoheth/Matrix-Game
@8ed02bd6:Matrix-Game-2/configs/inference_yaml/inference_templerun.yaml, 3a1b2c3/Matrix-Game
@19e0843a:Matrix-Game-2/wan/modules/action_module.py and hathibelagal-dev/Matrix-Game
@b85d3423:Matrix-Game-2/wan/modules/causal_model.py; upstream @756776d5:Matrix-Game-2/inference.py,
@5a4fa8b2:Matrix-Game-2/pipeline/causal_inference.py).

* the DiT: Wan2.1-1.3B shaped as SkyReels-V2-I2V — ``in_dim`` 36 (16 noisy latent channels +
  4 mask + 16 image-latent channels), dim 1536, 30 blocks of 12 heads × 128, FFN 8960, an
  image-only cross-attention over ``img_emb(CLIP ViT-H/14 tokens)`` (257 × 1280), no text;
* ``local_attn_size`` 6 latent frames (GTA: 4), no sink; chunks (``num_frame_per_block``) of 3
  latent frames; the main cache holds ``local_attn_size · 880`` tokens per block;
* the ActionModule in blocks 0–14: keyboard ``keyboard_dim_in`` (universal 4, GTA 2,
  TempleRun 7), mouse 2-d (TempleRun: none), ``hidden_size`` 128, 16 heads of 64,
  ``windows_size`` 3 latent frames × ``vae_time_compression_ratio`` 4 raw frames, RoPE
  dims [8, 28, 28] with θ = 256 over a 7,500-frame table;
* sampling, per preset (its ``inference_*.yaml``): ``denoising_step_list`` [1000, 666, 333]
  (universal, GTA) or [1000, 750, 500, 250] (TempleRun: a 4-step checkpoint), each with
  ``warp_denoising_step: true`` through the ``timestep_shift`` 5 table (:class:`Preset`
  carries each), ``context_noise`` 0, ``num_output_frames`` 150 latent frames (597 frames),
  352 × 640 (44 × 80 latents, 22 × 40 = 880 tokens per latent frame), 16 fps output.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

ROPE_FRAMES = 1024  # rope_params(1024, ...): the main self-attention's table (latent frames)
ACTION_ROPE_FRAMES = 7500  # ActionModule.get_rotary_pos_embed(7500, ...)
STEPS_3 = (1000, 666, 333)  # inference_universal.yaml, inference_gta_drive.yaml
STEPS_4 = (1000, 750, 500, 250)  # inference_templerun.yaml


@dataclass(frozen=True)
class ActionConfig:
    """``action_config`` of upstream's ``config.json``."""

    blocks: tuple[int, ...] = tuple(range(15))
    keyboard_dim: int = 4  # keyboard_dim_in
    mouse_dim: int = 2  # mouse_dim_in; 0: enable_mouse false (TempleRun)
    hidden_size: int = 128  # keyboard embedding width
    keyboard_hidden: int = 1024
    mouse_hidden: int = 1024
    heads: int = 16  # heads_num
    windows: int = 3  # windows_size (latent frames of actions a latent frame reads)
    time_ratio: int = 4  # vae_time_compression_ratio
    rope_dims: tuple[int, int, int] = (8, 28, 28)  # mouse_qk_dim_list / rope_dim_list
    rope_theta: float = 256.0

    @property
    def pad(self) -> int:
        """Raw frames of one action window (``pad_t = ratio · windows``)."""
        return self.time_ratio * self.windows

    @property
    def mouse(self) -> bool:
        return self.mouse_dim > 0


@dataclass(frozen=True)
class DiTConfig:
    """The CausalWanModel's ``config.json`` (the fields that shape weights and the loop)."""

    dim: int = 1536
    ffn_dim: int = 8960
    freq_dim: int = 256
    heads: int = 12
    layers: int = 30
    in_dim: int = 36
    out_dim: int = 16
    patch: tuple[int, int, int] = (1, 2, 2)
    clip_dim: int = 1280  # MLPProj(1280, dim)
    local_attn_size: int = 6  # latent frames, including the current chunk
    eps: float = 1e-6
    rope_frames: int = ROPE_FRAMES
    action: ActionConfig = field(default_factory=ActionConfig)

    @property
    def head_dim(self) -> int:
        return self.dim // self.heads


@dataclass(frozen=True)
class Preset:
    """A released checkpoint's DiT config, default shape and sampling schedule (its
    ``inference_*.yaml``: ``denoising_step_list``, ``warp_denoising_step``, ``timestep_shift``)."""

    dit: DiTConfig
    steps: tuple[int, ...] = STEPS_3
    warp: bool = True
    shift: float = 5.0
    height: int = 352
    width: int = 640
    chunk_frames: int = 3
    num_chunks: int = 50  # num_output_frames 150
    fps: int = 16
    image_tokens: int = 257  # CLIP ViT-H/14 at 224: 256 patches + class token


UNIVERSAL = Preset(DiTConfig())
GTA = Preset(DiTConfig(local_attn_size=4, action=ActionConfig(keyboard_dim=2)))
TEMPLERUN = Preset(DiTConfig(action=ActionConfig(keyboard_dim=7, mouse_dim=0)), steps=STEPS_4)
# tiny-random: 2 blocks (one with the ActionModule), dim 64 (heads of 32: group 32 fits), 32 × 32 frames (4 × 4 latents,
# 2 × 2 = 4 tokens a frame), 3 chunks of 3 latent frames, local attention 6 frames and universal's
# 3-step schedule as upstream
TINY = Preset(
    DiTConfig(
        dim=64,
        ffn_dim=128,
        freq_dim=16,
        heads=2,
        layers=2,
        clip_dim=24,
        action=ActionConfig(
            blocks=(0,),
            hidden_size=8,
            keyboard_hidden=64,
            mouse_hidden=64,
            heads=2,
            rope_dims=(4, 14, 14),
        ),
    ),
    height=32,
    width=32,
    num_chunks=3,
    image_tokens=5,
)
PRESETS: dict[str, Preset] = {
    "universal": UNIVERSAL,
    "gta": GTA,
    "templerun": TEMPLERUN,
    "tiny-random": TINY,
}


def with_local(preset: Preset, frames: int) -> Preset:
    """``preset`` with ``local_attn_size = frames``."""
    return replace(preset, dit=replace(preset.dit, local_attn_size=frames))
