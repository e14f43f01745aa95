"""What a KV-cache compression method is (kvpress-style: one small frozen dataclass each).

A method owns its name, its validation, its label and variant id, ``quantize(x, role)`` (keys and
values may be stored differently, as KIVI does) and what the correction needs: the returned
:class:`~jbkv_cli.quant.tensor.QuantizedTensor` carries its stored tensors (the storage reports
count their bytes) and its noise steps. Subclass :class:`KVMethod`, set ``name``, implement
``_quantize``, and add one line to :mod:`jbkv_cli.quant.registry`; see README, "Add your own
method".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any, ClassVar, Literal

import torch

from jbkv_cli.quant.groupwise import check_group_size
from jbkv_cli.quant.queries import QueryStats
from jbkv_cli.quant.tensor import ASSUMED, QuantizedTensor

Role = Literal["key", "value"]
ROLES: tuple[Role, ...] = ("key", "value")


def check_tensor(x: torch.Tensor, name: str = "x") -> None:
    """Raise ``ValueError`` unless ``x`` is a finite floating tensor with at least 2 dims."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        kind = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name} must be a floating-point tensor, got {kind}")
    if x.ndim < 2:
        raise ValueError(f"{name} must have shape [..., L, D], got {tuple(x.shape)}")
    if not bool(torch.isfinite(x).all()):
        raise ValueError(f"{name} contains NaN or inf values")


@dataclass(frozen=True)
class KVMethod:
    """Base of compression methods: ``bits`` per code and a ``group_size`` (channels, or tokens,
    per scale: each method says which in its docstring).

    Class attributes a subclass sets: ``name`` (registry and CLI name, file-safe),
    ``SUPPORTED_BITS``, ``summary`` (one line for help texts and the README), and
    ``needs_queries`` for a method whose ``_quantize(x, role, queries)`` takes the
    :class:`~jbkv_cli.quant.queries.QueryStats` of the queries attended with so far, and
    ``noise_model``, how its stored keys relate to the true ones (:mod:`jbkv_cli.quant.noise`;
    the key tensor it returns declares the same next to its ``step``; a method that does not say
    gets ``additive (assumed)``).
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    SUPPORTED_BITS: ClassVar[tuple[int, ...]] = (2, 3, 4, 8)
    needs_queries: ClassVar[bool] = False
    noise_model: ClassVar[str] = ASSUMED

    bits: int = 2
    group_size: int = 32

    def __post_init__(self) -> None:
        if self.bits not in self.SUPPORTED_BITS:
            raise ValueError(
                f"{self.name} supports bits {', '.join(map(str, self.SUPPORTED_BITS))}, "
                f"got {self.bits}"
            )
        if self.group_size < 1:
            raise ValueError(f"group_size must be positive, got {self.group_size}")

    # --- what subclasses provide -----------------------------------------------------------

    def _quantize(self, x: torch.Tensor, role: Role) -> QuantizedTensor:
        raise NotImplementedError

    def check(self, head_dim: int) -> None:
        """Raise ``ValueError`` if the method cannot store heads of ``head_dim`` channels."""
        check_group_size(head_dim, self.group_size)

    def step_groups(self, head_dim: int, role: Role = "key") -> int:
        """``G``, the step columns per token of this method's noise model."""
        return head_dim // self.group_size

    def residual_tokens(self, role: Role = "key") -> int:
        """The newest cached tokens kept in full precision (KIVI's residual); 0 for most."""
        return 0

    # --- shared -----------------------------------------------------------------------------

    def quantize(
        self, x: torch.Tensor, role: Role = "key", queries: QueryStats | None = None
    ) -> QuantizedTensor:
        """Store ``x [..., L, D]`` (post-RoPE keys or values of finished chunks). ``queries``:
        the history of queries, for a method that ``needs_queries`` (others ignore it; None or
        empty means no query has been attended with yet)."""
        if role not in ROLES:
            raise ValueError(f"role must be 'key' or 'value', got {role!r}")
        check_tensor(x)
        self.check(x.shape[-1])
        if not self.needs_queries:
            return self._quantize(x, role)
        queries = queries or QueryStats()
        queries.check(x)
        return self._quantize(x, role, queries)  # type: ignore[call-arg]

    def options(self) -> dict[str, Any]:
        """Parameters beyond ``bits`` and ``group_size`` (for ids and labels)."""
        return {k: v for k, v in asdict(self).items() if k not in ("bits", "group_size")}

    def extra_id(self) -> list[str]:
        """Variant-id parts for non-default options (default: none)."""
        return []

    @property
    def label(self) -> str:
        """e.g. ``INT2 rtn g32``."""
        return " ".join([f"INT{self.bits}", self.name, f"g{self.group_size}", *self.extra_id()])

    @property
    def variant_id(self) -> str:
        """A file-safe id that determines the method, e.g. ``int2-rtn-g32``."""
        return "-".join([f"int{self.bits}", self.name, f"g{self.group_size}", *self.extra_id()])

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **asdict(self)}
