"""Spans: finished chunks compressed together, as QuantVideoGen's integrations do.

A method's :class:`~jbkv_cli.quant.policy.SpanPolicy` (``span_chunks`` N, ``keep_recent_chunks``
R, ``sink_keep_chunks``) tells :class:`~jbkv_cli.kvcache.ChunkKVCache` when to compress:

- a chunk to be compressed by a span waits in full precision (and counts as such);
- when the ``((k+1)N + R)``-th chunk is committed, span ``k`` (chunks ``[kN, (k+1)N)`` by
  commit index) is due: its chunks still held and waiting (:func:`span_members`) are stored by
  one ``quantize`` call over their tokens (one codebook), sink chunks and later chunks
  separately (upstream splits a span at the sink boundary);
- a compressed span is held whole (:class:`Span`, its bytes counted once) while any of its
  chunks is in the window: upstream's ``evict_range`` drops a span only when all of it left.

Each chunk of a span reads its tokens through a :class:`SpanSlice`. Upstream's rules and lines:
:mod:`jbkv_cli.quant.qvg_policy`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch

from jbkv_cli.quant.policy import SpanPolicy
from jbkv_cli.quant.tensor import QuantizedTensor


def span_members(
    policy: SpanPolicy, span: int, waiting: Iterable[int], sink_chunks: int
) -> list[list[int]]:
    """The groups of chunk commit indices (``serials``) that span ``span`` stores: those of
    ``waiting`` (held, not yet compressed) in ``[span·N, (span+1)·N)``, the sink chunks (below
    ``sink_chunks``) and the others in separate groups, each ascending; empty groups left out."""
    n = policy.span_chunks
    inside = sorted(s for s in waiting if span * n <= s < (span + 1) * n)
    groups = [[s for s in inside if s < sink_chunks], [s for s in inside if s >= sink_chunks]]
    return [g for g in groups if g]


@dataclass
class Span:
    """One compressed span of one role: ``tensor`` over the tokens of the chunks ``serials``
    (``lengths`` tokens each, in order). ``nbytes`` is what it holds, whoever reads it."""

    tensor: QuantizedTensor
    serials: tuple[int, ...]
    lengths: tuple[int, ...]
    _scratch: torch.Tensor | None = field(default=None, repr=False)

    @property
    def nbytes(self) -> int:
        return self.tensor.nbytes

    def offset(self, serial: int) -> int:
        i = self.serials.index(serial)
        return sum(self.lengths[:i])

    def dequantized(self) -> torch.Tensor:
        """The span's dequantized tokens, kept until :meth:`release` (one read dequantizes a
        span once, however many of its chunks it reads)."""
        if self._scratch is None:
            self._scratch = self.tensor.dequantize()
        return self._scratch

    def release(self) -> None:
        self._scratch = None


@dataclass
class SpanSlice(QuantizedTensor):
    """Chunk ``serial``'s tokens of a :class:`Span`: read through the span, storing nothing
    itself (the cache counts the span once)."""

    span: Span
    serial: int

    def __post_init__(self) -> None:
        t = self.span.tensor
        self.length = self.span.lengths[self.span.serials.index(self.serial)]
        self.start = self.span.offset(self.serial)
        self.shape = torch.Size((*t.shape[:-2], self.length, t.shape[-1]))
        self.dtype, self.rotation = t.dtype, t.rotation
        self.noise_model = t.noise_model

    def _tokens(self, x: torch.Tensor | None) -> torch.Tensor | None:
        """This chunk's rows ``[..., length, ·]`` of a per-token tensor of the span."""
        return None if x is None else x[..., self.start : self.start + self.length, :]

    def stored(self) -> dict[str, torch.Tensor]:
        return {}

    def dequantize(self) -> torch.Tensor:
        return self.span.dequantized()[..., self.start : self.start + self.length, :]

    @property
    def step(self) -> torch.Tensor | None:
        return self._tokens(self.span.tensor.step)

    @property
    def steps_fp8(self) -> bool:
        return self.span.tensor.steps_fp8

    @property
    def noise_step2(self) -> torch.Tensor | None:
        """The span's noise model (the signed correction's ``w``; QVG's κ is measured over the
        whole span at compression) on this chunk's tokens."""
        return self._tokens(self.span.tensor.noise_step2)

    @property
    def excess_step2(self) -> torch.Tensor | None:
        return self._tokens(self.span.tensor.excess_step2)

    @property
    def unshrink(self) -> torch.Tensor | None:
        return self._tokens(self.span.tensor.unshrink)


def held_spans(slices: Sequence[QuantizedTensor]) -> list[Span]:
    """The distinct spans these stored tensors read from (by identity, in order)."""
    out: dict[int, Span] = {}
    for t in slices:
        if isinstance(t, SpanSlice):
            out.setdefault(id(t.span), t.span)
    return list(out.values())
