"""The pre-RoPE cache layout's one model-facing piece: how a model rotates a chunk's keys.

    rope = KeyRope("interleaved", table)           # table(position) -> (cos, sin), each [L, D]
    cache = ChunkKVCache(spec, window, rope=rope)  # keys committed un-rotated, at a position
    cache.commit(k_pre, v, position=frame)         # k_pre [B, Hkv, L, D] before RoPE
    cache.attend(q, k_cur, v_cur, scale)           # cached keys rotated at their positions
    cache.attend(..., positions={0: 12})           # chunk 0 (a sink) read as if at frame 12

A *position* is whatever the model's table takes (jbkv's adapters: the chunk's first latent
frame); the cache rotates each chunk on read at the position it was committed with, or at the
one ``positions`` gives for that chunk (by commit index) in this read — what a model that
re-places its sink every step (Rolling Forcing) needs. With ``sinks_only`` only the sink chunks
are kept before RoPE: the cache rotates every other chunk at commit, before its method stores
it, so those are quantized post-RoPE (Rolling Forcing's own layout: TencentARC/RollingForcing
@a1477d09, ``wan/modules/causal_model.py`` caches the first block un-rotated, later blocks
rotated) and only sinks can be re-placed on read. Tables are the model's own (the same
values its RoPE uses), applied by :func:`~jbkv_cli.attention.rope.rotate_pairs`, and memoized
per position (at most :data:`MEMO` of them).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from jbkv_cli.attention.rope import PAIRS, KeyRotation, pair_table, rotate_pairs

Table = Callable[[int], tuple[torch.Tensor, torch.Tensor]]
MEMO = 32
"""Positions whose tables are kept (least recently used dropped): more than one read uses (a
Wan window of 21 frame-wise chunks and a sink), few enough that a long rollout's re-placed sinks
(a new position every step) do not pile up tables on the device; a table dropped and needed
again is recomputed, the same values."""


@dataclass
class KeyRope:
    """A model's key rotation: its ``pairs`` layout (``interleaved``, ``half``) and ``table``,
    which gives the per-channel ``(cos, sin)`` ``[L, D]`` of a chunk at a position;
    ``sinks_only``: keep only sink chunks before RoPE (module docstring)."""

    pairs: str
    table: Table
    sinks_only: bool = False
    _memo: OrderedDict = field(default_factory=OrderedDict, repr=False)

    def __post_init__(self) -> None:
        if self.pairs not in PAIRS:
            raise ValueError(f"pairs must be one of {PAIRS}, got {self.pairs!r}")

    def tables(self, position: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``(cos, sin)`` ``[L, D]`` of a chunk at ``position`` (memoized)."""
        if position in self._memo:
            self._memo.move_to_end(position)
            return self._memo[position]
        cos, sin = self.table(position)
        if cos.ndim != 2 or cos.shape != sin.shape:
            raise ValueError(f"a RoPE table must be (cos, sin) [L, D], got {tuple(cos.shape)}")
        self._memo[position] = (cos, sin)
        if len(self._memo) > MEMO:
            self._memo.popitem(last=False)
        return cos, sin

    def rotate(self, x: torch.Tensor, position: int) -> torch.Tensor:
        """``x [..., L, D]`` (one chunk's keys) rotated as at ``position``."""
        cos, sin = self.tables(position)
        if cos.shape != x.shape[-2:]:
            raise ValueError(
                f"the RoPE table at {position} is {tuple(cos.shape)}, the keys {tuple(x.shape)}"
            )
        return rotate_pairs(x, cos.to(x.device), sin.to(x.device), self.pairs)

    def rotation(
        self, positions: Sequence[int | None], lengths: Sequence[int], dim: int
    ) -> KeyRotation:
        """What chunks of ``lengths`` tokens (head dim ``dim``) read at ``positions`` (in order)
        were rotated by after quantization, for the correction; a position None: stored
        post-RoPE (the identity)."""
        real = [self.tables(p) for p in positions if p is not None]
        device = real[0][0].device if real else torch.device("cpu")
        tables, found = [], iter(real)
        for p, n in zip(positions, lengths, strict=True):
            identity = (torch.ones(n, dim, device=device), torch.zeros(n, dim, device=device))
            tables.append(identity if p is None else next(found))
        cos, sin = zip(*tables, strict=True)
        return KeyRotation(
            pair_table(torch.cat(cos), self.pairs).float(),
            pair_table(torch.cat(sin), self.pairs).float(),
            self.pairs,
        )
