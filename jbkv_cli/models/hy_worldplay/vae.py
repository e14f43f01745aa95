"""HY-WorldPlay's VAE: diffusers' ``AutoencoderKLHunyuanVideo15`` (HunyuanVideo-1.5's causal
3-D VAE: 32 latent channels, 16x spatial, 4x temporal), loaded strictly from upstream's file.

``tencent/HunyuanVideo-1.5/vae/diffusion_pytorch_model.safetensors`` keeps upstream's names
(``hyvideo/models/autoencoders/hunyuanvideo_15_vae_w_cache.py``); :func:`diffusers_key` renames
them to diffusers' (the rules of diffusers' ``convert_hunyuan_video1_5_to_diffusers.py``:
``down.{i}.block.{j}`` -> ``down_blocks.{i}.resnets.{j}``, ``down.{i}.downsample`` ->
``down_blocks.{i}.downsamplers.0``, ``up.{i}.upsample`` -> ``up_blocks.{i}.upsamplers.0``,
``mid.block_{1,2}`` -> ``mid_block.resnets.{0,1}``, ``mid.attn_1.{q,k,v}`` ->
``mid_block.attentions.0.to_{q,k,v}``). A file already in diffusers' names loads as it is.

Latents are scaled by ``scaling_factor`` (1.03682; upstream's config has no shift). Decoding
tiles spatially on the GPU (diffusers' ``enable_tiling``) and returns uint8 frames.

**One latent at a time.** WorldPlay's VAE (``hunyuanvideo_15_vae_w_cache``) decodes latent by
latent, its causal convolutions fed from a feature cache, so the decoder's mid-block attention
sees one latent frame; diffusers' decoder attends causally over every earlier frame. jbkv
decodes with diffusers' modules and a per-frame attention mask in the decoder
(:func:`per_frame_attention`), which is upstream's default (untiled) decode: a one-off check on a
random tiny VAE against upstream's class gave max |diff| 1e-6 (0.2 with diffusers' causal
mask); the tests hold the decoder attention on T frames equal to T one-frame calls. Differences
left: jbkv decodes in fp32 and, on CUDA, with diffusers' spatial tiling (upstream: fp16
autocast, untiled).
"""

from __future__ import annotations

import re
from pathlib import Path

import torch

from jbkv_cli.models.safetensors_io import check_state_dict, open_safetensors
from jbkv_cli.utils.errors import JbkvError
from jbkv_cli.utils.jsonio import read_json

_RULES = (
    (
        re.compile(r"^(encoder|decoder)\.down\.(\d+)\.block\.(\d+)\."),
        r"\1.down_blocks.\2.resnets.\3.",
    ),
    (
        re.compile(r"^(encoder|decoder)\.down\.(\d+)\.downsample\."),
        r"\1.down_blocks.\2.downsamplers.0.",
    ),
    (re.compile(r"^(encoder|decoder)\.up\.(\d+)\.block\.(\d+)\."), r"\1.up_blocks.\2.resnets.\3."),
    (re.compile(r"^(encoder|decoder)\.up\.(\d+)\.upsample\."), r"\1.up_blocks.\2.upsamplers.0."),
    (re.compile(r"^(encoder|decoder)\.mid\.block_1\."), r"\1.mid_block.resnets.0."),
    (re.compile(r"^(encoder|decoder)\.mid\.block_2\."), r"\1.mid_block.resnets.1."),
    (
        re.compile(r"^(encoder|decoder)\.mid\.attn_1\.([qkv])\."),
        r"\1.mid_block.attentions.0.to_\2.",
    ),
    (re.compile(r"^(encoder|decoder)\.mid\.attn_1\."), r"\1.mid_block.attentions.0."),
)
CONFIG_KEYS = {  # upstream config.json name -> diffusers argument
    "latent_channels": "latent_channels",
    "block_out_channels": "block_out_channels",
    "layers_per_block": "layers_per_block",
    "ffactor_spatial": "spatial_compression_ratio",
    "ffactor_temporal": "temporal_compression_ratio",
    "spatial_compression_ratio": "spatial_compression_ratio",
    "temporal_compression_ratio": "temporal_compression_ratio",
    "downsample_match_channel": "downsample_match_channel",
    "upsample_match_channel": "upsample_match_channel",
}


def diffusers_key(name: str) -> str:
    """An upstream VAE parameter name in diffusers' naming (unchanged if already there)."""
    for pattern, repl in _RULES:
        new = pattern.sub(repl, name)
        if new != name:
            return new
    return name


def frame_mask(n_frame: int, n_hw: int, dtype, device, batch_size: int | None = None):
    """Additive mask ``[(B,) F hw, F hw]``: each token attends to the tokens of its own frame."""
    frame = torch.arange(n_frame * n_hw, device=device) // n_hw
    mask = torch.where(frame[:, None] == frame[None, :], 0.0, float("-inf")).to(dtype)
    return mask if batch_size is None else mask.unsqueeze(0).expand(batch_size, -1, -1)


def per_frame_attention(vae) -> None:
    """Make the decoder's attention blocks attend within each latent frame (upstream's
    streaming decode); an instance attribute, diffusers' class is untouched."""
    for module in vae.decoder.modules():
        if hasattr(module, "prepare_causal_attention_mask"):
            module.prepare_causal_attention_mask = frame_mask


def build_vae(config: dict | None = None):
    """``AutoencoderKLHunyuanVideo15`` with diffusers' defaults (upstream's architecture) or the
    given keyword arguments, decoding as upstream (:func:`per_frame_attention`)."""
    from diffusers import AutoencoderKLHunyuanVideo15

    vae = AutoencoderKLHunyuanVideo15(**(config or {}))
    per_frame_attention(vae)
    return vae


def vae_config(directory: Path) -> dict:
    """The architecture arguments of ``directory/config.json`` that diffusers' class takes."""
    raw = read_json(directory / "config.json", "HunyuanVideo-1.5 VAE config", finite=False)
    if not isinstance(raw, dict):
        raise JbkvError(f"{directory / 'config.json'} is not a JSON object")
    out = {arg: raw[k] for k, arg in CONFIG_KEYS.items() if k in raw}
    if "block_out_channels" in out:
        out["block_out_channels"] = tuple(out["block_out_channels"])
    if "scaling_factor" in raw:
        out["scaling_factor"] = float(raw["scaling_factor"])
    if raw.get("shift_factor"):
        raise JbkvError(f"{directory}: a VAE with a shift_factor is not HunyuanVideo-1.5's")
    return out


def load_vae(directory: Path, device: str, dtype: torch.dtype):
    """The VAE of ``directory`` (``config.json`` + ``diffusion_pytorch_model.safetensors``),
    strict, on ``device``."""
    with torch.device("meta"):
        vae = build_vae(vae_config(directory))
    path = directory / "diffusion_pytorch_model.safetensors"
    with open_safetensors(path) as fh:
        state = {diffusers_key(k): fh.get_tensor(k) for k in fh.keys()}  # noqa: SIM118
    check_state_dict(vae, state, f"HunyuanVideo-1.5 VAE ({path})")
    vae.load_state_dict(state, strict=True, assign=True)
    return vae.to(device, dtype).eval()


@torch.no_grad()
def encode_image(vae, pixels: torch.Tensor) -> torch.Tensor:
    """``pixels`` ``[1, 3, 1, H, W]`` in [-1, 1] -> the scaled latent (the mode)."""
    dtype = next(vae.parameters()).dtype
    dist = vae.encode(pixels.to(vae.device, dtype)).latent_dist
    return dist.mode().float() * vae.config.scaling_factor


@torch.no_grad()
def decode_frames(vae, latents: torch.Tensor) -> torch.Tensor:
    """Scaled latents ``[1, C, T, h, w]`` -> uint8 frames ``[4T - 3, H, W, 3]`` on the CPU."""
    dtype = next(vae.parameters()).dtype
    if vae.device.type == "cuda":
        vae.enable_tiling()
    video = vae.decode(latents.to(vae.device, dtype) / vae.config.scaling_factor).sample
    video = (video.float() / 2 + 0.5).clamp(0, 1)
    frames = (video[0] * 255).round().to(torch.uint8).permute(1, 2, 3, 0)
    return frames.contiguous().cpu()
