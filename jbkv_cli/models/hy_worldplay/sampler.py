"""HY-WorldPlay's AR rollout over jbkv's caches (``_ar_rollout_inner``, few-step AR path).

1. The text pass, once per video: every block's text K/V into the text caches.
2. For chunk ``c`` (4 latents): when its memory list (``plan[c]``, :mod:`.retrieval`) is not
   empty, the memory pass: those clean latents, with their own condition channels, actions and
   cameras, at timestep 14 and RoPE time positions 0..M-1, through every block; each block's
   memory K/V are committed (and quantized) there.
3. Four denoising forwards of the chunk at time positions M..M+3, timestep ``1000 sigma_i``,
   each reading ``[text | memory | current]``; Euler ``x += v (sigma_{i+1} - sigma_i)`` in
   float32, the latents kept between steps in ``latent_dtype`` (default the model dtype, as
   upstream keeps bf16; ``precision=fp32-accum``: float32).

``uncached=True`` runs step 3 as :meth:`~.dit.WorldPlayDiT.full_forward` (memory recomputed
inside every forward under the block mask, no cache at all): the reference the tests hold the
cached loop to.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from jbkv_cli.attention.diagnostics import AttentionObserver
from jbkv_cli.kvcache import KVSpec
from jbkv_cli.models.base import ProgressFn
from jbkv_cli.models.hy_worldplay.config import Schedule
from jbkv_cli.models.hy_worldplay.dit import Latents, WorldPlayDiT
from jbkv_cli.models.hy_worldplay.memory import TEXT, WorldPlayCache
from jbkv_cli.models.hy_worldplay.trajectory import Trajectory
from jbkv_cli.models.loop import LoopCaches
from jbkv_cli.utils.host_reads import device_copy


@dataclass
class Conditions:
    """What a case conditions on, computed once: the text tokens ``txt`` ``[1, L, C]`` and
    ``vec_txt`` ``[1, C]`` (:meth:`~.dit.WorldPlayDiT.embed_text`), the condition latents
    ``cond`` ``[1, C_lat + 1, T, h, w]`` (the image latent on latent 0, then the mask
    channel), the trajectory and the memory plan (one index list per chunk)."""

    txt: torch.Tensor
    vec_txt: torch.Tensor
    cond: torch.Tensor
    trajectory: Trajectory
    plan: list[list[int]]


def _latents(x, cond, index: torch.Tensor, t: float, traj: Trajectory) -> Latents:
    """The latents ``x`` of frames ``index`` (on ``x``'s device) with their conditions; the
    trajectory is copied to the device once per video (host_reads.device_copy)."""
    return Latents(
        x=torch.cat([x, cond[:, :, index]], dim=1),
        t=torch.full((index.numel(),), float(t), device=x.device),
        action=device_copy(traj.actions, x.device)[index],
        w2c=device_copy(traj.w2c, x.device)[index],
        ks=device_copy(traj.intrinsics, x.device)[index],
    )


def plan_indices(plan: list[list[int]], device: torch.device) -> list[torch.Tensor]:
    """Each chunk's memory frames as an index tensor on ``device``, all copied in one go (a
    copy per chunk would wait for the device every chunk)."""
    flat = torch.tensor([i for frames in plan for i in frames], dtype=torch.long).to(device)
    return list(flat.split([len(frames) for frames in plan]))


@torch.no_grad()
def rollout(
    dit: WorldPlayDiT,
    cond: Conditions,
    noise: torch.Tensor,
    schedule: Schedule,
    kv: KVSpec,
    *,
    quantize_text: bool = False,
    observer: AttentionObserver | None = None,
    backend: str | None = None,
    progress: ProgressFn | None = None,
    uncached: bool = False,
    on_step: Any = None,
    latent_dtype: torch.dtype | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """The clean latents ``[1, C, T, h, w]`` (``latent_dtype``; None: the DiT's) and facts
    about the cache.

    ``on_step(chunk, step, latents_in, velocity)`` (tests) sees every denoising forward."""
    chunk = schedule.chunk_latents
    frames = noise.shape[2]
    chunks = frames // chunk
    sigmas = schedule.sigmas()
    cache = WorldPlayCache(
        kv,
        len(dit.double_blocks),
        quantize_text=quantize_text,
        observer=observer,
        backend=backend,
    )
    books = LoopCaches({TEXT: cache.text, **cache.memory}, chunks, progress=progress)
    if not uncached:
        dit.text_pass(cond.txt, cond.vec_txt, cache.store_text)
        books.committed()
    latents = noise.to(dit.dtype if latent_dtype is None else latent_dtype).clone()
    traj = cond.trajectory
    plans = plan_indices(cond.plan, latents.device)
    for c in range(chunks):
        idx = cond.plan[c]
        memory = None
        if idx:
            x_mem = latents[:, :, plans[c]]
            memory = _latents(x_mem, cond.cond, plans[c], schedule.memory_timestep, traj)
            if not uncached:
                with books.commit_pass(c, cache, flag="memory_pass"):
                    dit.vision_pass(memory, 0, cache.attend, final=False)
        current = torch.arange(c * chunk, (c + 1) * chunk, device=latents.device)
        for i in range(schedule.steps):
            t = sigmas[i] * schedule.num_train_timesteps
            x = latents[:, :, c * chunk : (c + 1) * chunk]
            lat = _latents(x, cond.cond, current, t, traj)
            if uncached:
                v = dit.full_forward(cond.txt, cond.vec_txt, memory, lat)
            else:
                v = dit.vision_pass(lat, len(idx), cache.attend)
            if on_step is not None:
                on_step(c, i, x, v)
            x = x.float() + v * (sigmas[i + 1] - sigmas[i])
            latents[:, :, c * chunk : (c + 1) * chunk] = x.to(latents.dtype)
        books.chunk_done(c + 1)
    info = books.facts(split="kv_cache_bytes_by_branch")
    return latents, info | {"memory_latents": [len(p) for p in cond.plan]}
