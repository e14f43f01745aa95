"""``HYWorldPlay``: HY-WorldPlay (WorldPlay-8B) behind jbkv's video-model protocol.

A case is an image, a prompt and a camera trajectory (:mod:`.trajectory`; a case without one
takes ``pose``, by default ``w-{latents - 1}``). Its memory index lists are the case's plan
(:meth:`HYWorldPlay.plan_case`), computed once per (case, trajectory) and kept in the run's
manifest, so every variant of a case reads the same memory latents. The initial noise is drawn
on the CPU from ``noise_generator(seed, case.name)``: the same for every variant.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import torch

from jbkv_cli.attention.diagnostics import AttentionObserver
from jbkv_cli.kvcache import KVSpec
from jbkv_cli.metrics.chunks import causal_vae_chunks
from jbkv_cli.models.base import ProgressFn, Video
from jbkv_cli.models.cases import Case
from jbkv_cli.models.contract import VideoModelBase
from jbkv_cli.models.hy_worldplay.config import DiTConfig, Schedule
from jbkv_cli.models.hy_worldplay.dit import WorldPlayDiT
from jbkv_cli.models.hy_worldplay.encoders import Encoders, image_condition
from jbkv_cli.models.hy_worldplay.retrieval import memory_plan, points_seed, sample_points
from jbkv_cli.models.hy_worldplay.sampler import Conditions, rollout
from jbkv_cli.models.hy_worldplay.trajectory import (
    Trajectory,
    default_pose,
    load_trajectory,
    trajectory_digest,
)
from jbkv_cli.models.hy_worldplay.vae import decode_frames, encode_image
from jbkv_cli.models.precision import UPSTREAM, Precision
from jbkv_cli.models.seeding import noise_generator
from jbkv_cli.models.wan.self_forcing.image import read_image
from jbkv_cli.utils.errors import UsageError, shown


@dataclass(frozen=True)
class Settings:
    config: str
    height: int
    width: int
    num_chunks: int
    device: str
    dtype: torch.dtype
    offload: bool
    quantize_text: bool
    pose: str | None
    attention_backend: str | None
    precision: str = UPSTREAM  # 16-bit casting of the sampler (jbkv_cli.models.precision)

    def latents(self, schedule: Schedule) -> int:
        return self.num_chunks * schedule.chunk_latents

    def frames(self, schedule: Schedule) -> int:
        return schedule.temporal_compression * (self.latents(schedule) - 1) + 1


def trajectory_of(case: Case, latents: int, pose: str | None) -> tuple[str, Trajectory]:
    """The case's trajectory spec (its own, else ``pose``, else straight forward) and the
    trajectory, checked against ``latents``."""
    spec = case.trajectory or pose or default_pose(latents)
    return spec, load_trajectory(spec, latents)


class HYWorldPlay(VideoModelBase):
    """Image + prompt + camera trajectory -> video, the memory in jbkv's caches."""

    name = "hy-worldplay"

    def __init__(
        self,
        dit: WorldPlayDiT,
        vae: Any,
        encoders: Encoders,
        settings: Settings,
        schedule: Schedule,
    ) -> None:
        self.dit = dit.eval()
        self.vae = vae.eval()
        self.encoders = encoders
        self.gen = settings
        self.schedule = schedule
        self._conditions: OrderedDict[str, Conditions] = OrderedDict()
        cfg: DiTConfig = dit.cfg
        s = settings
        self.settings: dict[str, Any] = {
            "config": s.config,
            "steps": schedule.steps,
            "shift": schedule.shift,
            "num_chunks": s.num_chunks,
            "chunk_latents": schedule.chunk_latents,
            "latents": s.latents(schedule),
            "frames": s.frames(schedule),
            "chunk_frames": schedule.chunk_latents * schedule.temporal_compression,
            "height": s.height,
            "width": s.width,
            "fps": schedule.fps,
            "memory_frames": schedule.memory_frames,
            "temporal_context": schedule.temporal_context,
            "memory_timestep": schedule.memory_timestep,
            "quantize_text": s.quantize_text,
            "pose": s.pose or default_pose(s.latents(schedule)),
            "dtype": str(s.dtype).replace("torch.", ""),
            "device": s.device,
            "attention_backend": s.attention_backend or "fused",
            "precision": s.precision,
            "head_dim": cfg.head_dim,
        }

    # ------------------------------------------------------------------ per case

    def plan_case(self, case: Case) -> dict[str, Any]:
        """The memory latents of every chunk (:func:`~.retrieval.memory_plan`), from points
        seeded by the trajectory's cameras; JSON for the run's manifest."""
        latents = self.gen.latents(self.schedule)
        spec, traj = trajectory_of(case, latents, self.gen.pose)
        digest = trajectory_digest(traj)
        seed = points_seed(digest)
        s = self.schedule
        plan = memory_plan(
            traj.w2c, sample_points(seed), s.chunk_latents, s.memory_frames, s.temporal_context
        )
        return {"trajectory": spec, "cameras_sha256": digest, "points_seed": seed, "memory": plan}

    def _place(self, modules, on: bool) -> None:
        if self.gen.offload:
            for m in modules:
                m.to(self.gen.device if on else "cpu")

    def conditions(self, case: Case) -> Conditions:
        """Text tokens, condition latents, trajectory and memory plan of ``case`` (kept for the
        last few cases on the CPU: every variant of a case reuses them)."""
        key = repr(case.to_dict())
        if key in self._conditions:
            self._conditions.move_to_end(key)
            return self._conditions[key]
        if case.image is None:
            raise UsageError(f"case {shown(case.name)}: hy-worldplay needs an image")
        gen, sched, dev = self.gen, self.schedule, self.gen.device
        latents = gen.latents(sched)
        plan = case.plan if case.plan is not None else self.plan_case(case)
        spec, traj = trajectory_of(case, latents, gen.pose)
        if plan.get("trajectory") != spec or plan.get("cameras_sha256") != trajectory_digest(traj):
            raise UsageError(
                f"case {shown(case.name)}: its kept memory plan is for another trajectory"
            )
        image = read_image(case.image, case.name)
        self._place(self.encoders.modules(), True)
        try:
            qwen, byt5 = self.encoders.encode_prompt(case.prompt)
            vision = self.encoders.encode_image(image)
        finally:
            self._place(self.encoders.modules(), False)
        self._place([self.vae], True)
        try:
            z0 = encode_image(self.vae, image_condition(image, gen.width, gen.height))
        finally:
            self._place([self.vae], False)
        c_lat = self.dit.cfg.in_channels
        h, w = gen.height // sched.spatial_compression, gen.width // sched.spatial_compression
        cond = torch.zeros(1, c_lat + 1, latents, h, w)
        cond[:, :c_lat, 0] = z0[:, :, 0].cpu()
        cond[:, c_lat, 0] = 1.0
        self._place([self.dit], True)
        try:
            txt, vec_txt = self.dit.embed_text(qwen.to(dev), byt5.to(dev), vision.to(dev))
        finally:
            self._place([self.dit], False)
        out = Conditions(txt.cpu(), vec_txt.cpu(), cond, traj, [list(p) for p in plan["memory"]])
        self._conditions[key] = out
        while len(self._conditions) > 2:
            self._conditions.popitem(last=False)
        return out

    def noise(self, case: Case, seed: int) -> torch.Tensor:
        """float32 ``[1, C, T, h, w]``, from ``noise_generator(seed, case.name)`` on the CPU."""
        gen, sched = self.gen, self.schedule
        shape = (
            1,
            self.dit.cfg.in_channels,
            gen.latents(sched),
            gen.height // sched.spatial_compression,
            gen.width // sched.spatial_compression,
        )
        return torch.randn(shape, generator=noise_generator(seed, case.name))

    # ------------------------------------------------------------------ generation

    def sample_latents(
        self,
        case: Case | str,
        seed: int,
        kv: KVSpec,
        *,
        progress: ProgressFn | None = None,
        observer: AttentionObserver | None = None,
        uncached: bool = False,
        on_step: Any = None,
    ) -> tuple[torch.Tensor, dict[str, Any], Conditions]:
        case = Case.of(case)
        cond = self.conditions(case)
        gen = self.gen
        dev = gen.device
        on_device = Conditions(
            cond.txt.to(dev), cond.vec_txt.to(dev), cond.cond.to(dev), cond.trajectory, cond.plan
        )
        self._place([self.dit], True)
        try:
            latents, info = rollout(
                self.dit,
                on_device,
                self.noise(case, seed).to(dev),
                self.schedule,
                kv,
                quantize_text=self.gen.quantize_text,
                observer=observer,
                backend=self.gen.attention_backend,
                progress=progress,
                uncached=uncached,
                on_step=on_step,
                latent_dtype=Precision(gen.precision, gen.dtype).latents,
            )
        finally:
            self._place([self.dit], False)
        return latents, info, cond

    @torch.no_grad()
    def generate(
        self,
        case: Case | str,
        seed: int,
        kv: KVSpec,
        *,
        progress: ProgressFn | None = None,
        observer: AttentionObserver | None = None,
    ) -> Video:
        """One video of ``frames`` frames; the same noise and memory lists for every ``kv``."""
        latents, info, cond = self.sample_latents(
            case, seed, kv, progress=progress, observer=observer
        )
        self._place([self.vae], True)
        try:
            frames = decode_frames(self.vae, latents.float())
        finally:
            self._place([self.vae], False)
        info = {
            "kv": kv.label,
            "steps": self.schedule.steps,
            "dtype": self.settings["dtype"],
            "num_chunks": self.gen.num_chunks,
            **causal_vae_chunks(self.schedule.chunk_latents, self.schedule.temporal_compression),
            "memory": cond.plan,
            **info,
        }
        return Video(frames, float(self.schedule.fps), int(info["kv_cache_bytes"]), info)
