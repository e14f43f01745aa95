"""Shared by the Self-Forcing-family tests: the sampler stated without a KV cache."""

from __future__ import annotations

import pytest
import torch

from jbkv_cli.models.seeding import noise_generator
from jbkv_cli.models.wan.self_forcing.schedule import FewStepSchedule

TOKENS = 4  # tokens per latent frame at 32x32 pixels (4x4 latents, 2x2 patches)


def _mask(num_chunks: int, k: int, window: int) -> torch.Tensor:
    """``[L, L]`` bool: chunk q sees itself and the ``window`` chunks before it."""
    chunk = torch.arange(num_chunks).repeat_interleave(k * TOKENS)
    q, key = chunk[:, None], chunk[None, :]
    return (key == q) | ((key < q) & (key >= q - window))


def _masked_forward(transformer, video, text, per_chunk, k, mask):
    """diffusers' stock processors on the whole ``video`` under ``mask``, per-token timesteps
    (no jbkv code)."""
    stock = [b.attn1.get_processor() for b in transformer.blocks]

    class Masked:
        def __init__(self, processor):
            self.processor = processor

        def __call__(self, attn, hidden, enc=None, attention_mask=None, rotary=None):
            return self.processor(attn, hidden, enc, mask[None, None], rotary)

    timestep = torch.tensor(per_chunk).repeat_interleave(k * TOKENS)[None]
    try:
        for block, processor in zip(transformer.blocks, stock, strict=True):
            block.attn1.set_processor(Masked(processor))
        return transformer(video, timestep, text, return_dict=False)[0]
    finally:
        for block, processor in zip(transformer.blocks, stock, strict=True):
            block.attn1.set_processor(processor)


def cache_free_sampler(model, prompt: str, seed: int, image: torch.Tensor | None) -> torch.Tensor:
    """Upstream's ``CausalInferencePipeline.inference`` stated without a cache: every step
    re-runs the whole video so far (finished frames, the image first, at t = 0; the current
    chunk at t) under the block-causal mask; the first generated chunk takes
    ``denoising_step_list_first_chunk``; x₀ = x − σv, then (1 − σ′)x₀ + σ′ε."""
    s, transformer = model.config, model.components.transformer
    k = s.chunk_frames
    rest = FewStepSchedule.build(s.steps, s.shift, s.step_list, s.warp)
    first = (
        rest
        if s.first_chunk_steps is None
        else FewStepSchedule.build(s.first_chunk_steps, s.shift, warp=s.warp)
    )
    window = s.window if s.window is not None else s.num_chunks
    text = model.encode_prompt(prompt)
    generator = noise_generator(seed, prompt)
    done = [] if image is None else [image]
    start = len(done)
    for c in range(start, s.num_chunks):
        schedule = first if c == start else rest
        x = torch.randn(1, 16, k, 4, 4, generator=generator)
        for i, (t, sigma) in enumerate(zip(schedule.timesteps, schedule.sigmas, strict=True)):
            video = torch.cat([*done, x], dim=2)
            mask = _mask(c + 1, k, window)
            flow = _masked_forward(transformer, video, text, [0.0] * c + [t], k, mask)[:, :, -k:]
            x0 = (x.double() - sigma * flow.double()).float()
            if i + 1 < len(schedule):
                noise = torch.randn(1, 16, k, 4, 4, generator=generator)
                x = (1 - schedule.sigmas[i + 1]) * x0 + schedule.sigmas[i + 1] * noise
        done.append(x0)
    return torch.cat(done, dim=2)


@pytest.fixture
def cache_free():
    """:func:`cache_free_sampler` (a fixture, as test modules are imported by path)."""
    return cache_free_sampler


@pytest.fixture
def masked_forward():
    """``_masked_forward(transformer, video, text, per_chunk, k, mask)``: diffusers' stock
    processors on the whole video under a token mask (the cache-free side of every oracle)."""
    return _masked_forward
