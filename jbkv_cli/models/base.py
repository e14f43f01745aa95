"""What model adapters build on: the :class:`Video` they return, the progress callback, the
prompt of a text-only case and the roles of located weight files. The contract itself (what an
adapter is, what its module registers) is :mod:`jbkv_cli.models.contract`."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

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


def located(paths: Any) -> dict[str, Path]:
    """Field name -> path of a located-weights dataclass (``WeightPaths``), those set: the
    roles a model module's ``input_paths`` returns (:func:`jbkv_cli.models.registry.input_paths`)."""
    return {f.name: Path(p) for f in fields(paths) if (p := getattr(paths, f.name)) is not None}
