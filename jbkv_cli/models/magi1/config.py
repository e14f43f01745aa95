"""MAGI-1 configurations: the DiT architecture and the chunk-wise sampling schedule.

Values are those of upstream ``example/4.5B/*.json`` and ``example/24B/*.json``
(SandAI-org/MAGI-1 @6ff822e). ``TINY`` is a random test configuration of the same code.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace


@dataclass(frozen=True)
class DiTConfig:
    """The ``model_config`` block of an upstream MAGI-1 config (names kept)."""

    num_layers: int = 34
    hidden_size: int = 3072
    ffn_hidden_size: int = 12288
    num_attention_heads: int = 24
    num_query_groups: int = 8  # GQA: number of KV heads
    kv_channels: int = 128  # head dim
    layernorm_epsilon: float = 1e-6
    apply_layernorm_1p: bool = True  # zero-centred gamma: LayerNorm uses ``weight + 1``
    x_rescale_factor: float = 1.0
    half_channel_vae: bool = False  # 24B: latents are duplicated to 32 channels
    patch_size: int = 2
    t_patch_size: int = 1
    in_channels: int = 16
    out_channels: int = 16
    cond_hidden_ratio: float = 0.25
    caption_channels: int = 4096
    caption_max_length: int = 800
    xattn_cond_hidden_ratio: float = 1.0
    cond_gating_ratio: float = 1.0
    gated_linear_unit: bool = False  # 24B: SwiGLU MLP
    distill: bool = False  # engine_config.distill: adds the step-size embedding
    frequency_embedding_size: int = 256
    proj_interleave_heads: int = 8  # upstream's hard-coded TP8 layout in front of linear_proj

    @property
    def cond_dim(self) -> int:
        return int(self.hidden_size * self.cond_hidden_ratio)

    @property
    def xattn_dim(self) -> int:
        return int(self.hidden_size * self.xattn_cond_hidden_ratio)

    @property
    def q_size(self) -> int:
        return self.kv_channels * self.num_attention_heads

    @property
    def kv_size(self) -> int:
        return self.kv_channels * self.num_query_groups

    @property
    def rope_dim(self) -> int:
        """Head dim the rotary table is built for (upstream: ``hidden_size // heads``)."""
        return self.hidden_size // self.num_attention_heads

    @property
    def latent_channels(self) -> int:
        """Channels of the VAE latent the sampler works in (16 for all published models)."""
        return self.in_channels // 2 if self.half_channel_vae else self.in_channels


@dataclass(frozen=True)
class ScheduleConfig:
    """The sampling part of upstream's ``runtime_config`` / ``engine_config``."""

    num_steps: int = 64
    window_size: int = 4  # chunks denoised at once (pipelined)
    chunk_width: int = 6  # latent frames per chunk
    noise2clean_kvrange: tuple[int, ...] = (5, 4, 3, 2)  # attention range in chunks, per stage
    clean_chunk_kvrange: int = 1  # range of the refresh ("clean chunk") pass
    clean_t: float = 0.9999
    cfg_number: int = 3  # 3 for base models, 1 for distill models
    cfg_t_range: tuple[float, ...] = (0.0, 0.0217, 0.1, 0.3, 0.999)
    prev_chunk_scales: tuple[float, ...] = (1.5, 1.5, 1.5, 1.0, 1.0)
    text_scales: tuple[float, ...] = (7.5, 7.5, 7.5, 0.0, 0.0)
    shift: float = 3.0  # SD3 time shift
    shortcut_mode: str = "8,16,16"
    distill_nearly_clean_chunk_threshold: float = 0.3
    prev_chunks_scale: float = 0.7  # upstream env ``prev_chunks_scale`` (distill only)
    temporal_downsample_factor: int = 4
    spatial_downsample_factor: int = 8
    scale_factor: float = 0.18215  # VAE latent scale
    fps: int = 24


@dataclass(frozen=True)
class VAEConfig:
    """``ddconfig`` of upstream's ``ViTVAE`` (the published checkpoint's ``config.json``)."""

    video_size: int = 256
    video_length: int = 16
    patch_size: int = 8
    patch_length: int = 4
    in_chans: int = 3
    z_chans: int = 16
    double_z: bool = True
    embed_dim: int = 1024
    depth: int = 24
    num_heads: int = 16
    mlp_ratio: float = 4.0
    qkv_bias: bool = True
    ln_in_attn: bool = True
    conv_last_layer: bool = True
    with_cls_token: bool = True
    norm_code: bool = False
    use_rope: bool = False
    use_final_proj: bool = False

    @classmethod
    def from_dict(cls, ddconfig: dict) -> VAEConfig:
        known = {k: v for k, v in ddconfig.items() if k in cls.__dataclass_fields__}
        return cls(**known)


@dataclass(frozen=True)
class Magi1Variant:
    """One published checkpoint: architecture + schedule + where its weights live."""

    name: str
    dit: DiTConfig
    schedule: ScheduleConfig
    weight_subdir: str  # inference_weight, inference_weight.distill, inference_weight.fp8.distill
    fp8: bool = False
    default_height: int = 720
    default_width: int = 720
    default_num_chunks: int = 4
    extra: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        return asdict(self)


_DIT_4_5B = DiTConfig()
_DIT_24B = DiTConfig(
    num_layers=48,
    hidden_size=6144,
    ffn_hidden_size=16384,
    num_attention_heads=48,
    num_query_groups=8,
    kv_channels=128,
    x_rescale_factor=0.1,
    half_channel_vae=True,
    in_channels=32,
    out_channels=32,
    gated_linear_unit=True,
)
_BASE = ScheduleConfig(num_steps=64, cfg_number=3)
_DISTILL = ScheduleConfig(num_steps=16, cfg_number=1)

VARIANTS: dict[str, Magi1Variant] = {
    "4.5B_base": Magi1Variant("4.5B_base", _DIT_4_5B, _BASE, "inference_weight"),
    "4.5B_distill": Magi1Variant(
        "4.5B_distill", replace(_DIT_4_5B, distill=True), _DISTILL, "inference_weight.distill"
    ),
    "4.5B_distill_quant": Magi1Variant(
        "4.5B_distill_quant",
        replace(_DIT_4_5B, distill=True),
        _DISTILL,
        "inference_weight.fp8.distill",
        fp8=True,
    ),
    "24B_base": Magi1Variant("24B_base", _DIT_24B, _BASE, "inference_weight", default_width=1280),
    "24B_distill": Magi1Variant(
        "24B_distill",
        replace(_DIT_24B, distill=True),
        _DISTILL,
        "inference_weight.distill",
        default_width=1280,
    ),
    "24B_distill_quant": Magi1Variant(
        "24B_distill_quant",
        replace(_DIT_24B, distill=True),
        _DISTILL,
        "inference_weight.fp8.distill",
        fp8=True,
        default_width=1280,
    ),
}

DEFAULT_VARIANT = "4.5B_distill"

# A tiny random model of the same code: 2 layers, 4 query heads over 2 KV heads of dim 32
# (one quantization group of 32 per head), 2 latent frames per chunk, 4x4 latent pixels.
TINY_DIT = DiTConfig(
    num_layers=2,
    hidden_size=128,
    ffn_hidden_size=256,
    num_attention_heads=4,
    num_query_groups=2,
    kv_channels=32,
    in_channels=4,
    out_channels=4,
    caption_channels=32,
    caption_max_length=16,
    frequency_embedding_size=32,
    distill=True,
)
TINY_SCHEDULE = ScheduleConfig(
    num_steps=4,
    window_size=2,
    chunk_width=2,
    noise2clean_kvrange=(3, 2),
    cfg_number=1,
)
TINY_VAE = VAEConfig(
    video_size=32,
    video_length=8,
    patch_size=8,
    patch_length=4,
    z_chans=4,
    embed_dim=256,  # the decoder unpatchifies embed_dim into (4 x 8 x 8) x 1 channel
    depth=1,
    num_heads=2,
)
TINY_VARIANT = Magi1Variant(
    "tiny-random",
    TINY_DIT,
    TINY_SCHEDULE,
    "inference_weight.distill",
    default_height=32,
    default_width=32,
    default_num_chunks=3,
)
