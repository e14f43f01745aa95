"""QuaRot-style keys: a seeded randomized Hadamard rotation, then RTN in the rotated basis.

``x ↦ R x`` with ``R = H_b · diag(s) / √b`` per block of ``b`` channels (default: the head dim;
:mod:`jbkv_cli.quant.rotation`), then :class:`~jbkv_cli.quant.rtn.RTN` (covering grid) on
``R x``. ``R`` is orthogonal, so attention is unchanged, and outlier channels are spread over
their block. The stored noise lives in the rotated basis, so the correction uses ``R q``; the
rotation travels with the stored tensor and :meth:`dequantize` rotates back.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import ClassVar

import torch

from jbkv_cli.quant.method import MAX_GROUP_SIZE, Role
from jbkv_cli.quant.rotation import RandomHadamard
from jbkv_cli.quant.rtn import RTN, store_groups
from jbkv_cli.quant.tensor import GroupQuantized
from jbkv_cli.utils.fields import MAX_SEED, option


@dataclass(frozen=True)
class QuaRot(RTN):
    """``seed`` of the random signs; ``block_size`` of the Hadamard blocks (None: head dim)."""

    name: ClassVar[str] = "quarot"
    summary: ClassVar[str] = "seeded randomized Hadamard rotation, then RTN (covering grid)"

    seed: int = option(0, "int", lo=0, hi=MAX_SEED)
    block_size: int | None = option(
        None, "int", lo=2, hi=MAX_GROUP_SIZE, power_of_two=True, optional=True
    )

    def check(self, head_dim: int) -> None:
        super().check(head_dim)
        self.rotation(head_dim)  # raises on a block size that does not fit

    def rotation(self, head_dim: int) -> RandomHadamard:
        return _hadamard(head_dim, self.block_size, self.seed)

    def _quantize(self, x: torch.Tensor, role: Role) -> GroupQuantized:
        return store_groups(x, self.bits, self.group_size, self.grid, self.rotation(x.shape[-1]))

    def extra_id(self) -> list[str]:
        parts = [f"rs{self.seed}"] if self.seed else []
        return parts + ([f"rb{self.block_size}"] if self.block_size else [])


@functools.lru_cache(maxsize=64)
def _hadamard(dim: int, block_size: int | None, seed: int) -> RandomHadamard:
    return RandomHadamard(dim, block_size, seed)
