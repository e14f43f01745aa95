"""What a KV-cache pruner is (kvpress-style, like the compression methods: one small frozen
dataclass each).

A pruner decides which cached tokens each KV head keeps; the cache stores only those, through
the variant's compression methods (prune, then quantize what is kept), and attention masks the
rest. A pruner owns its name, validation, label and variant-id part, and builds one
:class:`LayerPruning` per attention layer for a model (:meth:`KVPruner.plans`). Subclass
:class:`KVPruner`, set ``name``, implement ``plans``, and add one line to
:mod:`jbkv_cli.prune.registry`.

A layer state that re-scores what the cache already holds (FlowCache) is a
:class:`RescoringPruning`: the cache hands it the queries of every attention call
(:meth:`RescoringPruning.observe`) and, at each commit, every key it holds of earlier pruned
chunks as attention would read them (:class:`HeldKeys`: dequantized, with their steps), so it can
drop tokens it kept before. A plain :class:`LayerPruning` sees only each new chunk's exact keys.

A layer state that decides when a new chunk is first *read* (Deep Forcing: the first denoising
step of a block) is a :class:`ReadPruning`: it keeps each committed chunk whole, sees the queries
of every attention call, and at the first read after each commit may drop held tokens (and
release chunks that hold none any more) before attention reads them; it may also re-phase the
first held keys (its sink) in time (:meth:`ReadPruning.phase`).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar, Protocol, runtime_checkable

import torch

from jbkv_cli.utils.fields import check_fields


class LayerPruning(Protocol):
    """One layer's pruning state, driven by its :class:`~jbkv_cli.kvcache.ChunkKVCache`.

    ``kinds[h]`` names the class of KV head ``h`` (bytes are reported per class).
    """

    kinds: tuple[str, ...]

    def commit(self, serial: int, k: torch.Tensor) -> Decision:
        """Decide on a finished chunk ``serial`` (post-RoPE keys ``[B, Hkv, L, D]``)."""
        ...

    def forget(self, serials: set[int]) -> None:
        """Drop any state about chunks that left the cache."""
        ...

    def nbytes_by_kind(self) -> dict[str, int]:
        """Bytes of state the pruner holds (e.g. descriptors of undecided frames), per class."""
        ...


@dataclass
class HeldKeys:
    """What a cache holds of its earlier pruned chunks (sink chunks left out), oldest first, as
    attention reads it: ``k [B, Hkv, Lh, D]`` the kept keys dequantized at their positions,
    zeros where a token was dropped; ``valid`` bool ``[B, Hkv, Lh]`` the tokens held; ``step``
    ``[B, Hkv, Lh, G]`` float32 the keys' quantization steps (zeros for exact ones; None when
    the cache stores keys exactly) and ``rotation`` the basis their noise lives in.
    ``serials`` and ``lengths``: the chunks laid end to end (``Lh = sum(lengths)``)."""

    serials: tuple[int, ...] = ()
    lengths: tuple[int, ...] = ()
    k: torch.Tensor | None = None
    valid: torch.Tensor | None = None
    step: torch.Tensor | None = None
    rotation: Any = None

    @property
    def tokens(self) -> int:
        """``Lh``: the positions laid out (held or dropped)."""
        return sum(self.lengths)


@dataclass
class Decision:
    """What :meth:`LayerPruning.commit` decided.

    ``keep [B, Hkv, L]``: the new chunk's tokens each KV head stores (undecided tokens, kept for
    now, included): bool, or an unsigned count of the times attention reads the token (0:
    dropped; Forcing-KV's upstream holds some tokens twice). ``settled``: tokens of chunks
    committed earlier that are decided now, as ``(serial, start, keep [B, Hkv, n])`` for
    positions ``start .. start + n`` of that chunk (bool or counts, as ``keep``).

    ``held``: per chunk serial (the new chunk's and each settled chunk's), per KV head, the most
    tokens of that chunk any batch row holds after this decision, known without reading
    ``keep`` (the pruner's own bookkeeping); off the CPU the cache stores each lane at that
    capacity, since the kept count itself is a host read (:mod:`jbkv_cli.kvcache.pruned`). A
    chunk left out: its whole length.
    """

    keep: torch.Tensor
    settled: list[tuple[int, int, torch.Tensor]]
    held: dict[int, tuple[int, ...]] = field(default_factory=dict)
    released: tuple[int, ...] = ()
    """Chunks (serials) of which no token is held any more, known from the pruner's own
    bookkeeping: the cache removes them (no positions laid out for them in later reads)."""


@runtime_checkable
class RescoringPruning(LayerPruning, Protocol):
    """A layer state that decides from recent queries and from every key the cache holds (see
    the module docstring); the cache calls :meth:`rescore` instead of ``commit``."""

    def observe(self, q: torch.Tensor, scale: float) -> None:
        """The queries ``[B, Hq, Lq, D]`` (post-RoPE) of an attention call over this layer's
        cache and the call's softmax scale."""
        ...

    def rescore(self, serial: int, k: torch.Tensor, held: HeldKeys) -> Decision:
        """Decide on chunk ``serial`` (exact post-RoPE keys ``[B, Hkv, L, D]``) and again on
        every token the cache holds of earlier chunks (``held``)."""
        ...


@runtime_checkable
class ReadPruning(LayerPruning, Protocol):
    """A layer state that decides at the first read of each new chunk (see the module
    docstring); its ``commit`` keeps the whole chunk."""

    def observe(self, q: torch.Tensor, scale: float) -> None:
        """The queries ``[B, Hq, Lq, D]`` (post-RoPE) of an attention call, before it reads."""
        ...

    def due(self, tokens: int) -> bool:
        """Whether a new chunk of ``tokens`` calls for a decision (from host-known state)."""
        ...

    def decide(self, held: HeldKeys, tokens: int) -> Decision:
        """Decide again on every token the cache holds (``held``, every chunk) at the first
        read of a new chunk of ``tokens``; ``Decision.keep`` is empty (the new chunk is not
        stored yet)."""
        ...

    def phase(self) -> tuple[int, int]:
        """``(tokens, frames)``: the first ``tokens`` held keys are read as if ``frames`` later
        in time than they were committed (a temporal RoPE shift; ``(0, 0)``: none)."""
        ...


@dataclass(frozen=True)
class KVPruner:
    """Base of pruners. Class attributes a subclass sets: ``name`` (registry and CLI name),
    ``title`` (label part, e.g. ``Forcing-KV``), ``short`` (variant-id part, e.g. ``fkv``) and
    ``summary`` (one line for help texts). Option fields are declared with
    :func:`~jbkv_cli.utils.fields.option` (type and bounds); ``__post_init__`` validates them and
    stores canonical values, as for compression methods."""

    name: ClassVar[str] = ""
    title: ClassVar[str] = ""
    short: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    owns_buffer: ClassVar[bool] = False
    """The pruner bounds the cache itself and keeps, and re-phases, its own sink (Deep
    Forcing): its caches get no window and the model's RoPE table, the model no sink chunks,
    and its keys cannot be stored in a rotated basis."""
    layers_alike: ClassVar[bool] = False
    """Every layer's state is built and decides by the same rule from its own tensors (no
    per-layer profile, nothing shared between layers), so the plan may trace a few blocks and
    extrapolate to the real depth (:mod:`jbkv_cli.plan.run`)."""

    def __post_init__(self) -> None:
        check_fields(self, self.name)

    def plans(self, model: str, layers: int, kv_heads: int, frame_tokens: int) -> list:
        """One :class:`LayerPruning` per layer of ``model`` (``frame_tokens`` tokens per frame)."""
        raise NotImplementedError

    def check(self, model: str) -> None:
        """Raise ``ValueError`` when the pruner cannot run on ``model`` (missing profile, ...)."""

    def check_chunks(self, chunk_frames: int) -> None:
        """Raise ``ValueError`` when the pruner cannot run on chunks of ``chunk_frames`` latent
        frames (default: it can)."""

    def extra_id(self) -> list[str]:
        """Variant-id parts for non-default options (default: none)."""
        return []

    @property
    def label(self) -> str:
        return " ".join([self.title, *self.extra_id()])

    @property
    def variant_id(self) -> str:
        return "-".join([self.short, *self.extra_id()])

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.name, **asdict(self)}
