"""How much of what a variant's caches held was stored compressed: measured, and predicted.

A variant's label says "INT2 qvg", but its cache policy may keep chunks exact (a span that never
fills, a residual window that covers the whole cache, a keep-recent guard that evicts chunks
before they are compressed), and a pruner may never drop a token. This module states how much
compression really happened, so no row reads as a method that did nothing.

**Measured** (:func:`counting`; ``quantize-eval`` and ``generate`` run each video under it).
After every commit each :class:`~jbkv_cli.kvcache.ChunkKVCache` whose variant compresses (a
method stores a side, or a pruner prunes) adds what it holds at that moment, in *token-rows*
(one token of one batch row and KV head, for each side a method stores):

    held        rows of the sides a method stores (sinks, exact tails and chunks waiting for
                their span included)
    compressed  of those, rows stored by the method (codes, a span's codebook), not raw
    unpruned    rows the held pruned chunks had before pruning (per token and KV head)
    kept        of those, the rows the pruner kept

summed over layers, caches and commits (a video's record holds the sums), so

    compressed share = Σ compressed / Σ held     (0: the method compressed nothing, a no-op)
    pruned share     = 1 − Σ kept / Σ unpruned   (0: the pruner dropped nothing, a no-op)

**Predicted** (:func:`predict`): the compressed share the cache policy gives from token counts
alone (commits, window, tokens per commit, sink chunks), the cache's rules restated on integers:
no tensors, so a command can warn before it generates anything. It is exact where the counts are
(the tests hold it to the measurement) and an upper bound where a count is an upper bound.
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any

from jbkv_cli.kvcache.spans import span_members
from jbkv_cli.quant.method import KVMethod

FIELDS = ("held", "compressed", "unpruned", "kept")


@dataclass
class Coverage:
    """Token-rows held and stored compressed (and, pruning, before and after pruning)."""

    held: int = 0
    compressed: int = 0
    unpruned: int = 0
    kept: int = 0

    def add(self, other: Coverage) -> None:
        for name in FIELDS:
            setattr(self, name, getattr(self, name) + getattr(other, name))

    @property
    def empty(self) -> bool:
        return not (self.held or self.unpruned)

    def to_dict(self) -> dict[str, int]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Any) -> Coverage | None:
        """A record's ``compression`` (None when absent or malformed)."""
        if not isinstance(data, dict):
            return None
        values = [data.get(k, 0) for k in FIELDS]
        if not all(type(v) is int and v >= 0 for v in values):
            return None
        return cls(*values)


def compressed_share(held: int, compressed: int) -> float | None:
    """``compressed / held``; None when nothing was held."""
    return compressed / held if held else None


def pruned_share(unpruned: int, kept: int) -> float | None:
    """``1 − kept / unpruned``; None without pruned rows."""
    return 1 - kept / unpruned if unpruned else None


_METER: contextvars.ContextVar[Coverage | None] = contextvars.ContextVar(
    "jbkv_coverage", default=None
)


@contextlib.contextmanager
def counting() -> Iterator[Coverage]:
    """``with counting() as cov:`` every commit of a compressing cache inside the block adds
    what the cache holds after it to ``cov``."""
    cov = Coverage()
    token = _METER.set(cov)
    try:
        yield cov
    finally:
        _METER.reset(token)


def active() -> Coverage | None:
    return _METER.get()


# --- prediction --------------------------------------------------------------------------------


@dataclass
class _Held:
    serial: int
    sink: bool
    length: int
    exact: int  # tokens still exact
    waiting: bool = False  # exact until its span is due


def predict(
    method: KVMethod,
    commits: int,
    window: int | None,
    tokens: int | None,
    sink_chunks: int = 0,
) -> float | None:
    """The compressed share (module docstring) of a cache storing ``method`` over ``commits``
    commits of ``tokens`` tokens each, keeping ``window`` finished chunks (None: all) and
    ``sink_chunks`` sinks; None when it cannot be told (nothing held, or a residual with the
    token count unknown). The cache's rules (:class:`~jbkv_cli.kvcache.ChunkKVCache`): a kept
    sink stays exact; a span waits until it is due, then its held chunks are compressed; a
    residual keeps the newest ``R`` regular tokens exact (sinks with a residual stay exact);
    eviction after compression."""
    policy, residual = method.cache_policy(), method.residual_tokens("key")
    if residual and tokens is None:
        return None
    length = tokens or 1
    held: list[_Held] = []
    total = stored = 0
    for serial in range(commits):
        sink = serial < sink_chunks
        chunk = _Held(serial, sink, length, length)
        if not (sink and policy.keeps_sink(serial)) and not (residual and sink):
            chunk.waiting = not policy.per_chunk
            chunk.exact = length if chunk.waiting or residual else 0
        held.append(chunk)
        due = policy.due(serial + 1)
        if due is not None:
            waiting = {c.serial: c for c in held if c.waiting}
            for group in span_members(policy, due, waiting, sink_chunks):
                for s in group:
                    waiting[s].waiting, waiting[s].exact = False, 0
        budget = residual
        for c in reversed([c for c in held if not c.sink] if residual else []):
            c.exact, budget = min(c.exact, budget), max(0, budget - c.length)
        regular = [c for c in held if not c.sink]
        if window is not None and len(regular) > window:
            gone = {id(c) for c in regular[: len(regular) - window]}
            held = [c for c in held if id(c) not in gone]
        total += sum(c.length for c in held)
        stored += sum(c.length - c.exact for c in held)
    return compressed_share(total, stored)


def noop_reason(
    method: KVMethod, commits: int, window: int | None, tokens: int | None, sink_chunks: int = 0
) -> str | None:
    """Why ``method`` will compress nothing in this geometry (:func:`predict` is 0), or None
    when it compresses something or that cannot be told."""
    if predict(method, commits, window, tokens, sink_chunks) != 0:
        return None
    policy, residual = method.cache_policy(), method.residual_tokens("key")
    first = policy.span_chunks + policy.keep_recent_chunks
    if commits < first:
        return (
            f"its first span of {policy.span_chunks} chunk(s) is compressed at commit {first}, "
            f"the video commits at most {commits}"
        )
    if residual:
        held = "every chunk" if window is None else f"the {window} finished chunk(s)"
        return f"its {residual}-token exact residual covers {held} it holds ({tokens} tokens each)"
    if sink_chunks >= commits:
        return f"every one of its {commits} commit(s) is a sink chunk kept exact"
    return (
        f"its chunks leave the {window}-chunk window before they are compressed "
        f"(keep-recent {policy.keep_recent_chunks})"
    )
