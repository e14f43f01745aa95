"""What a KV-cache compression method is (kvpress-style: one small frozen dataclass each).

A method owns its name, its validation, its label and variant id, ``quantize(x, role)`` (keys and
values may be stored differently, as KIVI does) and what the correction needs: the returned
:class:`~jbkv_cli.quant.tensor.QuantizedTensor` carries its stored tensors (the storage reports
count their bytes) and its noise steps. Subclass :class:`KVMethod`, set ``name``, implement
``_quantize``, and add one line to :mod:`jbkv_cli.quant.registry`; see README, "Add your own
method".
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any, ClassVar, Literal

import torch

from jbkv_cli.quant.groupwise import check_group_size
from jbkv_cli.quant.policy import PER_CHUNK, SpanPolicy
from jbkv_cli.quant.queries import QueryStats
from jbkv_cli.quant.tensor import ASSUMED, QuantizedTensor
from jbkv_cli.utils.fields import check_fields, option
from jbkv_cli.utils.host_reads import require

Role = Literal["key", "value"]
MAX_GROUP_SIZE = 4096
ROLES: tuple[Role, ...] = ("key", "value")


def check_tensor(x: torch.Tensor, name: str = "x") -> None:
    """Raise ``ValueError`` unless ``x`` is a finite floating tensor with at least 2 dims (the
    finite check without a host sync off the CPU: :mod:`jbkv_cli.utils.host_reads`)."""
    if not isinstance(x, torch.Tensor) or not x.is_floating_point():
        kind = x.dtype if isinstance(x, torch.Tensor) else type(x).__name__
        raise ValueError(f"{name} must be a floating-point tensor, got {kind}")
    if x.ndim < 2:
        raise ValueError(f"{name} must have shape [..., L, D], got {tuple(x.shape)}")
    require(torch.isfinite(x).all(), f"{name} contains NaN or inf values")


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

    Every field is declared with :func:`~jbkv_cli.utils.fields.option` (type and bounds, in one
    place); ``__post_init__`` validates them and stores canonical values, so ``-M`` values,
    ``variant.json`` and Python callers all go through one validator. ``UNUSED_OPTIONS`` names
    fields a subclass ignores (an ablation): they are reset to their defaults, so one behaviour
    has one stored spec and one variant id (``-M`` refuses them).
    """

    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    SUPPORTED_BITS: ClassVar[tuple[int, ...]] = (2, 3, 4, 8)
    needs_queries: ClassVar[bool] = False
    noise_model: ClassVar[str] = ASSUMED
    UNUSED_OPTIONS: ClassVar[tuple[str, ...]] = ()

    bits: int = option(2, "int", lo=1, hi=8, cli=False)  # 1: where SUPPORTED_BITS has it
    group_size: int = option(32, "int", lo=1, hi=MAX_GROUP_SIZE, cli=False)

    def __post_init__(self) -> None:
        check_fields(self, self.name)
        defaults = {f.name: f.default for f in fields(self)}
        for name in self.UNUSED_OPTIONS:  # canonical: one behaviour, one spec, one variant id
            object.__setattr__(self, name, defaults[name])
        if self.bits not in self.SUPPORTED_BITS:
            raise ValueError(
                f"{self.name} supports bits {', '.join(map(str, self.SUPPORTED_BITS))}, "
                f"got {self.bits}"
            )

    @classmethod
    def default_group_size(cls) -> int:
        """The group size the method's source runs, its ``group_size`` field's default (32;
        QVG and QuantWM 64): what a command uses when the user gives none."""
        return next(f.default for f in fields(cls) if f.name == "group_size")

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

    def storage_note(self, tokens: int) -> str:
        """What a result row should say about how chunks of ``tokens`` tokens are stored
        (e.g. a capped codebook); "" for nothing."""
        return ""

    def cache_policy(self) -> SpanPolicy:
        """Which finished chunks the cache compresses together, and when
        (:mod:`jbkv_cli.quant.policy`); every chunk at its commit, alone, for most."""
        return PER_CHUNK

    def key_layout(self) -> str:
        """``post-rope`` (keys cached rotated, most) or ``pre-rope`` (cached before RoPE and
        rotated on read, :mod:`jbkv_cli.attention.rope`)."""
        return "post-rope"

    def without_pre_rope(self) -> KVMethod | None:
        """This method with its keys cached after RoPE, for a model whose cache cannot hold them
        before: itself when it caches them after RoPE anyway, None when pre-RoPE keys were asked
        for; a method whose layout is left to the model (KVQuant's default) says how."""
        return self if self.key_layout() == "post-rope" else None

    def for_model(
        self, model: str, chunk_tokens: int | None = None, *, pruned: bool = False
    ) -> KVMethod:
        """This method with the options left to the model filled in as its source runs them
        on ``model`` (``chunk_tokens`` per chunk when known; ``pruned``: the cache prunes);
        itself for most methods."""
        return self

    def at_layer(self, layer: int) -> KVMethod:
        """This method as attention layer ``layer``'s cache runs it (a method with per-layer
        tables, a KVQuant calibration, binds them); itself for most methods."""
        return self

    def table_nbytes(self, role: Role) -> int:
        """Bytes of fixed tables a layer's cache holds once for ``role``, whatever it stores (a
        KVQuant calibration's thresholds and codebook); 0 for most."""
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
