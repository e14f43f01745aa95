"""After FlowCache's KV compression (Ma et al., ICLR 2026, arXiv 2602.10825), and a scored-with-
the-correction ablation.

Source read: ``mikeallen39/FlowCache@1fdfa57a`` (``K`` = ``FlowCache4MAGI-1/inference/pipeline/
kvcompress/kv_compressor.py``, ``U`` = ``…/kvcompress/utils.py``, ``C`` = ``…/cache/
kv_compressor.py``, ``P`` = ``…/pipeline/flowcache.py``; line numbers as in
``/work/shared/docs/cache-methods.md`` §1, which cites them; FlowCache's chunk-reuse half is not a
KV method and is out of scope). FlowCache keeps a fixed buffer of ``N`` chunks; when it is full
and another chunk is about to enter, the *clean* chunks' tokens — those kept at earlier events
included — are scored again per layer and KV head, and the top ``budget`` are kept:

    importance_i = maxpool_7( mean_q softmax_i( max_{h ∈ group} τ q_h·k_i ) )   (K:86-106, U:45-96)
    redundancy_i = softmax_i( (k̂_i · Σ_j k̂_j − 1) / L ),  k̂ = k / (‖k‖ + 1e-8)   (U:117-147)
    score_i      = λ · importance_i − (1 − λ) · redundancy_i,  λ = 0.07             (K:110)
    budget       = max(clean − tokens_per_chunk, tokens_per_chunk)                  (C:239-244)

``q`` the recent post-RoPE queries (``token``: the last 50, ``frame``: the last latent frame,
``chunk``: all; K:41-49), ``τ = 1/√d``, the softmax over the ``L`` clean tokens in float32, the
GQA max over the query heads of a KV head's group taken on the logits before the softmax, the
max pool of kernel 7 (padding 3, stride 1) along the token axis. ``redundancy`` is the mean
cosine similarity to the other clean keys, ``Σ_{j≠i} cos(k_i, k_j) / L``, by the O(L·D) identity
(the O(L²) form is commented out at U:99-114). No positional weighting (every shipped config:
``no_weight``), top-``budget`` per KV head (K:171-175), **no sink protection** (the first chunk
competes like any other). Each event frees one chunk's worth of tokens.

**How jbkv runs it.** jbkv's caches hold only clean chunks (the chunks being denoised are the
current ones), so the buffer's clean part is what matters: ``clean_chunks`` ``K`` chunks'
worth, ``N`` less the chunks FlowCache's buffer holds while they are denoised (MAGI-1's window of
4: ``K = N − 4``). At each commit the layer state (:class:`FlowCacheLayer`, a
:class:`~jbkv_cli.prune.base.RescoringPruning`) counts the clean tokens — the most any lane holds
of the earlier chunks plus the new chunk's ``L`` — and when they exceed ``K·L`` scores them all
and keeps ``budget``, re-selecting among the tokens kept before (a token dropped now is removed
from the stored tensors; one dropped earlier is gone). The queries are those of the layer's last
attention call before the commit, which jbkv's loops make the committed chunk's clean pass.
The earlier chunks' keys are scored as attention reads them: dequantized from the cache. Presets
(``preset``, :data:`PRESETS`): ``magi1`` (the single-run config: N = 5, ``frame``; the default),
``vbench`` (N = 6, ``chunk``), ``physicsiq`` (N = 6, ``token``), ``skyreels-v2`` (budget_block 1,
``chunk``: the current group's queries, all its tokens).

**Storage order.** jbkv stores kept tokens in **time order**: each chunk's lanes keep their kept
positions ascending (:mod:`jbkv_cli.kvcache.pruned`), where FlowCache gathers them in score
order to the front of its buffer (K:184-190). For attention the order is nothing: the softmax
sums over the set of cached keys, and each key carries its position in its RoPE rotation, so a
permutation of the cached rows (with their values) leaves every output unchanged. It does change
what the kernel-7 pool sees at the next event, below.

**``flowcache-corrected``.** On a quantized cache the importance softmax reads keys with noise
``e``; ``E[exp(τ q·k̂)] ≈ exp(τ q·k + b)`` (Jensen), so a token whose key has larger steps looks
more important. The ablation scores with the correction jbkv applies in attention subtracted
from every logit before the GQA max: ``τ q_h·k̂_i − b_hi``, ``b_hi = (τ²/24) Σ_j Δ_ij² ‖q_hj‖²``
(the ``taylor`` form, :func:`~jbkv_cli.attention.correction.taylor_bias`, with the stored keys'
steps and rotation; zero for the new chunk's exact keys). With exact keys ``b = 0`` and it is
``flowcache``.

Where jbkv differs from the source (hence "after FlowCache"):

- **Pool order at later events.** The pool runs along the candidates in jbkv's order — the tokens
  held, in time order, then the new chunk — where FlowCache's buffer holds the tokens kept at the
  last event in that event's score order: there an earlier-kept token's 7-neighbourhood is the
  tokens ranked next to it, here the kept tokens next to it in the video. The first event
  (every candidate in time order in both) is the same.
- **When.** FlowCache skips the event once no chunk is left to enter (``cache/utils.py:136-179``),
  so its last ``window_size − 1`` clean chunks stay whole; the pruner does not know the video's
  length and compresses at every commit past ``K``. It counts the clean tokens from its own
  bookkeeping (a shape, never a read of the masks); the model's cache window still evicts whole
  chunks (their kept tokens with them): use ``--window`` larger than the video to keep what
  FlowCache keeps (no window upstream).
- **Precision.** Everything in float32 (FlowCache rounds the mean attention to the query dtype,
  bf16, before the pool; SkyReels-V2's token path has no fp32 softmax); top-``budget`` ties are
  the kernel's, as upstream's ``topk``.
- **Storage.** Bytes are what the lanes store (:mod:`jbkv_cli.kvcache.pruned`), quantized by the
  variant's methods (prune, then quantize; FlowCache is BF16); the queries kept for the next event
  are counted too (class ``scored``). Off the CPU a lane is stored at its capacity, ``min(chunk,
  budget)`` tokens, as every pruned lane is there.
- **SkyReels-V2.** Its CFG branches keep separate caches and decisions, as jbkv's SkyReels-V2
  adapter does; its full L×L cosine matrix is the identity's value. Its per-segment cache reset is
  the model's. The ``frame``/``chunk`` ``compress_strategy`` (no shipped config) and the
  positional weightings are not offered.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F

from jbkv_cli.attention.correction import taylor_bias
from jbkv_cli.prune.base import Decision, HeldKeys, KVPruner
from jbkv_cli.prune.forcing_kv_history import percent_id
from jbkv_cli.utils.fields import option

GRANULARITIES = ("token", "frame", "chunk")
QUERY_TOKENS = 50  # K:43 `query_granularity == "token"`: the last 50 queries
MIX_LAMBDA = 0.07  # mix_lambda of every shipped config
KERNEL_SIZE = 7  # K:14, not exposed in the YAMLs
EPS = 1e-8  # U:128, the key normalisation
MAX_CHUNKS = 1024
MAX_TOKENS = 2**20
KIND = "scored"  # every KV head is scored alike: one class of bytes
SCORE_ELEMENTS = 2**25  # float32 logits per block of queries scored at once (128 MiB)

# the shipped settings: ``K`` = total_cache_chunk_nums − MAGI-1's window_size 4 (SkyReels-V2:
# budget_block); the query granularity of each config (cache-methods.md §1, knobs table)
PRESETS: dict[str, dict[str, object]] = {
    "magi1": {"clean_chunks": 1, "query_granularity": "frame"},  # single_run/config.yaml: N = 5
    "vbench": {"clean_chunks": 2, "query_granularity": "chunk"},  # flowcache_vbench.yaml: N = 6
    "physicsiq": {"clean_chunks": 2, "query_granularity": "token"},  # flowcache_physicsiq: N = 6
    "skyreels-v2": {"clean_chunks": 1, "query_granularity": "chunk"},  # --budget_block 1
}
DEFAULT_PRESET = "magi1"


# --- the rules (pure functions) -----------------------------------------------------------------


def flowcache_budget(clean: int, chunk: int) -> int:
    """``max(clean − chunk, chunk)``: the tokens a lane keeps of ``clean`` clean ones, ``chunk``
    tokens per chunk (C:239-244)."""
    return max(clean - chunk, chunk)


def query_window(
    q: torch.Tensor, granularity: str, frame_tokens: int, tokens: int = QUERY_TOKENS
) -> torch.Tensor:
    """The queries ``[..., Lq, D]`` FlowCache scores with (K:41-49): the last ``tokens``
    (``token``), the last frame's ``frame_tokens`` (``frame``) or all (``chunk``)."""
    if granularity not in GRANULARITIES:
        raise ValueError(f"query granularity must be one of {GRANULARITIES}, got {granularity!r}")
    n = {"token": tokens, "frame": frame_tokens, "chunk": q.shape[-2]}[granularity]
    return q[..., max(0, q.shape[-2] - n) :, :]


def group_logits(
    q: torch.Tensor, k: torch.Tensor, scale: float, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """``max_{h ∈ group(g)} (τ q_h·k_i − b_hi)``: ``q [B, Hq, Lq, D]``, ``k [B, Hkv, N, D]``,
    ``bias [B, Hq, Lq, N]`` (None: 0) -> ``[B, Hkv, Lq, N]`` float32; query head ``h`` reads KV
    head ``h // (Hq/Hkv)`` (U:45-96: the max over the group, of the logits)."""
    hq, hkv = q.shape[-3], k.shape[-3]
    if hq % hkv:
        raise ValueError(f"query heads ({hq}) must be a multiple of KV heads ({hkv})")
    group = hq // hkv
    qg = q.float().unflatten(-3, (hkv, group))  # [B, Hkv, g, Lq, D]
    kt = k.float().transpose(-1, -2)  # [B, Hkv, D, N]
    bg = None if bias is None else bias.float().unflatten(-3, (hkv, group))
    out = None
    for member in range(group):  # one [B, Hkv, Lq, N] at a time, as upstream
        s = scale * (qg[..., member, :, :] @ kt)
        if bg is not None:
            s = s - bg[..., member, :, :]
        out = s if out is None else torch.maximum(out, s)
    return out


def attention_mass(
    q: torch.Tensor,
    k: torch.Tensor,
    scale: float,
    valid: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``mean_q softmax_i(group_logits)``: ``[B, Hkv, N]``, the softmax over the tokens ``valid
    [B, Hkv, N]`` marks (others get 0).

    The queries are taken in blocks of at most :data:`SCORE_ELEMENTS` logits (the block from the
    shapes: no device read), each block's softmax summed, the sum divided by ``Lq``: the same
    mean, without the whole ``[B, Hkv, Lq, N]`` float32 score matrix at once (on MAGI-1 4.5B at
    720p 1.6 GB, and the group max, mask and softmax hold several: the plan measured 7.6 GiB
    of cache-side bytes at an event, 1.6 GiB after blocking)."""
    lq, rows = q.shape[-2], math.prod(k.shape[:-2]) * k.shape[-2]
    block = max(1, SCORE_ELEMENTS // max(1, rows))

    def mass(part: slice) -> torch.Tensor:
        s = group_logits(q[..., part, :], k, scale, None if bias is None else bias[..., part, :])
        if valid is not None:
            s = s.masked_fill(~valid.unsqueeze(-2), float("-inf"))
        return s.softmax(dim=-1).sum(dim=-2)

    parts = [slice(a, a + block) for a in range(0, lq, block)] or [slice(0, 0)]
    return sum(mass(part) for part in parts) / lq  # no query: 0 / 0, as an empty mean


def max_pool(x: torch.Tensor, kernel: int = KERNEL_SIZE) -> torch.Tensor:
    """``max_{|j − i| ≤ kernel // 2} x_j`` along the last axis (padding ``kernel // 2``, stride 1;
    an odd ``kernel`` keeps the length; K:98-103)."""
    if kernel < 1 or kernel % 2 == 0:
        raise ValueError(f"kernel_size must be odd and >= 1, got {kernel}")
    flat = x.reshape(-1, 1, x.shape[-1])
    return F.max_pool1d(flat, kernel, stride=1, padding=kernel // 2).reshape(x.shape)


def importance(
    q: torch.Tensor,
    k: torch.Tensor,
    scale: float,
    kernel: int = KERNEL_SIZE,
    valid: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> torch.Tensor:
    """``maxpool_kernel(mean_q softmax_i(max_group τ q·k_i − b_i))``: ``[B, Hkv, N]``."""
    return max_pool(attention_mass(q, k, scale, valid, bias), kernel)


def redundancy(k: torch.Tensor, valid: torch.Tensor | None = None) -> torch.Tensor:
    """``softmax_i((k̂_i · Σ_j k̂_j − 1) / L)`` over the ``L`` tokens ``valid`` marks (others
    0), ``k̂ = k / (‖k‖ + 1e-8)``: ``[B, Hkv, N, D] -> [B, Hkv, N]`` float32. ``(k̂_i·Σ_j k̂_j −
    1)/L`` is ``Σ_{j≠i} cos(k_i, k_j) / L`` (the diagonal ``k̂_i·k̂_i`` taken as 1), in O(L·D)."""
    kf = k.float()
    unit = kf / (torch.linalg.vector_norm(kf, dim=-1, keepdim=True) + EPS)
    if valid is None:
        count: torch.Tensor | int = kf.shape[-2]
    else:
        unit = unit * valid.unsqueeze(-1)
        count = valid.sum(dim=-1, keepdim=True).clamp_min(1)
    dots = unit @ unit.sum(dim=-2).unsqueeze(-1)  # [B, Hkv, N, 1]: k̂_i · Σ_j k̂_j
    mean = (dots.squeeze(-1) - 1.0) / count
    if valid is not None:
        mean = mean.masked_fill(~valid, float("-inf"))
    return mean.softmax(dim=-1)


def flowcache_score(
    importance: torch.Tensor, redundancy: torch.Tensor, mix_lambda: float = MIX_LAMBDA
) -> torch.Tensor:
    """``λ · importance − (1 − λ) · redundancy`` (K:110)."""
    return mix_lambda * importance - (1.0 - mix_lambda) * redundancy


def select(score: torch.Tensor, budget: int, valid: torch.Tensor | None = None) -> torch.Tensor:
    """The ``budget`` highest of ``score [B, Hkv, N]`` per lane (indices, int64), a token
    ``valid`` leaves out only once no valid one remains (K:171-175: ``topk``)."""
    if valid is not None:
        score = score.masked_fill(~valid, float("-inf"))
    return score.topk(budget, dim=-1).indices


# --- one layer's state --------------------------------------------------------------------------


class FlowCacheLayer:
    """One layer's decisions (the module docstring): the last queries it saw and how many tokens
    a lane holds of the earlier chunks (``bound``: exact while no window evicted a chunk, else
    the most it can hold), both known without reading a device value."""

    def __init__(self, kv_heads: int, frame_tokens: int, pruner: FlowCache) -> None:
        self.kinds = (KIND,) * kv_heads
        self.frame_tokens = frame_tokens
        self.pruner = pruner
        self.queries: torch.Tensor | None = None  # the window of the last call's queries
        self.scale: float | None = None
        self.bound = 0  # most tokens a lane holds of the chunks before the next commit
        self.lengths: dict[int, int] = {}  # tokens of each chunk held

    # -- the protocol ----------------------------------------------------------------------------

    def observe(self, q: torch.Tensor, scale: float) -> None:
        p = self.pruner
        window = query_window(q, p.query_granularity, self.frame_tokens, p.query_tokens)
        self.queries = window if window.shape[-2] == q.shape[-2] else window.clone()
        self.scale = scale

    def commit(self, serial: int, k: torch.Tensor) -> Decision:
        """:meth:`rescore` with nothing held before (a cache handing only the new chunk)."""
        return self.rescore(serial, k, HeldKeys())

    def rescore(self, serial: int, k: torch.Tensor, held: HeldKeys) -> Decision:
        b, h, length, _ = k.shape
        if h != len(self.kinds):
            raise ValueError(f"flowcache was planned for {len(self.kinds)} KV heads, the chunk {h}")
        history = held.tokens
        self.bound = min(self.bound, history)
        clean = self.bound + length
        self.lengths[serial] = length
        if clean <= self.pruner.clean_chunks * length:  # room left: no event
            self.bound = clean
            keep = torch.ones(b, h, length, dtype=torch.bool, device=k.device)
            return Decision(keep, [], {serial: (length,) * h})
        if self.queries is None:
            raise RuntimeError("flowcache: a commit with no attention call before it to score with")
        budget = flowcache_budget(clean, length)
        keys, valid, where, step = self._candidates(k, held)
        top = select(self.score(keys, valid, step, held.rotation), budget, valid)
        keep = torch.zeros(b, h, history + length, dtype=torch.bool, device=k.device)
        # a padding slot (a token dropped before) is never kept again, even when fewer real
        # tokens than ``budget`` remain (a window evicted some): off the CPU its slot still holds
        # the token's data (:mod:`jbkv_cli.kvcache.pruned`)
        keep.scatter_(-1, where.gather(-1, top), valid.gather(-1, top))
        settled, start = [], 0
        for s, n in zip(held.serials, held.lengths, strict=True):
            settled.append((s, 0, keep[..., start : start + n]))
            start += n
        self.bound = budget
        touched = [*zip(held.serials, held.lengths, strict=True), (serial, length)]
        caps = {s: (min(n, budget),) * h for s, n in touched}
        return Decision(keep[..., history:], settled, caps)

    def forget(self, serials: set[int]) -> None:
        self.lengths = {s: n for s, n in self.lengths.items() if s not in serials}
        self.bound = min(self.bound, sum(self.lengths.values()))

    def nbytes_by_kind(self) -> dict[str, int]:
        """The queries kept for the next event."""
        if self.queries is None:
            return {}
        return {KIND: self.queries.numel() * self.queries.element_size()}

    # -- the rules -------------------------------------------------------------------------------

    def score(
        self,
        keys: torch.Tensor,
        valid: torch.Tensor,
        step: torch.Tensor | None = None,
        rotation=None,
    ) -> torch.Tensor:
        """FlowCache's score of the candidates ``keys [B, Hkv, N, D]`` (``valid`` marks the real
        ones) from the last queries; ``step [B, Hkv, N, G]``: the correction's (corrected
        pruner only)."""
        p, q = self.pruner, self.queries
        bias = None
        if p.corrected and step is not None:
            bias = taylor_bias(q, step, self.scale, rotation)
        imp = importance(q, keys, self.scale, p.kernel_size, valid, bias)
        return flowcache_score(imp, redundancy(keys, valid), p.mix_lambda)

    def _candidates(
        self, k: torch.Tensor, held: HeldKeys
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """``(keys [B, Hkv, n + L, D], valid, where, step)``: per lane the ``n = bound`` held
        tokens in time order (held ones first: a lane holding fewer pads with dropped ones,
        ``valid`` False), then the new chunk; ``where`` the position of each in ``[held | new]``;
        ``step`` the keys' steps (zeros for the new chunk; None for an exact cache)."""
        b, h, length, d = k.shape
        n, history = self.bound, held.tokens
        new = torch.arange(history, history + length, device=k.device).expand(b, h, -1)
        ones = torch.ones(b, h, length, dtype=torch.bool, device=k.device)
        if n == 0:
            step = None
            if held.step is not None:
                step = held.step.new_zeros(b, h, length, held.step.shape[-1])
            return k, ones, new, step
        order = torch.argsort((~held.valid).to(torch.uint8), dim=-1, stable=True)[..., :n]
        rows = order.unsqueeze(-1)
        keys = torch.cat([held.k.gather(-2, rows.expand(-1, -1, -1, d)).to(k.dtype), k], dim=-2)
        valid = torch.cat([held.valid.gather(-1, order), ones], dim=-1)
        step = None
        if held.step is not None:
            g = held.step.shape[-1]
            past = held.step.gather(-2, rows.expand(-1, -1, -1, g))
            step = torch.cat([past, past.new_zeros(b, h, length, g)], dim=-2)
        return keys, valid, torch.cat([order, new], dim=-1), step


# --- the pruners --------------------------------------------------------------------------------


@dataclass(frozen=True)
class FlowCache(KVPruner):
    """Options (module docstring): ``preset`` (:data:`PRESETS`; fills the options left unset,
    then stored as their values), ``clean_chunks`` (``K``: clean chunks' worth held before an
    event), ``query_granularity`` (``token``, ``frame``, ``chunk``), ``query_tokens`` (for
    ``token``), ``mix_lambda`` (``λ``) and ``kernel_size`` (odd)."""

    name: ClassVar[str] = "flowcache"
    title: ClassVar[str] = "after FlowCache"
    short: ClassVar[str] = "flowcache"
    summary: ClassVar[str] = (
        "after FlowCache: a fixed budget of clean chunks' worth of tokens, re-scored at every "
        "commit by 0.07 · pooled attention of recent queries − 0.93 · key redundancy"
    )
    corrected: ClassVar[bool] = False
    layers_alike: ClassVar[bool] = True

    preset: str | None = option(None, "str", choices=tuple(PRESETS), optional=True)
    clean_chunks: int | None = option(None, "int", lo=1, hi=MAX_CHUNKS, optional=True)
    query_granularity: str | None = option(None, "str", choices=GRANULARITIES, optional=True)
    query_tokens: int = option(QUERY_TOKENS, "int", lo=1, hi=MAX_TOKENS)
    mix_lambda: float = option(MIX_LAMBDA, "float", lo=0, hi=1)
    kernel_size: int = option(KERNEL_SIZE, "int", lo=1, hi=1023, note="odd")

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.kernel_size % 2 == 0:
            raise ValueError(f"{self.name}.kernel_size must be odd, got {self.kernel_size}")
        chosen = {**PRESETS[DEFAULT_PRESET], **PRESETS.get(self.preset or "", {})}
        for key, value in chosen.items():
            if getattr(self, key) is None:
                object.__setattr__(self, key, value)
        object.__setattr__(self, "preset", None)  # canonical: the values it stands for

    def plans(
        self, model: str, layers: int, kv_heads: int, frame_tokens: int
    ) -> list[FlowCacheLayer]:
        return [FlowCacheLayer(kv_heads, frame_tokens, self) for _ in range(layers)]

    def extra_id(self) -> list[str]:
        default = PRESETS[DEFAULT_PRESET]
        parts = []
        if self.clean_chunks != default["clean_chunks"]:
            parts.append(f"k{self.clean_chunks}")
        if self.query_granularity != default["query_granularity"]:
            parts.append(f"q{self.query_granularity}")
        if self.query_tokens != QUERY_TOKENS:
            parts.append(f"qt{self.query_tokens}")
        if self.mix_lambda != MIX_LAMBDA:
            parts.append(f"l{percent_id(self.mix_lambda)}")
        if self.kernel_size != KERNEL_SIZE:
            parts.append(f"ks{self.kernel_size}")
        return parts


@dataclass(frozen=True)
class FlowCacheCorrected(FlowCache):
    """:class:`FlowCache` scoring with the Jensen correction subtracted from the importance
    logits (module docstring); the same options."""

    name: ClassVar[str] = "flowcache-corrected"
    title: ClassVar[str] = "after FlowCache-corrected"
    short: ClassVar[str] = "flowcachecorr"
    summary: ClassVar[str] = (
        "flowcache with its importance scored with the Jensen correction subtracted "
        "(an ablation: quantized keys with larger steps no longer look more important)"
    )
    corrected: ClassVar[bool] = True
