"""Rolling Forcing's schedule as pure functions: which blocks each window holds, at which noise
levels, and which part of the cache each forward reads.

Facts from TencentARC/RollingForcing @a1477d09:

* ``pipeline/rolling_forcing_inference.py`` (``inference_rolling_forcing``): with N denoising
  steps the rolling window holds N blocks; window ``w`` (``0 ≤ w < B + N − 1`` for B blocks)
  spans blocks ``max(0, w − N + 1) … min(B − 1, w)``; block ``b`` in window ``w`` is at step
  ``w − b`` of the list (0: pure noise at t = 1000; N − 1: the cleanest, t = 200 warped to
  ``shared_timestep``'s first slot), so every block is denoised once per window, one step each,
  and leaves the window after its last step. After each window the window's first block
  (its x₀) is re-run at ``context_noise`` = 0 with ``updating_cache=True``: only that block's
  K/V are kept in the clean cache;
* ``wan/modules/causal_model.py`` (``CausalWanSelfAttention``): blocks of 3 frames
  (``block_length``), a buffer of 24 frames (``kv_cache_size = 1560 * 24`` in the pipeline:
  the sink block plus the 7 newest blocks), at most 21 frames attended
  (``max_attention_size``). The first block (the *sink*) is cached un-rotated. A window read
  (not ``updating_cache``) takes the sink, the newest ``21 − Q − 3`` frames of clean blocks
  before the window (Q: the window's frames) and the window itself (all of it: no mask inside
  the window), with the sink rotated at frame ``start − W − 3`` (W: the clean frames read): it
  sits just before them. A window starting at block 0 reads no cache. The clean pass of block
  ``b`` reads the newest 21 frames of the buffer up to and including itself: blocks
  ``max(0, b − 6) … b`` — the sink (at its own frame 0) only while ``b ≤ 6``.

Upstream writes every window's first block into the cache (noisy, then its clean pass): blocks
committed before their last step (windows 0 … N − 2 rewrite block 0) are never read, so jbkv
commits a block once, after its last step — and not the last block, which nothing reads.
"""

from __future__ import annotations

from dataclasses import dataclass

ATTENTION_FRAMES = 21  # max_attention_size = 21 * frame_length
BUFFER_FRAMES = 24  # kv_cache_size = 1560 * 24
BLOCK_FRAMES = 3  # block_length = 3 * frame_length
SINK_BLOCKS = 1  # sink_tokens = 1 * block_length


@dataclass(frozen=True)
class Window:
    """One window: blocks ``start … end`` (inclusive); block ``b`` at step ``index - b``."""

    index: int
    start: int
    end: int

    @property
    def blocks(self) -> range:
        return range(self.start, self.end + 1)

    def step(self, block: int) -> int:
        """The step of the list ``block`` takes in this window (0: pure noise)."""
        return self.index - block


def windows(num_blocks: int, steps: int) -> list[Window]:
    """The ``num_blocks + steps − 1`` windows of upstream's loop, in order."""
    if num_blocks < 1 or steps < 1:
        raise ValueError(f"need >= 1 block and step, got {num_blocks}, {steps}")
    return [
        Window(w, max(0, w - steps + 1), min(num_blocks - 1, w))
        for w in range(num_blocks + steps - 1)
    ]


def attention_blocks(block_frames: int = BLOCK_FRAMES) -> int:
    """Blocks in the 21-frame attention span (7 for 3-frame blocks)."""
    return ATTENTION_FRAMES // block_frames


def cache_window(block_frames: int = BLOCK_FRAMES) -> int:
    """Regular (non-sink) blocks the 24-frame buffer holds besides the sink: 7."""
    return BUFFER_FRAMES // block_frames - SINK_BLOCKS


def window_read(window: Window, block_frames: int = BLOCK_FRAMES) -> tuple[int, int] | None:
    """``(clean blocks read, the sink's frame)`` for a window's forward, or None (a window at
    block 0 reads no cache). The clean blocks are the newest before the window: at most
    ``7 − blocks − 1`` of them (``21 − Q − 3`` frames), at most those committed and held."""
    if window.start == 0:
        return None
    held = min(window.start - SINK_BLOCKS, cache_window(block_frames))
    room = attention_blocks(block_frames) - len(window.blocks) - SINK_BLOCKS
    clean = max(0, min(room, held))
    return clean, (window.start - clean - SINK_BLOCKS) * block_frames


def clean_read(block: int, block_frames: int = BLOCK_FRAMES) -> tuple[int | None, bool]:
    """``(last, sinks)`` of block ``block``'s clean pass: blocks ``max(0, block − 6) … block``,
    so all it holds while the sink is within 21 frames, else the newest 6 and no sink."""
    span = attention_blocks(block_frames)
    if block + 1 <= span:
        return None, True
    return span - 1, False
