"""The cache bookkeeping every chunk loop shares; the loop's math stays in its model.

A model's chunk loop builds its caches here, reads them through :meth:`LoopCaches.layers`
(wrapped by the head-profiling probe when there is one), and reports to the books at four
moments::

    books = LoopCaches.build(spec, window, model=name, heads=head_layout, chunks=n,
                             observer=observer, rope=rope, probe=probe, progress=progress)
    context = Context(books.layers())
    for c in range(n):
        for i, t in enumerate(steps):
            books.at(c, i)                      # the probe learns chunk and step
            x = denoise(x, t)
        books.measure_views()                   # working bytes (optional)
        with books.commit_pass(c, context):     # probe told (c, None); context.commit on;
            forward(x, t=0)                     # the peak sampled once every layer committed
        books.chunk_done(c + 1)                 # progress(c + 1, n)
    info = books.facts()                        # kv_cache_bytes, its splits, kv_view_bytes

**Peak cache bytes** (``kv_cache_bytes``; ``docs/report.md``, *stored*; ``docs/methods.md``,
*Storage accounting*): the most bytes that all of a loop's caches together — every layer,
every CFG branch, every named part (Matrix-Game-2.0's action caches, HY-WorldPlay's text and
memory) — hold right after a commit pass, over the video. What one cache holds is
:attr:`~jbkv_cli.kvcache.ChunkKVCache.nbytes`: codes, steps, zero points and exact tokens of the
chunks in its window, each held span once, and a pruner's state. It is sampled when
:meth:`LoopCaches.committed` is called: after a pass has committed (and the caches evicted) in
every layer — the only moments what a cache holds changes. The splits are those of that moment
(on a tie, the later one): per class of KV head when a cache prunes (``unpruned`` for the
caches and sink chunks no pruner holds), and per named part.

**Working bytes** (``kv_view_bytes``, loops built with ``views=True``): the most bytes of
dequantized K/V views the caches hold at once (every layer, the last read's view each:
:attr:`~jbkv_cli.kvcache.ChunkKVCache.working_nbytes`), sampled where the loop calls
:meth:`LoopCaches.measure_views` (after a chunk's, or a window's, denoising forwards).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Protocol

from jbkv_cli.attention.diagnostics import AttentionObserver
from jbkv_cli.kvcache import ChunkKVCache, HeadLayout, KeyRope, KVSpec, layer_caches
from jbkv_cli.models.base import ProgressFn

MAIN = "main"  # the part :meth:`LoopCaches.build` names when it builds one stack
UNPRUNED = "unpruned"  # bytes no pruner holds, in the split per class of KV head


class Probe(Protocol):
    """What the loop needs of a head-profiling probe
    (:class:`~jbkv_cli.prune.profile.FrameMassProbe`)."""

    def wrap(self, caches: list) -> list: ...

    def at(self, chunk: int, step: int | None) -> None: ...


def bytes_by_kind(caches: Iterable[ChunkKVCache]) -> dict[str, int]:
    """What the caches hold now per class of KV head of their pruner (its kinds, then
    ``unpruned``: sink chunks, and every byte of a cache that does not prune); empty when no
    cache prunes."""
    caches = list(caches)
    if all(c.pruning is None for c in caches):
        return {}
    out: dict[str, int] = {}
    for cache in caches:
        split = cache.nbytes_by_kind() if cache.pruning is not None else {UNPRUNED: cache.nbytes}
        for kind, held in split.items():
            out[kind] = out.get(kind, 0) + held
    return out


@dataclass
class PeakBytes:
    """The peak cache bytes of the module docstring: ``total``, and at that moment the split
    ``by_kind`` (per class of KV head; empty without a pruner) and ``by_part`` (per part)."""

    total: int = 0
    by_kind: dict[str, int] = field(default_factory=dict)
    by_part: dict[str, int] = field(default_factory=dict)

    def update(self, parts: Mapping[str, Sequence[ChunkKVCache]]) -> None:
        """Sample what ``parts`` hold now; keep it when it is at least the peak so far."""
        by_part = {name: sum(c.nbytes for c in caches) for name, caches in parts.items()}
        held = sum(by_part.values())
        if held >= self.total:
            every = [c for caches in parts.values() for c in caches]
            self.total, self.by_kind, self.by_part = held, bytes_by_kind(every), by_part


class LoopCaches:
    """One chunk loop's caches, by part, and their books (module docstring).

    ``parts``: name -> that part's caches, all counted in the peak; ``chunks``: what progress
    counts to; ``probed``: the parts the probe wraps (default: all); ``views``: the loop
    measures its working bytes (:meth:`measure_views`)."""

    def __init__(
        self,
        parts: Mapping[str, Iterable[ChunkKVCache]],
        chunks: int,
        *,
        probe: Probe | None = None,
        progress: ProgressFn | None = None,
        probed: Sequence[str] | None = None,
        views: bool = False,
    ) -> None:
        self.parts = {name: list(caches) for name, caches in parts.items()}
        self.chunks = chunks
        self.probe = probe
        self.progress = progress
        wrap = set(self.parts if probed is None else probed)
        self._read = {
            name: probe.wrap(caches) if probe is not None and name in wrap else caches
            for name, caches in self.parts.items()
        }
        self.peak = PeakBytes()
        self.views: int | None = 0 if views else None

    @classmethod
    def build(
        cls,
        spec: KVSpec,
        window: int | None,
        *,
        model: str,
        heads: HeadLayout,
        chunks: int,
        observer: AttentionObserver | None = None,
        rope: KeyRope | None = None,
        probe: Probe | None = None,
        progress: ProgressFn | None = None,
        branches: Sequence[str] = (MAIN,),
        views: bool = False,
        phase: KeyRope | None = None,
    ) -> LoopCaches:
        """One stack of layer caches per branch (:func:`~jbkv_cli.kvcache.layer_caches` from
        ``spec`` and the model's head layout; e.g. one per CFG branch), every one probed
        (``phase``: the model's RoPE table for a pruner that re-phases held keys)."""
        parts = {
            name: layer_caches(
                spec, window, model=model, observer=observer, rope=rope, phase=phase, **heads
            )
            for name in branches
        }
        return cls(parts, chunks, probe=probe, progress=progress, views=views)

    # -- reading ------------------------------------------------------------------------------

    def layers(self, part: str = MAIN) -> list:
        """``part``'s caches as the model reads them: wrapped by the probe when profiling."""
        return self._read[part]

    @property
    def caches(self) -> list[ChunkKVCache]:
        """Every cache of every part (unwrapped)."""
        return [c for caches in self.parts.values() for c in caches]

    # -- the four moments ---------------------------------------------------------------------

    def at(self, chunk: int, step: int | None) -> None:
        """Before a forward: the probe (if any) learns its chunk and denoising step (``None``
        for a pass that is no denoising step: not measured)."""
        if self.probe is not None:
            self.probe.at(chunk, step)

    def measure_views(self) -> None:
        """After a read: keep the most view bytes held at once (every layer)."""
        held = sum(c.working_nbytes for c in self.caches)
        self.views = held if self.views is None else max(self.views, held)

    def committed(self) -> None:
        """After a commit pass (every layer committed): sample the peak cache bytes."""
        self.peak.update(self.parts)

    @contextmanager
    def commit_pass(self, chunk: int, switch: Any = None, flag: str = "commit") -> Iterator[None]:
        """The pass that commits ``chunk``: the probe told ``(chunk, None)``, ``switch.flag``
        (the attention context's commit switch, when given) on for the body and off after it,
        also when it raises; then, after a body that returned, :meth:`committed`."""
        self.at(chunk, None)
        if switch is not None:
            setattr(switch, flag, True)
        try:
            yield
        finally:
            if switch is not None:
                setattr(switch, flag, False)
        self.committed()

    def chunk_done(self, done: int) -> None:
        """After a finished chunk: ``progress(done, chunks)``."""
        if self.progress is not None:
            self.progress(done, self.chunks)

    # -- the record ---------------------------------------------------------------------------

    def facts(self, split: str | None = None) -> dict[str, Any]:
        """What the video's info records of its caches: ``kv_cache_bytes`` (the peak);
        ``kv_view_bytes`` when measured; ``kv_cache_bytes_by_head`` when a cache prunes;
        ``split`` (e.g. ``kv_cache_bytes_by_cache``) -> the peak per part, when named."""
        out: dict[str, Any] = {"kv_cache_bytes": self.peak.total}
        if self.views is not None:
            out["kv_view_bytes"] = self.views  # dequantized K/V views held, all layers
        if any(c.pruning is not None for c in self.caches):
            out["kv_cache_bytes_by_head"] = dict(self.peak.by_kind)
        if split is not None:
            out[split] = dict(self.peak.by_part)
        return out
