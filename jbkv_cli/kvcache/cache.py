"""ChunkKVCache: one layer's cache of finished chunks, each token compressed once.

    cache = ChunkKVCache(KVSpec.build("rtn", 2, correction="taylor"), window=3)
    cache.commit(k, v)                          # k, v: [B, Hkv, L_chunk, D], post-RoPE, clean
    out = cache.attend(q, k_cur, v_cur, scale)  # q: [B, Hq, Lq, D] over [cached | current]

What it does, in order:

- **commit** stores a finished chunk through the variant's key and value methods
  (:class:`~jbkv_cli.kvcache.spec.KVSpec`). A token is compressed once and never again: the first
  ``sink_chunks`` chunks stay in full precision for good (attention sinks), and a method with a
  full-precision residual (KIVI) keeps the newest ``residual_tokens`` tokens exact until newer
  chunks push them out, then compresses just those tokens.
- **evict** drops whole regular chunks beyond ``window`` (sinks are never evicted).
- **read** dequantizes the sinks plus the last ``last`` chunks into a working buffer with their
  key steps (zeros for exact tokens); ``keep_view`` keeps that buffer until the next commit
  (default on CPU, where denoising steps re-read it) or drops it after each call (default on GPU).
- **attend** runs :func:`~jbkv_cli.attention.attend` with the variant's correction, and feeds the
  ``observer`` it was given (diagnostics) every ``observer.every``-th call. When a method
  ``needs_queries`` (QuantWM), the queries of each attention call are added to ``pending``
  (:class:`~jbkv_cli.quant.queries.QueryStats`); a commit stores its chunk with ``queries``,
  the history of the queries attended with before the *previous* commit (those of earlier
  chunks, QuantWM's ``M^{t−1}``, App. C.3), and only then folds ``pending`` (this chunk's
  denoising and refresh queries) into ``queries``. The first chunk is stored with no history.

``nbytes`` is what the stored tensors hold (codes, steps, zero points, centroids, exact tokens).
``coverage()`` counts the token-rows held and, of them, stored compressed; under
:func:`~jbkv_cli.kvcache.coverage.counting` every commit adds it to the active count
(:mod:`jbkv_cli.kvcache.coverage`: a variant that compresses nothing shows as such).

**Spans** (QuantVideoGen's policy, :mod:`jbkv_cli.kvcache.spans`). A method whose
``cache_policy()`` is not per chunk keeps finished chunks exact until their span is due, then
compresses the span's chunks still held with one call (one codebook); a compressed span is held,
and counted, whole until its last chunk is evicted. Sink chunks past the policy's
``sink_keep_chunks`` are compressed as spans of their own.

**Pre-RoPE keys** (``rope``, a :class:`~jbkv_cli.kvcache.rope.KeyRope`). Keys are committed
before RoPE with their ``position`` and rotated on every read, at that position or at the one
``positions`` gives (by commit index); the read carries the rotation (``CachedKV.key_rotation``)
so the correction follows the rotated noise (:mod:`jbkv_cli.attention.rope`). With
``rope.sinks_only`` only sink chunks are kept before RoPE; every other chunk is rotated at its
position on commit and stored post-RoPE (Rolling Forcing's layout). A read with
``sinks=False`` leaves the sinks out (Rolling Forcing's clean pass once its 21-frame span no
longer reaches the sink).

**Pruning.** With a ``spec.pruner`` the model gives each layer's cache its ``pruning`` state
(:class:`~jbkv_cli.prune.base.LayerPruning`): at commit it decides which tokens each KV head
keeps, those are stored per (batch, KV head) by the methods (prune, then quantize;
:mod:`jbkv_cli.kvcache.pruned`), later decisions remove tokens of earlier chunks, and reads
carry ``valid [B, Hkv, Lc]`` so attention masks what was dropped (and ``copies`` when a
token is held more than once: attention reads it that many times). Sinks are never pruned.
``nbytes_by_kind()`` splits the bytes by the pruner's head classes. A re-scoring pruner
(:class:`~jbkv_cli.prune.base.RescoringPruning`, FlowCache) also sees the queries of every
attention call, and at each commit every key held of the earlier pruned chunks as a read
dequantizes it, with its steps (:class:`~jbkv_cli.prune.base.HeldKeys`).

**Decisions at read** (:class:`~jbkv_cli.prune.base.ReadPruning`, Deep Forcing). The layer state
keeps each committed chunk whole and sees the queries of every attention call *before* it reads;
at the first read after a commit it may decide again on every held token (the chunk being
denoised is not stored yet), and the cache drops what it does not keep, and the chunks it
releases, before attention reads. Its sink is re-phased on every read: the first ``tokens``
held keys (:meth:`~jbkv_cli.prune.base.ReadPruning.phase`) rotated by the model's RoPE table
(``phase``, a :class:`~jbkv_cli.kvcache.rope.KeyRope`) at a shift of ``frames``: the table's
first row at that position (the token at frame ``frames``, row 0, column 0: the temporal
channels turned by ``frames·ω``, the others not at all). Quantized keys so rotated carry the
rotation for the correction (``CachedKV.key_rotation``, identity elsewhere), which a method that
stores keys in a rotated basis cannot take.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch

from jbkv_cli.attention.attend import CachedKV, attend
from jbkv_cli.attention.diagnostics import AttentionObserver
from jbkv_cli.attention.rope import KeyRotation, pair_table, rotate_pairs
from jbkv_cli.kvcache import coverage
from jbkv_cli.kvcache.coverage import Coverage
from jbkv_cli.kvcache.pruned import PrunedChunk
from jbkv_cli.kvcache.rope import KeyRope
from jbkv_cli.kvcache.spans import Span, SpanSlice, held_spans, span_members
from jbkv_cli.kvcache.spec import FULL_PRECISION, KVSpec
from jbkv_cli.prune.base import Decision, HeldKeys, LayerPruning, ReadPruning, RescoringPruning
from jbkv_cli.quant.method import ROLES, KVMethod, Role
from jbkv_cli.quant.noise import MIXED, measure_noise
from jbkv_cli.quant.policy import PER_CHUNK, SpanPolicy
from jbkv_cli.quant.queries import QueryStats
from jbkv_cli.quant.rotation import RandomHadamard
from jbkv_cli.quant.tensor import (
    DECLARED,
    UNSHRINK,
    QuantizedTensor,
    RawTensor,
    Segmented,
    compact,
    resolve_rule,
    signed_terms,
    zero_steps,
)


@dataclass
class _Side:
    """One chunk's keys or values: compressed parts, then (a residual) an exact tail."""

    parts: list[QuantizedTensor]
    tail: torch.Tensor | None = None  # tokens still exact, waiting to be compressed

    def stored(self, groups: int) -> QuantizedTensor:
        parts = self.parts + ([RawTensor(self.tail)] if self.tail is not None else [])
        return parts[0] if len(parts) == 1 else Segmented(parts, groups)

    @property
    def tail_len(self) -> int:
        return 0 if self.tail is None else self.tail.shape[-2]

    @property
    def nbytes(self) -> int:
        held = sum(p.nbytes for p in self.parts)
        return held + (0 if self.tail is None else self.tail.numel() * self.tail.element_size())


@dataclass
class _Chunk:
    sides: dict[str, _Side]
    sink: bool
    length: int
    device: torch.device
    bias_step: torch.Tensor | None = None  # bias-only ablation: the Δ the method would use
    bias_fp8: bool = False  # and its steps are FP8 values by format (QuantizedTensor.steps_fp8)
    bias_rotation: RandomHadamard | None = None
    ref: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)
    serial: int = 0  # commits before this one
    pruned: PrunedChunk | None = None  # stored per (batch, KV head) instead of ``sides``
    waiting: set[str] = field(default_factory=set)  # roles exact until their span is due
    position: int | None = None  # where its pre-RoPE keys are rotated (rope layout)

    @property
    def nbytes(self) -> int:
        held = sum(s.nbytes for s in self.sides.values())
        return held + (0 if self.pruned is None else self.pruned.nbytes)


class ChunkKVCache:
    """A sliding window of committed chunks for one attention layer."""

    def __init__(
        self,
        spec: KVSpec = FULL_PRECISION,
        window: int | None = None,
        keep_view: bool | None = None,
        observer: AttentionObserver | None = None,
        pruning: LayerPruning | None = None,
        rope: KeyRope | None = None,
        phase: KeyRope | None = None,
    ) -> None:
        if window is not None and window < 0:
            raise ValueError(f"window must be >= 0 chunks or None, got {window}")
        if (spec.pruner is None) != (pruning is None):
            raise ValueError("a cache gets its layer's pruning state exactly when the spec prunes")
        if spec.layers is not None:
            raise ValueError(
                f"{spec.label} differs by layer: give each layer's cache spec.at_layer(layer)"
            )
        self.rope = rope
        self.policies = {role: _policy(spec, role) for role in ROLES}
        _check_policies(spec, self.policies, rope)
        self.pruning = pruning
        self._rescoring = isinstance(pruning, RescoringPruning)
        self._deciding = isinstance(pruning, ReadPruning)
        if self._deciding and phase is None:
            raise ValueError(
                "a pruner deciding at read re-phases its sink: the cache needs the model's RoPE "
                "table (phase)"
            )
        self.phase = phase
        self.spec = spec
        self.window = window
        self.keep_view = keep_view
        self.observer = observer
        self.layer: int | None = None  # the model's layer index, for diagnostics (layer_caches)
        self._calls = 0
        self._reads = 0  # attention calls since the last commit: the denoising step of a read
        self.chunks: list[_Chunk] = []
        self.committed = 0
        self.peak_nbytes = 0
        self._view: tuple[tuple[int, int | None], CachedKV | None] | None = None
        self._head_dim: int | None = None
        self._layout: tuple[int, ...] | None = None  # (B, Hkv, D) of every chunk
        self.queries: QueryStats | None = None  # earlier chunks' queries: what commits use
        self.pending: QueryStats | None = None  # queries since the last commit
        if any(m is not None and m.needs_queries for m in (spec.key, spec.value)):
            self.queries, self.pending = QueryStats(), QueryStats()

    # --- storing ------------------------------------------------------------------------------

    def _method(self, role: Role) -> KVMethod | None:
        """The method storing ``role``, or None when it stays exact."""
        if not self.spec.quantized:
            return None
        return self.spec.key if role == "key" else self.spec.value

    @property
    def _signed(self) -> bool:
        """The variant reads the keys' noise model (the signed correction or its ablation)."""
        return self.spec.correction_.form == "variance"

    @property
    def _rule(self) -> str:
        """The signed rule reads are given under (:func:`~jbkv_cli.quant.tensor.signed_terms`):
        the variant's, or for the diagnostics of any other variant the default ``signed``'s."""
        return self.spec.correction_.rule if self._signed else DECLARED

    @property
    def _models_noise(self) -> bool:
        """Reads carry a noise model: the variant's own (signed) or, for the diagnostics of
        any other variant, the method's declared one under the default ``signed`` rule."""
        return self._signed or self.observer is not None

    def _pre_rope(self, sink: bool) -> bool:
        """Whether a (sink) chunk's keys are stored before RoPE."""
        return self.rope is not None and (sink or not self.rope.sinks_only)

    def _store(
        self, method: KVMethod, x: torch.Tensor, role: Role, sink: bool = False
    ) -> QuantizedTensor:
        if method.needs_queries:
            stored = method.quantize(x, role, self.queries)
        else:
            stored = method.quantize(x, role)
        if self._pre_rope(sink) and role == "key" and stored.rotation is not None:
            raise ValueError(f"{method.label} rotates keys: it cannot store them before RoPE")
        if role == "key" and self._models_noise and stored.noise_model == MIXED:
            # κ per group, FP8, counted in nbytes when the variant's correction reads it (else
            # measured for the diagnostics only: the method's own model, not stored)
            unshrink = resolve_rule(stored, self._rule) == UNSHRINK
            stored = measure_noise(x, stored, unshrink, counted=self._signed)
        return stored

    def _groups(self, role: Role) -> int:
        method = self._method(role) or self.spec.key
        return method.step_groups(self._head_dim, role) if method else 1

    def commit(self, k: torch.Tensor, v: torch.Tensor, position: int | None = None) -> None:
        """Store one finished chunk's ``k``, ``v`` ``[B, Hkv, L, D]``: post-RoPE keys, or, with
        ``rope``, keys before RoPE and the ``position`` to rotate them at."""
        if k.ndim != 4 or k.shape != v.shape:
            raise ValueError(
                f"k and v must both be [B, Hkv, L, D], got {tuple(k.shape)}, {tuple(v.shape)}"
            )
        if (self.rope is None) != (position is None):
            raise ValueError(
                "a pre-RoPE cache needs each chunk's position, a post-RoPE cache takes none"
            )
        layout = (*k.shape[:2], k.shape[3])
        if self._layout is not None and layout != self._layout:
            raise ValueError(f"chunk shape {tuple(k.shape)} does not match the cache's chunks")
        self._layout, self._head_dim = layout, k.shape[-1]
        sink = self.committed < self.spec.sink_chunks
        if position is not None and not self._pre_rope(sink):
            k, position = self.rope.rotate(k, position), None  # stored post-RoPE
        chunk = _Chunk({}, sink, k.shape[-2], k.device, serial=self.committed, position=position)
        if self.pruning is not None and not sink:
            chunk.pruned = self._commit_pruned(k, v)
        for role, x in zip(ROLES, (k, v), strict=True) if chunk.pruned is None else ():
            policy = self.policies[role]
            exact = sink and policy.keeps_sink(chunk.serial)
            method = None if exact else self._method(role)
            if method is None:
                chunk.sides[role] = _Side([RawTensor(x)])
            elif not policy.per_chunk:
                chunk.sides[role] = _Side([RawTensor(x)])  # until its span is due
                chunk.waiting.add(role)
            elif method.residual_tokens(role) > 0:
                chunk.sides[role] = _Side([], compact(x))  # compressed by _settle when pushed out
            else:
                chunk.sides[role] = _Side([self._store(method, x, role, sink)])
        keeps = sink and self.policies["key"].keeps_sink(chunk.serial)
        if self.spec.bias_only and not keeps:
            if self.policies["key"].per_chunk:
                predicted = self._store(self.spec.key, k, "key", sink)
                chunk.bias_step, chunk.bias_rotation = predicted.step, predicted.rotation
                chunk.bias_fp8 = predicted.steps_fp8
            else:
                chunk.waiting.add("bias")
        if self.observer is not None:
            chunk.ref = (k.detach().clone(), v.detach().clone())
            committed = getattr(self.observer, "committed", None)
            if committed is not None:  # keys as stored: before RoPE when position is kept
                committed(self.layer, k, v)
        self.chunks.append(chunk)
        self.committed += 1
        self._reads = 0
        self._compress_spans()
        self._settle()
        if self.queries is not None:  # this chunk's own queries count from the next commit on
            self.queries.absorb(self.pending)
            self.pending = QueryStats()
        self._evict()
        self._view = None
        self.peak_nbytes = max(self.peak_nbytes, self.nbytes)
        meter = coverage.active()
        if meter is not None and (self.spec.quantized or self.pruning is not None):
            meter.add(self.coverage())

    def _compress_spans(self) -> None:
        """Compress the span that is due now, per role (module docstring, **Spans**); under the
        bias-only ablation the keys' span only sets the steps the method would have used."""
        for role in (*ROLES, "bias"):
            policy = self.policies["key" if role == "bias" else role]
            index = policy.due(self.committed)
            if index is None:
                continue
            waiting = {c.serial: c for c in self.chunks if role in c.waiting}
            for group in span_members(policy, index, waiting, self.spec.sink_chunks):
                members = [waiting[s] for s in group]
                self._compress(role, members)

    def _compress(self, role: str, members: list[_Chunk]) -> None:
        side = "key" if role == "bias" else role
        x = torch.cat([c.sides[side].parts[0].dequantize() for c in members], dim=-2)
        method = self.spec.key if role == "bias" else self._method(side)
        stored = self._store(method, x, side, members[0].sink)
        span = Span(stored, tuple(c.serial for c in members), tuple(c.length for c in members))
        for c in members:
            c.waiting.discard(role)
            piece = SpanSlice(span, c.serial)
            if role == "bias":
                c.bias_step, c.bias_rotation = piece.step, piece.rotation
                c.bias_fp8 = piece.steps_fp8
            else:
                c.sides[side] = _Side([piece])

    def _stored_as(self, role: Role, x: torch.Tensor) -> QuantizedTensor:
        method = self._method(role)
        return RawTensor(x) if method is None else self._store(method, x, role)

    def _commit_pruned(self, k: torch.Tensor, v: torch.Tensor) -> PrunedChunk:
        """Prune the new chunk, and earlier chunks' tokens decided now; store what is kept."""
        if self._rescoring:
            decision = self.pruning.rescore(self.committed, k, self._held_keys())
        else:
            decision = self.pruning.commit(self.committed, k)
        self._settle_decision(decision)
        return PrunedChunk(k, v, decision.keep, self._stored_as, decision.held.get(self.committed))

    def _settle_decision(self, decision: Decision) -> None:
        """Apply a decision to the chunks held: drop the tokens of earlier chunks it settles,
        remove the chunks it releases."""
        held = {c.serial: c.pruned for c in self.chunks if c.pruned is not None}
        for serial, start, keep in decision.settled:
            if serial in held:
                held[serial].drop(start, keep, decision.held.get(serial))
        gone = set(decision.released)
        if self._deciding:  # a chunk that holds no slot any more (a shape: no device read)
            gone |= {
                c.serial for c in self.chunks if c.pruned is not None and c.pruned.num_kept == 0
            }
        if gone:
            self.chunks = [c for c in self.chunks if c.serial not in gone]
            self.pruning.forget(gone)

    def _decide_at_read(self, tokens: int) -> None:
        """A :class:`ReadPruning`'s decision before the first read of a chunk of ``tokens``."""
        self._settle_decision(self.pruning.decide(self._held_keys(), tokens))
        self._view = None

    def _held_keys(self) -> HeldKeys:
        """The pruned chunks' keys as a read dequantizes them, with their steps (sink chunks,
        never pruned, left out): what a re-scoring pruner scores again."""
        chunks = [c for c in self.chunks if c.pruned is not None]
        if not chunks:
            return HeldKeys()
        groups = self._groups("key")
        parts = [c.pruned.dense(groups) for c in chunks]
        quantized = self.spec.key is not None and self.spec.quantized
        return HeldKeys(
            serials=tuple(c.serial for c in chunks),
            lengths=tuple(c.length for c in chunks),
            k=torch.cat([p[0] for p in parts], dim=-2),
            valid=torch.cat([c.pruned.kept for c in chunks], dim=-1),
            step=torch.cat([p[2] for p in parts], dim=-2) if quantized else None,
            rotation=next((p[3] for p in parts if p[3] is not None), None),
        )

    def _settle(self) -> None:
        """Compress the exact tokens that fell out of each method's residual (newest tokens)."""
        for role in ROLES:
            method = self._method(role)
            budget = method.residual_tokens(role) if method else 0
            for chunk in reversed([c for c in self.chunks if not (c.sink or c.pruned)]):
                side = chunk.sides[role]
                keep = min(side.tail_len, budget)
                budget = max(0, budget - chunk.length)
                if side.tail is None or side.tail_len == keep:
                    continue
                cut = side.tail_len - keep
                side.parts.append(self._store(method, side.tail[..., :cut, :], role))
                side.tail = side.tail[..., cut:, :].clone() if keep else None

    def _evict(self) -> None:
        if self.window is None:
            return
        regular = [c for c in self.chunks if not c.sink]
        drop = {id(c) for c in regular[: max(0, len(regular) - self.window)]}
        if self.pruning is not None:
            self.pruning.forget({c.serial for c in self.chunks if id(c) in drop})
        self.chunks = [c for c in self.chunks if id(c) not in drop]

    # --- reading ------------------------------------------------------------------------------

    @property
    def num_chunks(self) -> int:
        return len(self.chunks)

    @property
    def num_tokens(self) -> int:
        return sum(c.length for c in self.chunks)

    def _spans(self) -> list[Span]:
        """The compressed spans still held: every one with a chunk in the window."""
        return held_spans([p for c in self.chunks for s in c.sides.values() for p in s.parts])

    @property
    def nbytes(self) -> int:
        """Bytes held by the stored chunks (codes, steps, zero points or exact values; each
        held span once, whole), by the methods' fixed tables of this layer once (a KVQuant
        calibration's, :meth:`~jbkv_cli.quant.method.KVMethod.table_nbytes`) while a chunk is
        held, and by the pruner's state when pruning."""
        held = sum(c.nbytes for c in self.chunks) + sum(s.nbytes for s in self._spans())
        if self.chunks and self.spec.quantized:
            held += sum(m.table_nbytes(r) for r in ROLES if (m := self._method(r)) is not None)
        if self.pruning is not None:
            held += sum(self.pruning.nbytes_by_kind().values())
        return held

    def nbytes_by_kind(self) -> dict[str, int]:
        """``nbytes`` per class of KV head of the pruner (e.g. ``static``, ``dynamic``): kept
        tokens, their positions and the pruner's state; ``unpruned`` for sink chunks."""
        kinds = self.pruning.kinds if self.pruning is not None else ()
        out = dict.fromkeys(kinds, 0)
        for c in self.chunks:
            if c.pruned is None:
                out["unpruned"] = out.get("unpruned", 0) + c.nbytes
                continue
            for kind, held in zip(kinds, c.pruned.nbytes_by_head(), strict=True):
                out[kind] += held
        if self.pruning is not None:
            for kind, held in self.pruning.nbytes_by_kind().items():
                out[kind] = out.get(kind, 0) + held
        return out

    def coverage(self) -> Coverage:
        """What the cache holds now, in token-rows (:mod:`jbkv_cli.kvcache.coverage`): rows of
        the sides a method stores, those stored compressed (not raw: sinks, residual tails and
        chunks waiting for their span are not), and the pruned chunks' rows before and after
        pruning."""
        out = Coverage()
        if self._layout is None:
            return out
        rows = self._layout[0] * self._layout[1]  # batch rows × KV heads
        roles = [r for r in ROLES if self._method(r) is not None]
        for c in self.chunks:
            if c.pruned is not None:  # every kept token stored by the methods
                kept = c.pruned.num_kept
                out.unpruned += rows * c.length
                out.kept += kept
                out.held += kept * len(roles)
                out.compressed += kept * len(roles)
                continue
            for role in roles:
                side = c.sides[role]
                out.held += rows * side.tail_len
                for part in side.parts:
                    n = rows * part.shape[-2]
                    out.held += n
                    out.compressed += 0 if isinstance(part, RawTensor) else n
        return out

    @property
    def working_nbytes(self) -> int:
        """Bytes of the dequantized working buffer of the last read (0 when none)."""
        if self._view is None or self._view[1] is None:
            return 0
        view = self._view[1]
        return sum(t.numel() * t.element_size() for t in (view.k, view.v))

    def reset(self) -> None:
        if self.pruning is not None:
            self.pruning.forget({c.serial for c in self.chunks})
        self.chunks, self.committed, self._view, self._layout = [], 0, None, None
        if self.queries is not None:
            self.queries, self.pending = QueryStats(), QueryStats()

    def stored(self, index: int, role: Role = "key") -> QuantizedTensor:
        """What chunk ``index`` (of those held) stores for ``role``."""
        return self.chunks[index].sides[role].stored(self._groups(role))

    def _selected(self, last: int | None, sinks: bool = True) -> list[_Chunk]:
        regular = [c for c in self.chunks if not c.sink]
        if last is not None:
            regular = regular[len(regular) - last :] if last > 0 else []
        return [c for c in self.chunks if c.sink and sinks] + regular

    def read(
        self,
        last: int | None = None,
        positions: Mapping[int, int] | None = None,
        sinks: bool = True,
    ) -> CachedKV | None:
        """The sinks (unless ``sinks`` is False) plus the last ``last`` chunks (default: the
        whole window), dequantized; pre-RoPE keys rotated at their positions, or at
        ``positions[commit index]``."""
        if last is not None and last < 0:
            raise ValueError(f"last must be >= 0 chunks or None, got {last}")
        if positions and self.rope is None:
            raise ValueError("read positions need a pre-RoPE cache (rope)")
        if self._deciding and (last is not None or not sinks):
            raise ValueError("a pruner deciding at read reads the whole cache (its sink first)")
        key = (self.committed, last, tuple(sorted((positions or {}).items())), sinks)
        if self._view is not None and self._view[0] == key:
            return self._view[1]
        chunks = self._selected(last, sinks)
        view = None
        if chunks:
            try:
                view = self._assemble(chunks)
                if self.rope is not None:
                    self._rotate(view, chunks, positions or {})
                if self._deciding:
                    self._rephase(view)
            finally:
                for span in self._spans():
                    span.release()
        keep = self.keep_view
        if keep is None:
            keep = not chunks or chunks[0].device.type == "cpu"
        self._view = (key, view) if keep else None
        return view

    def _assemble(self, chunks: list[_Chunk]) -> CachedKV:
        if self.pruning is not None:
            return self._assemble_pruned(chunks)
        groups = self._groups("key")
        keys = [c.sides["key"].stored(groups) for c in chunks]
        k = torch.cat([t.dequantize() for t in keys], dim=-2)
        v = torch.cat([c.sides["value"].stored(1).dequantize() for c in chunks], dim=-2)
        if self.spec.bias_only:
            steps = [
                c.bias_step if c.bias_step is not None else zero_steps(t, groups)
                for c, t in zip(chunks, keys, strict=True)
            ]
            rotation = next((c.bias_rotation for c in chunks if c.bias_rotation), None)
        else:
            steps = [zero_steps(t, groups) for t in keys]
            rotation = next((t.rotation for t in keys if t.rotation is not None), None)
        any_step = self.spec.bias_only or any(t.quantized for t in keys)
        step = torch.cat(steps, dim=-2) if any_step and self.spec.key is not None else None
        view = CachedKV(k, v, step, rotation)
        if self.spec.bias_only:
            view.steps_fp8 = all(c.bias_fp8 for c in chunks if c.bias_step is not None)
        else:
            view.steps_fp8 = all(t.steps_fp8 for t in keys if t.quantized)
        if step is not None and self._models_noise:
            self._attach_noise(view, [signed_terms(t, groups, self._rule) for t in keys])
        if all(c.ref is not None for c in chunks):
            view.k_ref = torch.cat([c.ref[0] for c in chunks], dim=-2)
            view.v_ref = torch.cat([c.ref[1] for c in chunks], dim=-2)
        return view

    def _attach_noise(self, view: CachedKV, terms: list[tuple]) -> None:
        """Set the view's signed-correction terms from each part's ``(w, u)``
        (:func:`~jbkv_cli.quant.tensor.signed_terms`): ``k_step2``/``k_unshrink`` when the
        variant reads them, else ``noise_ref`` for the diagnostics. ``w`` None where a part
        cannot say (then nothing is attached); ``u`` ones where a part does not shrink."""
        if any(w is None for w, _ in terms):
            return
        w = torch.cat([w for w, _ in terms], dim=-2)
        u = None
        if any(x is not None for _, x in terms):
            ones = [torch.ones_like(w[..., :1]) if x is None else x for w, x in terms]
            u = torch.cat(ones, dim=-2)
        if self._signed:
            view.k_step2, view.k_unshrink = w, u
        else:
            view.noise_ref = (w, u)

    def _rotate(self, view: CachedKV, chunks: list[_Chunk], positions: Mapping[int, int]) -> None:
        """Rotate the view's pre-RoPE keys (and their exact copies) chunk by chunk at their
        read positions; record the rotation for the correction when a rotated key carries a
        quantization step (a sink-only layout with 16-bit sinks records none: the other chunks
        were quantized after RoPE)."""
        moved = [c.serial for c in chunks if c.position is None and c.serial in positions]
        if moved:
            raise ValueError(f"chunk {moved[0]} is stored post-RoPE: it cannot be re-placed")
        at = [positions.get(c.serial, c.position) for c in chunks]
        bounds = list(itertools.accumulate((c.length for c in chunks), initial=0))

        def rotated(x: torch.Tensor) -> torch.Tensor:
            parts = [
                x[..., a:b, :] if p is None else self.rope.rotate(x[..., a:b, :], p)
                for a, b, p in zip(bounds[:-1], bounds[1:], at, strict=True)
            ]
            return torch.cat(parts, dim=-2)

        view.k = rotated(view.k)
        if view.k_ref is not None:
            view.k_ref = rotated(view.k_ref)
        # rotated keys that carry a step, known from what each chunk stores (not from the
        # steps' values, which only a CPU reads for free: 16-bit sinks record no rotation on
        # every device)
        noisy = view.k_step is not None and any(
            p is not None and self._stepped(c) for c, p in zip(chunks, at, strict=True)
        )
        if noisy:
            view.key_rotation = self.rope.rotation(at, [c.length for c in chunks], view.k.shape[-1])

    def _rephase(self, view: CachedKV) -> None:
        """Rotate the first held keys (a :class:`ReadPruning`'s sink) by the temporal shift it
        states (module docstring, **Decisions at read**)."""
        tokens, frames = self.pruning.phase()
        if tokens == 0 or frames == 0:
            return
        cos, sin = (t[:1].expand(tokens, -1) for t in self.phase.tables(frames))
        pairs = self.phase.pairs

        def shifted(x: torch.Tensor) -> torch.Tensor:
            moved = rotate_pairs(x[..., :tokens, :], cos.to(x.device), sin.to(x.device), pairs)
            return torch.cat([moved, x[..., tokens:, :]], dim=-2)

        view.k = shifted(view.k)
        if view.k_ref is not None:
            view.k_ref = shifted(view.k_ref)
        if view.k_step is None:
            return
        if view.rotation is not None:
            raise ValueError("keys stored in a rotated basis cannot be re-phased")
        rest = view.k.shape[-2] - tokens
        ones = torch.ones(rest, cos.shape[-1], dtype=cos.dtype, device=cos.device)
        full_cos = torch.cat([cos, ones])
        full_sin = torch.cat([sin, torch.zeros_like(ones)])
        view.key_rotation = KeyRotation(
            pair_table(full_cos, pairs).float(), pair_table(full_sin, pairs).float(), pairs
        )

    def _stepped(self, chunk: _Chunk) -> bool:
        """Whether ``chunk``'s keys carry a quantization step: stored by a method (a part not
        raw), or under the bias-only ablation a predicted step."""
        if self.spec.bias_only:
            return chunk.bias_step is not None
        if chunk.pruned is not None:
            return True
        return any(not isinstance(p, RawTensor) for p in chunk.sides["key"].parts)

    def _assemble_pruned(self, chunks: list[_Chunk]) -> CachedKV:
        """The kept tokens at their positions, ``valid`` marking them (sinks: all), and
        ``copies`` when a token is read more than once."""
        groups = self._groups("key")
        parts = []
        for c in chunks:
            if c.pruned is not None:
                noise = self._models_noise
                parts.append((*c.pruned.dense(groups, noise, self._rule), c.pruned.counts))
                continue
            keys = c.sides["key"].stored(groups)
            valid = torch.ones(keys.shape[:-1], dtype=torch.uint8, device=c.device)
            k, v = keys.dequantize(), c.sides["value"].stored(1).dequantize()
            var = signed_terms(keys, groups, self._rule) if self._models_noise else None
            parts.append((k, v, zero_steps(keys, groups), keys.rotation, var, valid))
        k, v, steps, rotations, noise, valid = zip(*parts, strict=True)
        quantized = self.spec.key is not None and self.spec.quantized
        step = torch.cat(steps, dim=-2) if quantized else None
        rotation = next((r for r in rotations if r is not None), None)
        view = CachedKV(torch.cat(k, -2), torch.cat(v, -2), step, rotation)
        sinks = [c.sides["key"].stored(groups) for c in chunks if c.pruned is None]
        view.steps_fp8 = all(c.pruned.steps_fp8 for c in chunks if c.pruned is not None) and all(
            t.steps_fp8 for t in sinks if t.quantized
        )
        counts = torch.cat(valid, dim=-1)
        view.valid = counts > 0
        if any(c.pruned is not None and c.pruned.repeated for c in chunks):
            view.copies = counts
        if step is not None and self._models_noise:
            self._attach_noise(view, list(noise))
        if all(c.ref is not None for c in chunks):
            view.k_ref = torch.cat([c.ref[0] for c in chunks], dim=-2)
            view.v_ref = torch.cat([c.ref[1] for c in chunks], dim=-2)
        return view

    def attend(
        self,
        q: torch.Tensor,
        k_cur: torch.Tensor,
        v_cur: torch.Tensor,
        scale: float,
        last: int | None = None,
        backend: str | None = None,
        positions: Mapping[int, int] | None = None,
        sinks: bool = True,
    ) -> torch.Tensor:
        """Attention of ``q`` over ``[cached (last chunks) | current]`` with the spec's correction
        (``positions``: read positions of pre-RoPE chunks; ``sinks``: include the sinks; as
        :meth:`read`)."""
        if self._deciding:
            self.pruning.observe(q, scale)
            if self._reads == 0 and self.chunks and self.pruning.due(k_cur.shape[-2]):
                self._decide_at_read(k_cur.shape[-2])
        cached = self.read(last, positions, sinks)
        if self._rescoring:
            self.pruning.observe(q, scale)
        correction = self.spec.correction_
        out = attend(q, k_cur, v_cur, cached, scale=scale, correction=correction, backend=backend)
        if self.pending is not None:
            self.pending.update(q, k_cur.shape[-3])
        self._calls += 1
        self._reads += 1
        obs = self.observer
        if (
            obs is not None
            and cached is not None
            and cached.k_ref is not None
            and (cached.k_step is not None or cached.valid is not None)
            and self._calls % obs.every == 0
        ):
            step = self._reads - 1
            obs.observe(q, k_cur, v_cur, cached, scale, correction, layer=self.layer, step=step)
        return out


def _policy(spec: KVSpec, role: Role) -> SpanPolicy:
    """The span policy of the method storing ``role`` (per chunk when it stays exact)."""
    method = spec.key if role == "key" else spec.value
    return PER_CHUNK if method is None else method.cache_policy()


def _check_policies(spec: KVSpec, policies: dict[str, SpanPolicy], rope: KeyRope | None) -> None:
    """Refuse the combinations the cache cannot store (``ValueError``)."""
    spanned = any(not p.per_chunk or p.sink_keep_chunks is not None for p in policies.values())
    if spanned and spec.pruner is not None:
        raise ValueError(f"{spec.label}: spans and sink-keep are not implemented for pruned caches")
    for role in ROLES:
        method = spec.key if role == "key" else spec.value
        if method is not None and not policies[role].per_chunk and method.residual_tokens(role):
            raise ValueError(f"{method.label} keeps a residual of exact tokens: no spans")
    if rope is not None and spec.pruner is not None:
        raise ValueError("the pre-RoPE layout is not implemented for pruned caches")
