"""Which finished chunks a method stores compressed, and when: its cache policy.

Most methods compress every finished chunk at its commit, alone. QuantVideoGen's integrations
(``svg-project/Quant-VideoGen``) decide more (:mod:`jbkv_cli.quant.qvg`): chunks are
compressed together in *spans* of ``span_chunks`` (one codebook per span), a span only once it
is full and ``keep_recent_chunks`` newer chunks exist, and the first ``sink_keep_chunks``
attention-sink chunks never. :class:`~jbkv_cli.kvcache.ChunkKVCache` carries a policy out
(:mod:`jbkv_cli.kvcache.spans`); a method states it with ``KVMethod.cache_policy()``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class SpanPolicy:
    """``span_chunks`` N: chunks ``[kN, (k+1)N)`` (by commit index) are compressed together,
    once ``(k+1)N + keep_recent_chunks`` chunks are committed; until then they stay exact.
    ``sink_keep_chunks``: of the attention-sink chunks (``KVSpec.sink_chunks``), the first this
    many stay exact and the others are compressed as spans of their own (sink and later chunks
    never share a span); None keeps every sink chunk exact (jbkv's rule for every method)."""

    span_chunks: int = 1
    keep_recent_chunks: int = 0
    sink_keep_chunks: int | None = None

    def __post_init__(self) -> None:
        if self.span_chunks < 1 or self.keep_recent_chunks < 0:
            raise ValueError(f"a span policy needs span_chunks >= 1 and keep_recent >= 0: {self}")
        if self.sink_keep_chunks is not None and self.sink_keep_chunks < 0:
            raise ValueError(f"sink_keep_chunks must be >= 0 or None, got {self.sink_keep_chunks}")

    @property
    def per_chunk(self) -> bool:
        """Every finished chunk is compressed at its own commit, alone (most methods)."""
        return self.span_chunks == 1 and self.keep_recent_chunks == 0

    def due(self, committed: int) -> int | None:
        """The span index that becomes due when the ``committed``-th chunk has been committed
        (None: none does): ``k`` with ``(k+1)N + keep_recent = committed``."""
        ready = committed - self.keep_recent_chunks
        if ready < self.span_chunks or ready % self.span_chunks:
            return None
        return ready // self.span_chunks - 1

    def keeps_sink(self, serial: int) -> bool:
        """Whether sink chunk ``serial`` (commit index) stays exact for good."""
        return self.sink_keep_chunks is None or serial < self.sink_keep_chunks


PER_CHUNK = SpanPolicy()
