"""Wan's rotary embedding as jbkv's caches need it: interleaved pairs, the table shifted to a
chunk's absolute frame offset (diffusers restarts frames at 0 in every forward), and the
:class:`~jbkv_cli.kvcache.rope.KeyRope` of caches that hold keys before RoPE."""

from __future__ import annotations

from typing import Any

import torch

from jbkv_cli.attention.rope import rotate_pairs
from jbkv_cli.kvcache.rope import KeyRope


def rotate_interleaved(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Apply RoPE on interleaved channel pairs ``(2i, 2i+1)``, Wan's layout.

    For each pair ``(x₀, x₁)`` with angle θ (``cos``/``sin`` repeat each value twice along D):
    ``(x₀ cos θ − x₁ sin θ, x₀ sin θ + x₁ cos θ)``, i.e. ``x cos + rot(x) sin`` with
    ``rot(x) = (−x₁, x₀)``. Computed in the table's dtype, returned in ``x``'s.

    Shapes: ``x`` ``[B, L, H, D]``; ``cos``, ``sin`` ``[1, L, 1, D]``.
    """
    return rotate_pairs(x, cos, sin, "interleaved")


def shifted_rotary(rope: torch.nn.Module, hidden_states: torch.Tensor, frame_offset: int):
    """The RoPE table of ``hidden_states`` ``[B, C, F, H, W]`` with frames starting at
    ``frame_offset`` instead of 0: rows of the table for frames ``[offset, offset + F)``.

    Frames are the outermost token axis, so these are the last ``F·H'·W'`` rows of the table
    diffusers builds for ``offset + F`` frames (built from a shape-only meta tensor).
    """
    b, c, f, h, w = hidden_states.shape
    p_t = rope.patch_size[0]
    frames = frame_offset + f // p_t
    if frames > rope.max_seq_len:
        raise ValueError(
            f"latent frame {frames - 1} is past the rotary table ({rope.max_seq_len} frames, "
            "rope_max_seq_len); generate fewer chunks"
        )
    shape_only = torch.empty((b, c, frames * p_t, h, w), device="meta")
    cos, sin = rope.forward(shape_only)
    tokens = (f // p_t) * (h // rope.patch_size[1]) * (w // rope.patch_size[2])
    return cos[:, -tokens:], sin[:, -tokens:]


def wan_key_rope(transformer: Any, latents: torch.Tensor) -> KeyRope:
    """The :class:`KeyRope` of a Wan-family ``transformer`` for chunks shaped like ``latents``
    ``[B, C, F, H, W]``: interleaved pairs; the table at position ``p`` is the rope module's for
    frames ``[p, p + F)`` (:func:`shifted_rotary`), as ``[L, D]``, a copy of those rows: the
    memo keeps ``[L, D]`` per position, not the ``(p + F)``-frame table they were cut from."""
    shape = torch.empty(latents.shape, device="meta")

    def table(position: int) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = shifted_rotary(transformer.rope, shape, position)
        return cos[0, :, 0].clone(), sin[0, :, 0].clone()

    return KeyRope("interleaved", table)


def wan_phase_rope(transformer: Any, latents: torch.Tensor) -> KeyRope:
    """:func:`wan_key_rope` for a temporal shift only (a re-phased sink): one token per frame,
    at spatial position 0, so the table at ``p`` is ``[F, D]`` and its first row the rotation by
    ``p`` frames that every token of a frame shares (the spatial pairs' angles are 0 there)."""
    _, ph, pw = transformer.rope.patch_size
    return wan_key_rope(transformer, torch.empty(*latents.shape[:3], ph, pw, device="meta"))
