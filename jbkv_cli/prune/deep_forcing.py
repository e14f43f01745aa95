"""After Deep Forcing (Yi et al. 2025, arXiv 2512.05081): Participative Compression and Deep Sink
on Self-Forcing.

Source read: the author release carried in ``Nizben/Spectral_C@ea9961aa`` (``M`` =
``wan/modules/causal_model.py``; facts as in ``/work/shared/docs/cache-methods.md`` §4, which
cites the lines). Upstream's buffer holds ``buffer`` latent frames (21) per layer, the block
being denoised included. At the **first denoising step of a new block that would overflow it**
(held + new > buffer, M:434-444), the layer scores every held token, and the new block's noisy
keys, by the sum of its last ``R`` post-RoPE queries (every attention call's, the clean pass's
included; M:110-119, 440-441), shared by all heads (M:471-479):

    fused_i = (Σ_{r ∈ last R} q_r) · k_i / (√D · H)     over the flattened H×D vector
    keep    = sink ∪ recent ∪ top_{top_c}(fused | candidates)                   (M:121-180)
    top_c   = total − sink − R,  total = min(max(min(capacity, buffer), sink + R), held + new)

``sink`` the first ``sink_frames`` frames of the video, ``recent`` the last ``R`` tokens of
[held | new block] (the new block and the newest held tokens), the candidates the others; a
token already chosen as Top-C ``max_reuse`` times is no candidate (per-token counters that move
with the token, M:152-166, 232-238). What is kept is compacted, in time order, to
``capacity`` (16) frames (M:182-260). **Deep Sink** (M:596-607): the sink's keys are rotated in
time (only the temporal RoPE channels, by ``e^{iωΔ}``, M:26-58) so that it ends where the rest
of the kept cache begins:

    sink start = f − (kept − sink) / F − sink / F        (frames; f the new block's first frame)

i.e. ``f − capacity`` at the shipped sizes; the Top-C tokens keep their phases (the Top-C
compensation branch, M:625-641, is empty when the buffer is the attention window, as shipped).
Between events the sink keeps its phase. Shipped: buffer 21, sink 10, capacity 16, R = 4 frames,
``max_reuse`` 7 (``self_forcing_dmd_sink10.yaml``, ``CausalWanModel.__init__``): 10 sink + 2 Top-C
+ 4 recent frames after an event, 19 a block later, and the next block triggers again.

**How jbkv runs it** (:class:`DeepForcingLayer`, a :class:`~jbkv_cli.prune.base.ReadPruning`).
jbkv's cache holds the clean committed chunks; the block being denoised is the current one. The
layer keeps every committed chunk whole; the cache hands it the queries of every attention call
(per-frame sums of the last ``R`` frames, float32) and, at the **first read of each chunk**,
asks whether that chunk would overflow the buffer (the held count is the layer's own bound, no
device read). If so it scores the held keys as attention reads them (dequantized) with the sum
of the window — the previous chunk's last clean frames and this chunk's first-step queries, as
upstream — and drops the tokens it does not keep before the read; the new chunk is in
``recent`` (``R`` ≥ a chunk) so it is never a candidate and its keys need no score. The sink is
re-phased on every read by rotating the first ``sink`` held keys by the model's own RoPE table
at the shift (:meth:`~jbkv_cli.kvcache.ChunkKVCache.attend`, the cache's ``phase``). The model's
cache window does not apply (the buffer bounds the cache; the window would evict the sink) and
the model keeps no sink chunks of its own.

Where jbkv differs from the source (hence "after Deep Forcing"):

- **Precision.** Scores in float32 from float32 per-frame query sums (upstream sums the bf16
  queries in bf16 and multiplies in bf16); ties in ``topk`` are the kernel's, as upstream's.
- **Sink phase.** Each read rotates the stored keys once by the whole shift; upstream rotates its
  bf16 buffer in place by each event's increment (rounding after each). The first event's shift
  is computed by the rule above; upstream hard-codes it as ``21 − capacity`` (M:600), the same
  at the shipped sizes (the first event at frame 21).
- **Held count.** The trigger and the sink phase use the layer's bound on what a lane holds
  (``total − new``); upstream uses the batch's largest kept count. They differ only when the
  reuse limit leaves fewer candidates than ``top_c`` (not at the shipped sizes).
- **Storage.** The kept tokens are stored by the variant's methods (prune, then quantize; the
  sink too: jbkv's sink chunks are a model option, this sink is the pruner's), per lane in time
  order; a quantized re-phased sink carries its rotation for the correction
  (:class:`~jbkv_cli.attention.rope.KeyRotation`), so methods that store keys in a rotated
  basis (QuaRot) are refused. Bytes are the stored tensors, their positions, and the layer's
  query sums and reuse counters (class ``participative``). A chunk none of whose tokens can be
  held any more (outside the sink, and outside ``recent`` at more than ``max_reuse`` events) is
  released, so the cache stays bounded off the CPU too, where lanes are stored at the layer's
  capacity (``min(chunk, sink + top_c + R)`` tokens).
- **Scope.** Only ``fusion="sum"`` (upstream's default; its ``max`` variant is not offered), one
  decision per layer and batch row shared by every head, as upstream. Self-Forcing only.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass
from typing import ClassVar

import torch

from jbkv_cli.prune.base import Decision, HeldKeys, KVPruner
from jbkv_cli.utils.fields import option

BUFFER_FRAMES = 21  # local_attn_size (self_forcing_dmd_sink10.yaml)
SINK_FRAMES = 10  # sink_size with PC (14 without: Deep Sink only)
CAPACITY_FRAMES = 16  # PC_capacity = 1560 · Budget (16)
RECENT_FRAMES = 4  # PC_window = 1560 · Recent (4)
MAX_REUSE = 7  # PC_topc_max_reuse as CausalWanModel passes it
MAX_FRAMES = 4096
KIND = "participative"  # one class of bytes: every head keeps the same tokens
MODELS = ("self-forcing",)  # the model the source runs


# --- the rules (pure functions) -----------------------------------------------------------------


def participation(qsum: torch.Tensor, k: torch.Tensor, query_heads: int) -> torch.Tensor:
    """``fused_i = Σ_h qsum_h · k_{g(h), i} / (√D · H)``: ``qsum [B, Hq, D]`` (the sum of the
    recent queries per query head), ``k [B, Hkv, N, D]`` (query head ``h`` reads KV head
    ``h // (Hq/Hkv)``), ``H = query_heads`` -> ``[B, N]`` float32 (M:471-479)."""
    hq, hkv = qsum.shape[-2], k.shape[-3]
    if hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of KV heads ({hkv})")
    grouped = qsum.float().unflatten(-2, (hkv, hq // hkv)).sum(-2)  # [B, Hkv, D]
    fused = torch.einsum("bhd,bhnd->bn", grouped, k.float())
    return fused / (math.sqrt(k.shape[-1]) * query_heads)


def newest(valid: torch.Tensor, count: int) -> torch.Tensor:
    """The last ``count`` tokens ``valid [..., N]`` marks (the newest held ones), as a mask."""
    if count <= 0:
        return torch.zeros_like(valid)
    after = valid.flip(-1).to(torch.int32).cumsum(-1).flip(-1)  # held tokens at or after i
    return valid & (after <= count)


def select_participants(
    scores: torch.Tensor,
    valid: torch.Tensor,
    sink: torch.Tensor,
    recent: torch.Tensor,
    top_c: int,
    counts: torch.Tensor | None = None,
    max_reuse: int = 0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(keep, chosen)`` ``[B, N]`` bool: the sink and recent tokens plus the ``top_c`` highest
    ``scores`` among the other ``valid`` ones (fewer when fewer remain), a token whose ``counts``
    reached ``max_reuse`` (> 0) excluded (M:121-180); ``chosen``: the Top-C ones."""
    allowed = valid & ~sink & ~recent
    if counts is not None and max_reuse > 0:
        allowed = allowed & (counts < max_reuse)
    chosen = torch.zeros_like(allowed)
    n = min(top_c, scores.shape[-1])
    if n > 0:
        top = scores.float().masked_fill(~allowed, float("-inf")).topk(n, dim=-1).indices
        chosen.scatter_(-1, top, allowed.gather(-1, top))
    return (valid & sink) | (valid & recent) | chosen, chosen


def budget(
    held: int, new: int, sink: int, recent: int, capacity: int, buffer: int
) -> tuple[int, int, int]:
    """``(sink, recent, top_c)`` tokens of an event over ``held + new`` candidates, as upstream
    clamps them (M:496-507): the sink and the recent window cut to the candidates, ``total =
    min(max(min(capacity, buffer), sink + recent), held + new)``, ``top_c = total − sink −
    recent``."""
    length = held + new
    recent = min(recent, length)
    sink = min(sink, length)
    total = min(max(min(capacity, buffer), sink + recent), length)
    return sink, recent, max(0, total - sink - recent)


def sink_start(frame: int, kept: int, sink: int, frame_tokens: int) -> int:
    """The frame the re-phased sink starts at (M:596-607): ``frame − (kept − sink)/F − sink/F``
    (whole frames), ``frame`` the new block's first frame, ``kept`` the tokens kept with it."""
    return frame - (kept - sink) // frame_tokens - sink // frame_tokens


# --- one layer's state --------------------------------------------------------------------------


class DeepForcingLayer:
    """One layer's decisions (module docstring). Host-known bookkeeping: the chunks held (layout
    order), the most tokens a lane holds (``bound``), the tokens committed (the next chunk's
    first position), the sink's shift; device tensors: the per-frame query sums of the window
    and the per-token reuse counts."""

    def __init__(self, kv_heads: int, frame_tokens: int, pruner: DeepForcing) -> None:
        self.kinds = (KIND,) * kv_heads
        self.frame_tokens = frame_tokens
        self.pruner = pruner
        self.window: deque[torch.Tensor] = deque(maxlen=pruner.recent_frames)  # [B, Hq, D] each
        self.query_heads = 0
        self._reset()

    def _reset(self) -> None:
        self.lengths: dict[int, int] = {}  # tokens of each chunk held, in commit order
        self.starts: dict[int, int] = {}  # each chunk's first token in the video
        self.counts: dict[int, torch.Tensor] = {}  # [B, n] uint8: Top-C selections per token
        self.misses: dict[int, int] = {}  # events a chunk spent wholly outside recent
        self.fresh: list[int] = []  # chunks committed since the last event (held whole)
        self.bound = 0
        self.tokens = 0
        self.shift = 0  # frames the sink is read later than it was committed
        self.sink_held = 0  # sink tokens at the front of the held layout

    # -- sizes in tokens -----------------------------------------------------------------------

    def _tokens(self, frames: int) -> int:
        return frames * self.frame_tokens

    @property
    def window_tokens(self) -> int:
        return self._tokens(len(self.window))

    # -- the protocol ----------------------------------------------------------------------------

    def observe(self, q: torch.Tensor, scale: float) -> None:
        """Add the call's queries ``[B, Hq, Lq, D]`` to the window, one sum per frame."""
        frames, rest = divmod(q.shape[-2], self.frame_tokens)
        if rest:
            raise ValueError(
                f"deep-forcing: {q.shape[-2]} queries are not whole frames of {self.frame_tokens}"
            )
        self.query_heads = q.shape[-3]
        sums = q.float().unflatten(-2, (frames, self.frame_tokens)).sum(-2)  # [B, Hq, F, D]
        for f in range(max(0, frames - self.pruner.recent_frames), frames):
            self.window.append(sums[..., f, :].clone())  # its own bytes, counted

    def commit(self, serial: int, k: torch.Tensor) -> Decision:
        """Keep the whole chunk (decisions come at reads)."""
        b, h, length, _ = k.shape
        if h != len(self.kinds):
            raise ValueError(f"deep-forcing was planned for {len(self.kinds)} KV heads, not {h}")
        self.lengths[serial] = length
        self.starts[serial] = self.tokens
        self.counts[serial] = torch.zeros(b, length, dtype=torch.uint8, device=k.device)
        self.misses[serial] = 0
        self.fresh.append(serial)
        self.bound += length
        self.tokens += length
        keep = torch.ones(b, h, length, dtype=torch.bool, device=k.device)
        return Decision(keep, [], {serial: (length,) * h})

    def due(self, tokens: int) -> bool:
        """Whether a new chunk of ``tokens`` overflows the buffer (M:434-444)."""
        return self.bound + tokens > self._tokens(self.pruner.buffer_frames)

    def decide(self, held: HeldKeys, tokens: int) -> Decision:
        """Participative Compression at the first read of a chunk of ``tokens`` (module
        docstring): which held tokens stay, the chunks released, the sink's new phase."""
        p = self.pruner
        if held.k is None or tuple(held.serials) != tuple(self.lengths):
            raise RuntimeError("deep-forcing: the cache holds other chunks than the layer knows")
        if not self.window:
            raise RuntimeError("deep-forcing: a read with no queries before it to score with")
        b, h, length, _ = held.k.shape
        recent = min(self._tokens(p.recent_frames), self.window_tokens)
        sink, recent, top_c = budget(
            self.bound,
            tokens,
            min(self._tokens(p.sink_frames), self.tokens),
            recent,
            self._tokens(p.capacity_frames),
            self._tokens(p.buffer_frames),
        )
        if recent < tokens:
            raise ValueError(
                f"deep-forcing: the recent window ({recent} tokens) must hold a chunk ({tokens})"
            )
        valid = held.valid[:, 0]  # [B, Lh]: every head holds the same tokens
        position = torch.arange(length, device=valid.device)
        sink_mask = (position < sink).expand_as(valid)
        recent_mask = newest(valid, recent - tokens)
        counts = torch.cat([self.counts[s] for s in held.serials], dim=-1)
        qsum = torch.stack(list(self.window)).sum(0)
        scores = participation(qsum, held.k, self.query_heads)
        keep, chosen = select_participants(
            scores, valid, sink_mask, recent_mask, top_c, counts, p.max_reuse
        )
        counts = (counts + chosen.to(torch.uint8)) * keep.to(torch.uint8)
        keep_heads = keep.unsqueeze(1).expand(b, h, length)
        settled, caps, start = [], {}, 0
        most = sink + top_c + (recent - tokens)  # the most tokens any chunk keeps
        for serial, n in zip(held.serials, held.lengths, strict=True):
            settled.append((serial, 0, keep_heads[..., start : start + n]))
            self.counts[serial] = counts[:, start : start + n]
            caps[serial] = (min(n, most),) * h
            start += n
        released = self._released(sink, recent - tokens)
        for serial in released:
            caps[serial] = (0,) * h
        kept = sink + top_c + recent
        frame = self.tokens // self.frame_tokens
        self.shift = max(0, sink_start(frame, kept, sink, self.frame_tokens)) if sink else 0
        self.sink_held = sink
        self.bound = kept - tokens
        self.fresh = []
        return Decision(keep_heads[..., :0], settled, caps, released)

    def _released(self, sink: int, recent_held: int) -> tuple[int, ...]:
        """Count, per chunk outside the sink, an event it spent wholly outside the recent tokens
        (known when the chunks held whole after it cover them); past ``max_reuse`` such events
        none of its tokens can be held (a token outside recent stays only as Top-C, at most
        ``max_reuse`` times), so it is released."""
        p = self.pruner
        released = []
        after = 0  # tokens of the chunks committed since the last event, after this one
        for serial in reversed(list(self.lengths)):
            outside = after >= recent_held
            if serial in self.fresh:
                after += self.lengths[serial]
            if self.starts[serial] < sink or not outside:
                continue
            self.misses[serial] += 1
            # a chunk committed since the last event has at most this one miss: the newest is
            # never released, so the layer never forgets every chunk by itself
            if p.max_reuse and self.misses[serial] > p.max_reuse:
                released.append(serial)
        return tuple(reversed(released))

    def phase(self) -> tuple[int, int]:
        """``(tokens, frames)``: the first ``tokens`` held keys (the sink) are read ``frames``
        later than they were committed."""
        return self.sink_held, self.shift

    def forget(self, serials: set[int]) -> None:
        """Drop what the layer knows of chunks the cache removed: released ones (their tokens
        are out of ``bound`` already) or, at a reset, every one."""
        for s in serials:
            for book in (self.lengths, self.starts, self.counts, self.misses):
                book.pop(s, None)
        self.fresh = [s for s in self.fresh if s not in serials]
        self.bound = min(self.bound, sum(self.lengths.values()))
        if not self.lengths:  # a new video
            self.window.clear()
            self._reset()

    def nbytes_by_kind(self) -> dict[str, int]:
        """The query sums of the window and the reuse counters."""
        held = sum(t.numel() * t.element_size() for t in self.window)
        held += sum(t.numel() * t.element_size() for t in self.counts.values())
        return {KIND: held} if held else {}


# --- the pruner ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class DeepForcing(KVPruner):
    """Options (module docstring; all in latent frames): ``buffer_frames`` (the buffer, the new
    block included), ``sink_frames`` (Deep Sink), ``capacity_frames`` (kept at an event, the new
    block included; raised to ``sink + R`` when they exceed it, as upstream), ``recent_frames``
    (``R``: the query window and the newest tokens kept; at least a chunk) and ``max_reuse``
    (Top-C selections a token may have; 0: no limit)."""

    name: ClassVar[str] = "deep-forcing"
    title: ClassVar[str] = "after Deep Forcing"
    short: ClassVar[str] = "deepforcing"
    summary: ClassVar[str] = (
        "after Deep Forcing: a 21-frame buffer; when a block would overflow it, keep a re-phased "
        "10-frame sink, the newest 4 frames and the top tokens by Σ recent queries · k, 16 frames"
    )
    owns_buffer: ClassVar[bool] = True
    layers_alike: ClassVar[bool] = True

    buffer_frames: int = option(BUFFER_FRAMES, "int", lo=1, hi=MAX_FRAMES)
    sink_frames: int = option(SINK_FRAMES, "int", lo=0, hi=MAX_FRAMES)
    capacity_frames: int = option(CAPACITY_FRAMES, "int", lo=1, hi=MAX_FRAMES)
    recent_frames: int = option(RECENT_FRAMES, "int", lo=1, hi=MAX_FRAMES)
    max_reuse: int = option(MAX_REUSE, "int", lo=0, hi=255)

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.capacity_frames > self.buffer_frames:
            raise ValueError(
                f"{self.name}.capacity_frames ({self.capacity_frames}) must be at most "
                f"buffer_frames ({self.buffer_frames})"
            )

    def plans(
        self, model: str, layers: int, kv_heads: int, frame_tokens: int
    ) -> list[DeepForcingLayer]:
        if model not in MODELS:
            raise ValueError(f"{self.name} runs on {', '.join(MODELS)} (its source's model)")
        return [DeepForcingLayer(kv_heads, frame_tokens, self) for _ in range(layers)]

    def check_chunks(self, chunk_frames: int) -> None:
        if chunk_frames > self.recent_frames:
            raise ValueError(
                f"{self.name}.recent_frames ({self.recent_frames}) must hold a chunk "
                f"({chunk_frames} frames)"
            )

    def extra_id(self) -> list[str]:
        defaults = (
            ("buffer_frames", BUFFER_FRAMES, "b"),
            ("sink_frames", SINK_FRAMES, "s"),
            ("capacity_frames", CAPACITY_FRAMES, "c"),
            ("recent_frames", RECENT_FRAMES, "r"),
            ("max_reuse", MAX_REUSE, "u"),
        )
        return [f"{tag}{getattr(self, k)}" for k, dflt, tag in defaults if getattr(self, k) != dflt]
