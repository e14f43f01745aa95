"""How a 16-bit run casts: as its upstream code does, or with float32 accumulation.

``-o precision=upstream`` (the default) follows each upstream's casting in the model dtype, so
a BF16 reference is the video its authors' code would give; ``-o precision=fp32-accum`` keeps
the more precise variant jbkv ran before (norms, modulation and residual adds in float32 where
diffusers keeps them so; the sampler's latents in float32 between steps). What each rule means
per model is in ``docs/models.md`` (section "Precision" of each model). In float32 both are
the same run: the option only changes 16-bit models.

:class:`Precision` is the policy a model reads: whether upstream's rules apply (:attr:`upstream`:
the ``upstream`` choice on a 16-bit model) and the dtype its sampler keeps latents in
(:attr:`latents`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from jbkv_cli.utils.errors import UsageError
from jbkv_cli.utils.fields import Spec

UPSTREAM = "upstream"
FP32_ACCUM = "fp32-accum"
PRECISIONS = (UPSTREAM, FP32_ACCUM)
PRECISION = Spec("str", choices=PRECISIONS)


@dataclass(frozen=True)
class Precision:
    """The casting policy ``name`` (:data:`PRECISIONS`) of a model in ``dtype``."""

    name: str = UPSTREAM
    dtype: torch.dtype = torch.float32

    def __post_init__(self) -> None:
        if self.name not in PRECISIONS:
            raise UsageError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.name!r}")

    @property
    def upstream(self) -> bool:
        """Upstream's casting rules apply: the ``upstream`` choice on a 16-bit model."""
        return self.name == UPSTREAM and self.dtype != torch.float32

    @property
    def latents(self) -> torch.dtype:
        """The dtype the sampler keeps latents in between steps: the model's under upstream's
        rules (the 16-bit noise, x₀ and re-noised latents), else float32."""
        return self.dtype if self.upstream else torch.float32
