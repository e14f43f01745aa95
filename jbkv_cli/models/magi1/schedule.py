"""MAGI-1's pipelined chunk schedule: which chunks each forward sees, at which time, with
which attention range, and when a finished chunk is refreshed into the KV cache.

Time runs from ``t = 0`` (noise) to ``t = 1`` (clean). With ``num_steps`` steps and a window
of ``W`` chunks, a *stage* is ``d = num_steps / W`` steps; during a stage every chunk in the
window advances by one stage, the oldest chunk finishes at the stage's end and the next stage
starts one chunk later. A stage is ``d`` forwards; forward ``k`` is step ``k mod d`` of stage
``k // d``.

Each forward lists its chunks oldest first. Chunk ``j`` of a forward whose first chunk is the
absolute chunk ``s`` (the *slice point*) attends to chunks ``[s + j + 1 - r_j, s + j + 1)``
(block-causal), with ``r_j`` picked from ``noise2clean_kvrange`` by the chunk's own progress
(its stage), or ``clean_chunk_kvrange`` for the refresh pass. Chunks below ``s`` come from the
KV cache; the others are computed in the forward itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from jbkv_cli.models.magi1.config import ScheduleConfig


def generate_sequences(
    chunk_num: int, window_size: int, chunk_offset: int = 0
) -> tuple[list[int], list[int], list[int], list[int]]:
    """Per stage: the window ``[clip_start, clip_end)`` of chunks and ``[t_start, t_end)`` of stages.

    Stage ``i`` (counted from ``chunk_offset``) holds chunks ``max(offset, i - W + 1) ..
    min(N, i + 1)``; chunk ``clip_start + m`` of the window is at stage ``t_end - 1 - m``.
    """
    stages = range(chunk_offset, chunk_num + window_size - 1)
    clip_start = [max(chunk_offset, i - window_size + 1) for i in stages]
    clip_end = [min(chunk_num, i + 1) for i in stages]
    t_start = [max(0, i - chunk_num + 1) for i in stages]
    t_end = [min(window_size, i - chunk_offset + 1) for i in stages]
    return clip_start, clip_end, t_start, t_end


def init_t(num_steps: int, shift: float = 3.0, shortcut_mode: str = "8,16,16") -> torch.Tensor:
    """The ``num_steps + 1`` time points (float32): ``u ↦ σ(u²)``, ``σ(x) = x / (s - (s-1) x)``.

    ``u`` is uniform on ``[0, 1]`` (12 steps: upstream's shortcut grid of 4 stages x 3 steps).
    ``σ`` is the SD3 resolution shift with ``s = shift`` written for the 0 = noise convention.
    """
    if num_steps == 12:
        base = torch.linspace(0, 1, 5) / 4
        base = base[:3] if shortcut_mode == "16,16,8" else torch.cat([base[:1], base[2:4]])
        u = torch.cat([base + acc for acc in torch.linspace(0, 1, 5)])[: num_steps + 1]
    else:
        u = torch.linspace(0, 1, num_steps + 1)
    x = u**2
    inv = 1.0 / shift
    return inv * x / (1 + (inv - 1) * x)


def init_interval(num_steps: int, shortcut_mode: str = "8,16,16") -> torch.Tensor:
    """Relative step sizes of the distilled shortcut model (only 12-step schedules vary)."""
    if num_steps % 3 == 0:
        pattern = [1, 1, 2] if shortcut_mode == "16,16,8" else [2, 1, 1]
        return torch.tensor(pattern * (num_steps // 3), dtype=torch.float32)
    return torch.ones(num_steps)


def distill_dt(num_steps: int, interval: float) -> float:
    """The step-size value the distilled model's timestep embedder also sees.

    ``2 · num_steps / 4`` (8 at 16 steps), or ``2 · 4 / interval`` for the 12-step grid.
    """
    if num_steps == 12:
        return 4.0 / float(interval) * 2.0
    return num_steps / 4 * 2.0


@dataclass(frozen=True)
class ForwardPlan:
    """One model forward of the pipelined schedule.

    Attributes:
        index: forward number (0-based); ``stage``, ``denoise_idx``: its stage and step in it.
        chunk_start, chunk_end: the denoising window (absolute chunk indices, end exclusive).
        t_start, t_end: stage range of the window (upstream's ``generate_sequences``).
        refresh: the just-finished chunk ``chunk_start - 1`` is prepended at ``clean_t``
            (its keys/values are what the cache stores).
        slice_point: absolute index of the forward's first chunk.
        chunk_steps: denoising step of each forward chunk (``num_steps`` for the refresh chunk).
        t_index: index into ``init_t`` of each *denoising* chunk (oldest first).
        kv_chunks: attention range in chunks of each forward chunk (``r_j``).
    """

    index: int
    stage: int
    denoise_idx: int
    chunk_start: int
    chunk_end: int
    t_start: int
    t_end: int
    refresh: bool
    slice_point: int
    chunk_steps: tuple[int, ...]
    t_index: tuple[int, ...]
    kv_chunks: tuple[int, ...]

    @property
    def num_forward_chunks(self) -> int:
        return len(self.chunk_steps)

    def kv_range(self, j: int) -> tuple[int, int]:
        """Absolute chunk range ``[start, end)`` forward chunk ``j`` attends to."""
        end = self.slice_point + j + 1
        return max(0, end - self.kv_chunks[j]), end

    def num_cached(self, j: int) -> int:
        """How many of chunk ``j``'s key chunks come from the cache (lie below the slice point)."""
        start, _ = self.kv_range(j)
        return max(0, self.slice_point - start)

    def first_current(self, j: int) -> int:
        """Local index of the first in-forward chunk that chunk ``j`` attends to."""
        start, _ = self.kv_range(j)
        return max(start, self.slice_point) - self.slice_point


def stage_kv_chunks(step: int, sched: ScheduleConfig) -> int:
    """Attention range ``r`` (chunks) of a chunk at denoising step ``step``.

    ``step == num_steps`` marks the refresh pass (``clean_chunk_kvrange``).
    """
    ranges = sched.noise2clean_kvrange
    if step == sched.num_steps:
        r = sched.clean_chunk_kvrange if sched.clean_chunk_kvrange != -1 else ranges[-1]
    else:
        r = ranges[step // (sched.num_steps // len(ranges))]
    return r


def validate(sched: ScheduleConfig) -> None:
    """Raise ``ValueError`` when the step count does not split into stages and kv-range stages."""
    if sched.num_steps % sched.window_size:
        raise ValueError(
            f"steps ({sched.num_steps}) must be a multiple of window_size ({sched.window_size})"
        )
    if sched.noise2clean_kvrange and sched.num_steps % len(sched.noise2clean_kvrange):
        raise ValueError(
            f"steps ({sched.num_steps}) must be a multiple of the number of kv-range stages "
            f"({len(sched.noise2clean_kvrange)})"
        )


def _cap(r: int, j: int, max_cached: int | None) -> int:
    """Shorten chunk ``j``'s range so it reads at most ``max_cached`` chunks from the cache."""
    return r if max_cached is None else min(r, j + 1 + max_cached)


def plan_forwards(
    num_chunks: int,
    sched: ScheduleConfig,
    *,
    chunk_offset: int = 0,
    max_cached: int | None = None,
) -> list[ForwardPlan]:
    """All forwards of one video, in order (upstream ``SampleTransport.forward_velocity``).

    ``max_cached`` (the cache window) caps how many cached chunks a chunk reads; the
    in-forward part of its range is unchanged.
    """
    validate(sched)
    per_stage = sched.num_steps // sched.window_size
    starts, ends, t_starts, t_ends = generate_sequences(num_chunks, sched.window_size, chunk_offset)
    plans = []
    for k in range(per_stage * len(starts)):
        stage, idx = divmod(k, per_stage)
        c0, c1, ts, te = starts[stage], ends[stage], t_starts[stage], t_ends[stage]
        refresh = c0 > chunk_offset and idx == 0
        steps = [i * per_stage + idx for i in reversed(range(ts, te))]
        if refresh:
            steps = [sched.num_steps, *steps]
        plans.append(
            ForwardPlan(
                index=k,
                stage=stage,
                denoise_idx=idx,
                chunk_start=c0,
                chunk_end=c1,
                t_start=ts,
                t_end=te,
                refresh=refresh,
                slice_point=c0 - 1 if refresh else c0,
                chunk_steps=tuple(steps),
                t_index=tuple(i * per_stage + idx for i in reversed(range(ts, te))),
                kv_chunks=tuple(
                    _cap(stage_kv_chunks(s, sched), j, max_cached) for j, s in enumerate(steps)
                ),
            )
        )
    return plans


def required_window(num_chunks: int, sched: ScheduleConfig) -> int:
    """Most cached chunks any forward reads (the cache capacity that changes nothing), >= 1.

    With ``noise2clean_kvrange = 5,4,3,2`` and a window of 4 this is 1: the range shrinks by
    one chunk exactly as a chunk's position in the window grows, so in steady state every
    denoising chunk reads just the last finished chunk from the cache.
    """
    plans = plan_forwards(num_chunks, sched)
    need = [p.num_cached(j) for p in plans for j in range(p.num_forward_chunks)]
    return max([1, *need])


def cfg_scales(t: float, sched: ScheduleConfig) -> tuple[float, float]:
    """``(prev_chunk_scale, text_scale)`` for a chunk at time ``t`` (3-CFG, base models).

    The bucket is the last ``cfg_t_range`` edge at or below ``t`` (edges shifted by 1e-7).
    """
    edges = torch.tensor(sched.cfg_t_range, dtype=torch.float32) - 1e-7
    i = int(torch.searchsorted(edges, torch.tensor(float(t), dtype=torch.float32))) - 1
    if not 0 <= i < len(sched.prev_chunk_scales):
        raise ValueError(f"t={t} lies outside cfg_t_range {sched.cfg_t_range}")
    return sched.prev_chunk_scales[i], sched.text_scales[i]
