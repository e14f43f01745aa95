"""The model-adapter protocol every video model implements, and what it returns."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import torch

from jbkv_cli.attention.diagnostics import AttentionObserver
from jbkv_cli.kvcache.layers import HeadLayout
from jbkv_cli.kvcache.spec import KVSpec
from jbkv_cli.models.cases import Case
from jbkv_cli.utils.errors import UsageError, shown

ProgressFn = Callable[[int, int], None]
"""Called as ``progress(done_chunks, total_chunks)`` after each finished chunk."""


@dataclass
class Video:
    """A generated video: ``frames`` is uint8 ``[T, H, W, 3]`` RGB on the CPU."""

    frames: torch.Tensor
    fps: float
    kv_cache_bytes: int = 0  # peak bytes the KV cache held (all layers), measured from tensors
    info: dict[str, Any] = field(default_factory=dict)  # model-specific facts (dtype, steps, ...)

    def __post_init__(self) -> None:
        f = self.frames
        if f.dtype != torch.uint8 or f.ndim != 4 or f.shape[-1] != 3:
            raise ValueError(f"frames must be uint8 [T, H, W, 3], got {f.dtype} {tuple(f.shape)}")


@runtime_checkable
class VideoModel(Protocol):
    """A chunk-wise AR video model behind jbkv's KV cache.

    ``settings`` holds the generation settings the model was built with (num_chunks, steps,
    window, size, dtype, ...): plain JSON-able values, recorded in the run manifest so a run
    directory knows exactly what produced it.
    """

    name: str
    settings: dict[str, Any]

    def generate(
        self,
        case: Case | str,
        seed: int,
        kv: KVSpec,
        *,
        progress: ProgressFn | None = None,
        observer: AttentionObserver | None = None,
    ) -> Video:
        """Generate one video of ``case`` (:class:`~jbkv_cli.models.cases.Case`; a string is a
        prompt-only case). Same (case, seed, settings) => same initial noise for any ``kv``.

        A text-only model reads ``text_case(case, self.name).prompt`` (:func:`text_case`
        refuses an image or a trajectory). ``observer`` (diagnostics) is handed to every
        layer's cache."""
        ...


@runtime_checkable
class CasePlanner(Protocol):
    """A model that computes something once per case which every variant must share (e.g.
    HY-WorldPlay's memory index lists): the run keeps it in its manifest (computed on first
    registration, reused on resume) and hands it back as ``case.plan``."""

    def plan_case(self, case: Case) -> Any:
        """A JSON-able plan for ``case`` (deterministic)."""
        ...


def text_case(case: Case | str, model: str) -> Case:
    """``case`` as a case a text-only ``model`` can generate: its prompt (and id) alone.
    An image or a trajectory is a :class:`~jbkv_cli.utils.errors.UsageError` naming the model."""
    case = Case.of(case)
    extra = [what for what, v in (("an image", case.image), ("a trajectory", case.trajectory)) if v]
    if extra:
        raise UsageError(
            f"model {model!r} takes a prompt only; case {shown(case.name)} has "
            + " and ".join(extra)
        )
    return case


@runtime_checkable
class PrunableModel(VideoModel, Protocol):
    """A :class:`VideoModel` that KV-cache pruners (Forcing-KV) and ``jbkv profile-heads`` can
    run on: it states its head layout and profiles heads through its own chunk loop."""

    def head_layout(self) -> HeadLayout:
        """Attention layers, KV heads per layer and tokens per latent frame (its caches are
        built from this with :func:`~jbkv_cli.kvcache.layer_caches`)."""
        ...

    def profile_heads(self, prompt: str, seed: int, probe: Any) -> None:
        """Generate ``prompt`` with the full-precision cache while ``probe`` (a
        :class:`~jbkv_cli.prune.profile.FrameMassProbe`) wraps the caches and is told the chunk
        and denoising step before each forward."""
        ...


def resolve_spec(model: VideoModel, spec: KVSpec) -> KVSpec:
    """``spec`` as ``model`` runs it: the model's ``resolve_kv`` (its chunk size known), else
    :meth:`KVSpec.for_model` by name — each method's options left to the model filled in
    (QuantVideoGen's cache policy and K rule, :mod:`jbkv_cli.quant.qvg_policy`). Pre-RoPE keys
    on a model that cannot cache them (no ``pre_rope = True``) are a :class:`UsageError`."""
    resolve = getattr(model, "resolve_kv", None)
    spec = resolve(spec) if resolve is not None else spec.for_model(model.name)
    if spec.key_layout == "pre-rope" and not getattr(model, "pre_rope", False):
        raise UsageError(f"{spec.label}: model {model.name} cannot cache keys before RoPE")
    return spec


def resolve_specs(model: VideoModel, specs: list[KVSpec]) -> list[KVSpec]:
    """:func:`resolve_spec` of each, in order, duplicates dropped."""
    return list(dict.fromkeys(resolve_spec(model, s) for s in specs))


def located(paths: Any) -> dict[str, Path]:
    """Field name -> path of a located-weights dataclass (``WeightPaths``), those set: the
    roles a model module's ``input_paths`` returns (:func:`jbkv_cli.models.registry.input_paths`)."""
    return {f.name: Path(p) for f in fields(paths) if (p := getattr(paths, f.name)) is not None}
