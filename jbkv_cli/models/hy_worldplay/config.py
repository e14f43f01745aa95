"""HY-WorldPlay configurations: the WorldPlay-8B transformer and its AR schedule.

Values read from Tencent-Hunyuan/HY-WorldPlay@da2d0c2 (``hyvideo/``) and the HunyuanVideo-1.5
480p i2v transformer config they build on (diffusers' conversion script
``scripts/convert_hunyuan_video1_5_to_diffusers.py`` lists the same numbers):

- ``hyvideo/models/transformers/worldplay_1_5_transformer.py``: 54 double-stream blocks, no
  single-stream block, hidden 2048 = 16 heads x 128, RoPE dims (16, 56, 56), theta 256, patch
  1x1x1, in 32 latent + 32 condition + 1 mask channels (``concat_condition``), out 32, text
  dim 3584 (Qwen2.5-VL-7B), ByT5 1472 (mapped 1472 -> 2048 -> 2048 -> hidden), vision 1152
  (SigLIP), RMSNorm on q/k, ``cond_type_embedding``; ``add_action_parameters`` adds
  ``action_in`` and each block's ``img_attn_prope_proj``.
- ``hyvideo/pipelines/worldplay_video_pipeline.py:_ar_rollout_inner``: chunks of 4 latents,
  memory pass at ``stabilization_level - 1 = 14``, ``select_aligned_memory_frames(memory_frames=20,
  temporal_context_size=12, pred_latent_size=4)``.
- ``hyvideo/commons/__init__.py`` ``PIPELINE_CONFIGS['480p_i2v']``: flow shift 5; the few-step
  (distilled) model runs 4 steps with guidance 1 (no CFG).

``TINY`` is a random test configuration of the same code (every width small, two blocks).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class DiTConfig:
    """The transformer's architecture (upstream constructor argument names where they exist)."""

    hidden_size: int = 2048
    heads_num: int = 16
    mlp_width_ratio: float = 4.0
    mm_double_blocks_depth: int = 54
    refiner_depth: int = 2  # SingleTokenRefiner(depth=2), hard-coded upstream
    rope_dim_list: tuple[int, int, int] = (16, 56, 56)
    rope_theta: float = 256.0
    in_channels: int = 32  # latent channels; the patch embedding reads 2 * 32 + 1
    out_channels: int = 32
    text_states_dim: int = 3584
    byt5_dim: int = 1472  # ByT5Mapper(in_dim=1472, hidden_dim=2048, out_dim=2048), hard-coded
    byt5_hidden: int = 2048
    vision_states_dim: int = 1152
    frequency_embedding_size: int = 256

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.heads_num

    @property
    def patch_in_channels(self) -> int:
        """``concat_condition``: latent, condition latent and the mask channel."""
        return 2 * self.in_channels + 1

    def validate(self) -> None:
        if self.hidden_size % self.heads_num:
            raise ValueError(f"hidden {self.hidden_size} not divisible by {self.heads_num} heads")
        if sum(self.rope_dim_list) != self.head_dim:
            raise ValueError(f"rope dims {self.rope_dim_list} must sum to {self.head_dim}")
        if any(d % 2 for d in self.rope_dim_list) or self.head_dim % 4:
            raise ValueError("rope dims must be even and the head dim a multiple of 4 (PRoPE)")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Schedule:
    """The AR rollout: 4 distilled flow-matching steps per chunk of 4 latents."""

    steps: int = 4
    shift: float = 5.0
    chunk_latents: int = 4
    memory_timestep: float = 14.0  # stabilization_level - 1
    memory_frames: int = 20
    temporal_context: int = 12
    num_train_timesteps: int = 1000
    fps: int = 24
    spatial_compression: int = 16
    temporal_compression: int = 4

    def sigmas(self) -> list[float]:
        """``FlowMatchDiscreteScheduler.set_timesteps``: ``linspace(1, 0, steps + 1)`` through
        SD3's shift ``s t / (1 + (s - 1) t)`` (4 steps, shift 5: 1, 0.9375, 0.8333, 0.625, 0)."""
        import torch

        t = torch.linspace(1, 0, self.steps + 1)
        return (self.shift * t / (1 + (self.shift - 1) * t)).tolist()


OFFICIAL = DiTConfig()
SCHEDULE = Schedule()

TINY = DiTConfig(
    hidden_size=64,
    heads_num=2,
    mm_double_blocks_depth=2,
    rope_dim_list=(8, 12, 12),
    in_channels=4,
    out_channels=4,
    text_states_dim=32,
    byt5_dim=16,
    byt5_hidden=24,
    vision_states_dim=16,
)
TINY_SCHEDULE = Schedule(spatial_compression=4)
