"""Wan-VAE decoding: a chunk loop's normalised latents to uint8 frames, and to the
:class:`~jbkv_cli.models.base.Video` a Wan-family adapter returns."""

from __future__ import annotations

from typing import Any

import torch

from jbkv_cli.metrics.chunks import causal_vae_chunks
from jbkv_cli.models.base import Video


def vae_scale(vae: Any) -> tuple[int, int]:
    """(temporal, spatial) down-sampling of a Wan VAE (4, 8 for Wan 2.1)."""
    downsample = vae.config.temperal_downsample
    return 2 ** sum(downsample), 2 ** len(downsample)


def decode_wan(vae: Any, latents: torch.Tensor) -> torch.Tensor:
    """Normalised latents ``[1, C, F, h, w]`` -> uint8 frames ``[T, H, W, 3]`` on the CPU.

    ``z = latents · std + mean`` (the VAE config's per-channel statistics), decoded to [−1, 1]
    and mapped to ``round((x + 1) · 127.5)``.
    """
    mean = torch.tensor(vae.config.latents_mean).view(1, -1, 1, 1, 1)
    std = torch.tensor(vae.config.latents_std).view(1, -1, 1, 1, 1)
    z = (latents * std.to(latents) + mean.to(latents)).to(vae.dtype)
    video = vae.decode(z, return_dict=False)[0]  # [1, 3, T, H, W] in [-1, 1]
    frames = ((video[0].float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
    return frames.permute(1, 2, 3, 0).contiguous().cpu()


def chunk_video(
    components: Any, config: Any, latents: torch.Tensor, label: str, info: dict[str, Any]
) -> Video:
    """Decode ``latents`` with ``components.vae`` into a :class:`Video` whose info records the
    run settings (``config``: dtype, device, chunk_frames, num_chunks, window, fps), the decoded
    chunks' frame counts (the causal VAE's first chunk is 3 frames short), the cache variant
    ``label``, the weights and ``info`` (with ``kv_cache_bytes``)."""
    with torch.no_grad():
        frames = decode_wan(components.vae, latents)
    record = {
        "dtype": config.dtype,
        "device": config.device,
        "chunk_frames": config.chunk_frames,
        "num_chunks": config.num_chunks,
        "window": config.window,
        "kv": label,
        "weights": components.source,
        **causal_vae_chunks(config.chunk_frames, vae_scale(components.vae)[0]),
        **info,
    }
    return Video(
        frames=frames, fps=float(config.fps), kv_cache_bytes=info["kv_cache_bytes"], info=record
    )
