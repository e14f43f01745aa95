"""The chunk-wise sampling loop: pipelined Euler integration with CFG and a KV cache.

Follows upstream ``SampleTransport`` / ``VideoDiTModel.forward_dispatcher``:

* **1-CFG** (distilled models): one forward with the text caption; its refresh chunk is
  committed. When the oldest denoising chunk is nearly clean (``t > 0.3``) it is also run
  alone (appended as an extra chunk that sees only itself) and its velocity becomes
  ``0.7 · v_context + 0.3 · v_alone``.
* **3-CFG** (base models): (a) context + text, (b) context + null caption (this pass commits the
  refresh chunk), (c) each chunk alone with the null caption at positions of chunk 0, no cache;
  ``v = (1 - p)·v_c + (p - s)·v_b + s·v_a`` with ``(p, s)`` from the chunk's time bucket.

The refresh chunk's caption is the null caption; its time is ``clean_t``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch

from jbkv_cli.models.magi1.config import ScheduleConfig
from jbkv_cli.models.magi1.dit import AttendFn, VideoDiT, plain_attend
from jbkv_cli.models.magi1.schedule import (
    ForwardPlan,
    cfg_scales,
    distill_dt,
    init_interval,
    init_t,
)
from jbkv_cli.utils.host_reads import device_values, prefetch_values


@dataclass
class TextCondition:
    """Per-chunk captions for one video: ``cond``/``null`` ``[N, L, C]`` and masks ``[N, L]``."""

    cond: torch.Tensor
    cond_mask: torch.Tensor
    null: torch.Tensor
    null_mask: torch.Tensor

    def to(self, device: torch.device | str) -> TextCondition:
        """The captions on ``device``; the masks stay where they are (on the host, where the
        DiT reads which tokens are valid without a sync: :meth:`VideoDiT.embed_captions`)."""
        cond, null = self.cond.to(device), self.null.to(device)
        return TextCondition(cond, self.cond_mask, null, self.null_mask)


@dataclass
class SampleResult:
    latents: torch.Tensor  # [1, C, T, H, W], float32, clean
    forwards: int
    # the caches' peak bytes (jbkv_cli.models.loop), set by the model that owns the caches
    peak_cache_bytes: int = 0
    # a pruned cache's bytes at the peak, per class of KV head
    peak_bytes_by_kind: dict[str, int] = field(default_factory=dict)


def _captions(text: TextCondition, chunks: Sequence[int], null: bool, refresh: bool):
    src, mask = (text.null, text.null_mask) if null else (text.cond, text.cond_mask)
    ys, ms = [src[c] for c in chunks], [mask[c] for c in chunks]
    if refresh:
        ys, ms = [text.null[0], *ys], [text.null_mask[0], *ms]
    return torch.stack(ys)[None], torch.stack(ms)[None]


class Sampler:
    """Runs a :class:`VideoDiT` over a forward plan (see :mod:`.schedule`)."""

    def __init__(
        self,
        dit: VideoDiT,
        sched: ScheduleConfig,
        *,
        attend: AttendFn = plain_attend,
        nearly_clean_refine: bool = True,
    ) -> None:
        self.dit = dit
        self.sched = sched
        self.attend = attend
        self.nearly_clean_refine = nearly_clean_refine
        self.ts = init_t(sched.num_steps, sched.shift, sched.shortcut_mode)
        self.intervals = init_interval(sched.num_steps, sched.shortcut_mode)

    def _times(self, plan: ForwardPlan) -> torch.Tensor:
        """The times of the plan's chunks (float32, on the host), the refresh chunk's
        ``clean_t`` first when it has one."""
        t_den = self.ts[list(plan.t_index)].to(torch.float32)
        if not plan.refresh:
            return t_den
        return torch.cat([torch.tensor([self.sched.clean_t]), t_den])

    def _steps(self, plan: ForwardPlan) -> torch.Tensor:
        """The Euler step ``t_{i+1} − t_i`` of each of the plan's denoising chunks (host)."""
        return self.ts[[i + 1 for i in plan.t_index]] - self.ts[list(plan.t_index)]

    def _dt(self, plan: ForwardPlan) -> float | None:
        if not self.dit.cfg.distill:
            return None
        return distill_dt(self.sched.num_steps, float(self.intervals[plan.denoise_idx]))

    @torch.no_grad()
    def velocity(
        self, x: torch.Tensor, plan: ForwardPlan, text: TextCondition, caches: Sequence | None
    ) -> torch.Tensor:
        """Velocity of the plan's denoising chunks ``[1, C, (c1-c0)·cw, H, W]`` (float32)."""
        sched, cw = self.sched, self.sched.chunk_width
        c0, c1 = plan.chunk_start, plan.chunk_end
        chunks = list(range(c0, c1))
        xs = x[:, :, (plan.slice_point) * cw : c1 * cw]
        t_host = self._times(plan)
        t = device_values(t_host[None], x.device)  # read on the host, copied once
        n_ref = int(plan.refresh)
        t_den = t_host[n_ref:]
        common = dict(slice_point=plan.slice_point, caches=caches, attend=self.attend)
        common["distill_dt"] = self._dt(plan)

        if sched.cfg_number == 1:
            y, m = _captions(text, chunks, null=False, refresh=plan.refresh)
            kv = list(plan.kv_chunks)
            refine = self.nearly_clean_refine and float(t_host[n_ref]) > (
                sched.distill_nearly_clean_chunk_threshold
            )
            if refine:
                xs = torch.cat([xs, xs[:, :, n_ref * cw : (n_ref + 1) * cw]], dim=2)
                t = torch.cat([t, t[:, n_ref : n_ref + 1]], dim=1)
                y = torch.cat([y, y[:, n_ref : n_ref + 1]], dim=1)
                m = torch.cat([m, m[:, n_ref : n_ref + 1]], dim=1)
                kv.append(1)
            out = self.dit(
                xs,
                t,
                y,
                m,
                caption_dropped=False,
                kv_chunks=kv,
                commit_first=plan.refresh,
                **common,
            )
            if refine:
                alone = out[:, :, -cw:]
                out = out[:, :, :-cw].clone()
                ctx = out[:, :, n_ref * cw : (n_ref + 1) * cw]
                s = sched.prev_chunks_scale
                out[:, :, n_ref * cw : (n_ref + 1) * cw] = ctx * s + alone * (1 - s)
            return out[:, :, n_ref * cw :]

        if sched.cfg_number != 3:
            raise ValueError(f"cfg_number must be 1 or 3, got {sched.cfg_number}")
        kv = list(plan.kv_chunks)
        y, m = _captions(text, chunks, null=False, refresh=plan.refresh)
        out_text = self.dit(xs, t, y, m, caption_dropped=False, kv_chunks=kv, **common)
        y, m = _captions(text, chunks, null=True, refresh=plan.refresh)
        out_null = self.dit(
            xs, t, y, m, caption_dropped=True, kv_chunks=kv, commit_first=plan.refresh, **common
        )
        n = len(chunks)
        xb = xs[:, :, n_ref * cw :].reshape(1, xs.shape[1], n, cw, *xs.shape[3:])
        xb = xb.permute(2, 1, 0, 3, 4, 5).flatten(2, 3)  # [n, C, cw, H, W]
        yb = text.null[chunks][:, None]
        mb = text.null_mask[chunks][:, None]
        out_unc = self.dit(
            xb,
            t[0, n_ref:, None],
            yb,
            mb,
            caption_dropped=True,
            slice_point=0,
            kv_chunks=[1],
            caches=None,
            attend=self.attend,
            distill_dt=common["distill_dt"],
        )
        out_unc = out_unc.permute(1, 0, 2, 3, 4).reshape(1, out_unc.shape[1], n * cw, *xs.shape[3:])
        parts = []
        for i in range(n):
            p, s = cfg_scales(float(t_den[i]), sched)
            sl = slice((n_ref + i) * cw, (n_ref + i + 1) * cw)
            u = out_unc[:, :, i * cw : (i + 1) * cw]
            parts.append((1 - p) * u + (p - s) * out_null[:, :, sl] + s * out_text[:, :, sl])
        return torch.cat(parts, dim=2)

    @torch.no_grad()
    def sample(
        self,
        noise: torch.Tensor,
        plans: Sequence[ForwardPlan],
        text: TextCondition,
        caches: Sequence | None,
        *,
        on_chunk: Callable[[int], None] | None = None,
        on_plan: Callable[[ForwardPlan], None] | None = None,
        after_plan: Callable[[ForwardPlan], None] | None = None,
    ) -> SampleResult:
        """Integrate ``noise [1, C, N·cw, H, W]`` to clean latents along ``plans``
        (``on_plan`` is told each plan before its forward, ``after_plan`` after it and its
        Euler step, ``on_chunk`` each chunk that has taken all its steps)."""
        sched, cw = self.sched, self.sched.chunk_width
        x = noise.float().clone()
        counts = [0] * (x.shape[2] // cw)
        # the pipeline's fill and drain take times its steady state does not repeat: every
        # plan's are copied to the device together, before the first forward
        prefetch_values([self._times(p)[None] for p in plans], x.device)
        prefetch_values([self._steps(p) for p in plans], x.device)
        for plan in plans:
            if on_plan is not None:
                on_plan(plan)
            v = self.velocity(x, plan, text, caches)
            c0, c1 = plan.chunk_start, plan.chunk_end
            dt = device_values(self._steps(plan), x.device).repeat_interleave(cw)
            x[:, :, c0 * cw : c1 * cw] += v * dt[None, None, :, None, None]
            for c in range(c0, c1):
                counts[c] += 1
            if after_plan is not None:
                after_plan(plan)
            if counts[c0] == sched.num_steps and on_chunk is not None:
                on_chunk(c0)
        return SampleResult(latents=x, forwards=len(plans))
