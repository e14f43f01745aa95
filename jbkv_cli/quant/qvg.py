"""QVG: after QuantVideoGen (Xi et al., arXiv 2602.02958; ``quant-videogen`` 0.1.0), with its
integrations' cache policy (``svg-project/Quant-VideoGen@0601468f``, :mod:`~jbkv_cli.quant.qvg_policy`).

Per quantized span ``x [..., L, D]`` of one or more finished chunks (one codebook per span and
(batch, head); keys and values clustered separately, as upstream's ``compress_kv_cache`` does):

1. **Semantic-aware smoothing + progressive residual quantization (PRQ)**, ``S`` stages: with
   ``r⁰ = x``, stage ``s`` runs seeded k-means (:mod:`jbkv_cli.quant.kmeans`) over the ``L``
   tokens of ``r^{s−1}`` per (batch, head), stores the ``K_eff`` centroids in BF16 and each
   token's cluster id as uint8, and subtracts the *stored* centroid:
   ``r^s = r^{s−1} − bf16(c^s)[a^s]``.
2. **Residual codes**: per token, blocks of ``B = group_size`` channels of ``r = r^S`` get a
   symmetric scale and ``b``-bit codes with ``m = 2^{b−1} − 1`` (INT2: levels {−1, 0, 1}; INT4:
   −7..7)::

       Δ = max(fp8_nearest(absmax / m), fp8_up(absmax / (m + ½)))     (FP8 E4M3)
       c = clamp(round(r / Δ), −m, m),   stored as c + m, bit-packed

3. **Read back**: ``x̂ = Σ_s bf16(c^s)[a^s] + c · Δ``.

Storage, all held tensors (:meth:`QVGTensor.stored`), bits per element::

    b  +  8/B  +  8·S/D  +  16·S·K_eff/L
    codes  FP8 Δ  uint8 ids  BF16 centroids

Noise model (``step``): centroids and ids are stored exactly and the residual was taken
against the stored centroids, so the only rounding noise is the residual's: uniform with step
``Δ`` (the level spacing), ``step [..., L, D/B]``; a block with ``absmax = 0`` stores ``Δ = 0``
and is exact.

Choices where upstream or the paper leave room (the reasons we label it "after QuantVideoGen"):

- **Scale rounding.** Upstream (``real/quant_pack.py``) casts ``absmax/m`` to FP8 E4M3, i.e.
  rounds to nearest, then clamps the codes. For normal FP8 scales (≥ 2⁻⁶) that never clips
  beyond ``Δ/2``: rounding to nearest loses at most 1/16 of the scale, so ``absmax/Δ ≤ m·16/15
  < m + ½`` for ``m ∈ {1, 7}``. Among FP8 subnormals the relative loss can reach ½ and a scale
  below 2⁻¹⁰ rounds to 0 (upstream then divides by zero). jbkv keeps the nearest scale and
  raises it only where it would clip: to the smallest FP8 value with ``absmax ≤ (m + ½)·Δ``.
  So ``|x − x̂| ≤ Δ/2`` always holds, and every normal-range scale equals upstream's.
- **Codes round half to even** (``torch.round``); upstream rounds half away from zero.
- **Seeded init.** Upstream draws initial centroids with ``torch.randint`` from the global RNG
  (with replacement, unseeded); jbkv draws ``K_eff`` distinct tokens with a ``torch.Generator``
  seeded by ``seed`` per chunk, so runs are deterministic.
- **Iterations.** Default ``iters = 2``, as in upstream's Self-Forcing, HY-WorldPlay and
  LingBot-v2 scripts (``kmeans_max_iters=2``). Upstream stops early on a change rate below
  1e-4 (a host read per round); jbkv runs all ``iters`` rounds with no host read, stopping
  early only on a CPU when no assignment changes, which gives the same result
  (:mod:`~jbkv_cli.quant.kmeans`).
- **K rule** (``tokens_per_centroid`` None, the default). Upstream always uses K = 256
  (Self-Forcing: 8 chunks of 4,680 tokens share it, ≈146 tokens per centroid; LingBot-v2 per
  chunk, ≈18). Where a span holds ≥ 16·K tokens (every real model: one Self-Forcing chunk is
  4,680 ≥ 4,096) K is used as asked. Below that — the embedded model's 256-token chunks, where
  K = 256 would give every token its own centroid (lossless, ≈18 bits/element) — ``K_eff =
  min(K, L // 64)``: the BF16 codebook costs ≤ 0.25 bit/element. An explicit
  ``tokens_per_centroid`` is that cap everywhere (0: none, ``K_eff = min(K, L)``). For a model
  the rule is resolved from its chunk size, so the label says which applies (``K256`` or
  ``K≤L/64``). The stored centroid count is what storage counts.
- **Stages** ``S ≥ 0``; ``S = 0`` is plain symmetric absmax quantization (no smoothing), an
  ablation upstream's dequantizer does not accept. K ≤ 256 (uint8 ids, as upstream).
- Not reproduced: the Triton kernels (this is CPU-friendly torch), the ``-clip`` variants, the
  asymmetric option and BF16 scales.

Cache policy (the cache carries it out, :mod:`jbkv_cli.kvcache.spans`; upstream's rules and
lines in :mod:`~jbkv_cli.quant.qvg_policy`):

- ``span_chunks`` N: chunks ``[kN, (k+1)N)`` share one codebook; they stay 16-bit (and count
  as 16-bit) until the span is full and ``keep_recent_chunks`` newer chunks are committed, then
  the chunks of it still in the window are quantized together. A quantized span is held whole
  until its last chunk leaves the window (upstream's ``evict_range``).
- ``sink_keep_chunks``: the first attention-sink chunks that stay 16-bit; the model's other sink
  chunks are quantized as spans of their own. None keeps every sink chunk 16-bit (jbkv's rule).
- ``layout``: ``pre-rope`` caches keys before RoPE and rotates them on read at their stored
  positions (upstream's Self-Forcing integration); the correction then follows the rotated
  noise (:mod:`jbkv_cli.attention.rope`: unchanged for QVG's blocks of whole RoPE pairs).
- None (the defaults) means "as upstream runs the model" (:meth:`QVG.for_model`, per model in
  :data:`~jbkv_cli.quant.qvg_policy.INTEGRATIONS`: Self-Forcing N = 8, pre-RoPE; HY-WorldPlay
  N = 2, post-RoPE, on its rebuilt memory; Matrix-Game-2.0 per chunk, ``N1``, jbkv's choice
  for caches of one finished chunk; LongLive, SkyReels-V2, MAGI-1 and Rolling Forcing, which
  have no QVG script, LingBot-v2's 1/1/1, post-RoPE); where nothing is filled in (the embedded
  model, direct use), every chunk is quantized at its commit, post-RoPE, every sink kept. How
  much of the cache a policy really quantized is measured per run
  (:mod:`jbkv_cli.kvcache.coverage`): Self-Forcing's N = 8 quantizes nothing in a video of
  fewer than 9 chunks, and its rows say so.
- Differences: jbkv stores a chunk's clean (t = 0) keys and values once, at its commit; upstream
  writes the noisy ones of every step into the chunk's slot before the clean pass overwrites
  them. jbkv's cache holds the current chunk outside the cache; upstream's ``local_attn_size``
  counts it (jbkv's ``window`` = upstream's rolling chunks − 1; quantizing before evicting keeps
  upstream's clamp to the window). Pre-RoPE keys are rotated in the model's table dtype
  (float32), upstream in float64.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from jbkv_cli.quant.groupwise import (
    STEP_DTYPE,
    check_group_size,
    pack_codes,
    round_up_fp8,
    unpack_codes,
)
from jbkv_cli.quant.kmeans import (
    CENTROID_DTYPE,
    DEFAULT_MAX_ELEMENTS,
    MAX_CENTROIDS,
    MAX_ITERS,
    MAX_TOKENS_PER_CENTROID,
    Draws,
    kmeans,
)
from jbkv_cli.quant.method import MAX_GROUP_SIZE, KVMethod, Role
from jbkv_cli.quant.policy import SpanPolicy
from jbkv_cli.quant.qvg_policy import LAYOUTS, effective_centroids, integration, resolved_cap
from jbkv_cli.quant.tensor import MIXED, QuantizedTensor
from jbkv_cli.utils.fields import MAX_SEED, option


def symmetric_levels(bits: int) -> int:
    """``m = 2^{b−1} − 1``: codes run over ``−m..m`` (INT2: 1, INT4: 7)."""
    return (1 << (bits - 1)) - 1


def symmetric_scale(absmax: torch.Tensor, bits: int) -> torch.Tensor:
    """The stored FP8 E4M3 scale of blocks with these ``absmax`` (module docstring, step 2)."""
    m = symmetric_levels(bits)
    round_up_fp8(absmax / m)  # raises the FP8 range error for a scale above 448
    nearest = (absmax / m).to(STEP_DTYPE)
    no_clip = round_up_fp8(absmax / (m + 0.5))  # the smallest scale that does not clip
    return torch.maximum(nearest.float(), no_clip.float()).to(STEP_DTYPE)


def quantize_symmetric(r: torch.Tensor, bits: int, block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric absmax codes of ``r [..., D]`` per ``block`` channels.

    Returns ``(codes, scale)``: codes uint8 ``[..., D]`` holding ``c + m`` in ``[0, 2m]``,
    scale FP8 E4M3 ``[..., D/block]``.
    """
    m = symmetric_levels(bits)
    groups = r.float().unflatten(-1, (r.shape[-1] // block, block))  # [..., G, B]
    scale = symmetric_scale(groups.abs().amax(-1), bits)
    d = scale.float().unsqueeze(-1)
    codes = (groups / torch.where(d > 0, d, 1.0)).round_().clamp_(-m, m).add_(m).to(torch.uint8)
    return codes.flatten(-2), scale


@dataclass
class QVGTensor(QuantizedTensor):
    """What QVG stores for one chunk ``[..., L, D]``: packed residual codes ``[..., L, D·b/8]``,
    FP8 scales ``[..., L, D/B]``, uint8 cluster ids ``[..., S, L]`` and BF16 centroids
    ``[..., S, K_eff, D]``."""

    codes: torch.Tensor
    scale: torch.Tensor
    ids: torch.Tensor
    centroids: torch.Tensor
    shape: torch.Size
    dtype: torch.dtype
    bits: int
    group_size: int

    def stored(self) -> dict[str, torch.Tensor]:
        return {
            "codes": self.codes,
            "scale": self.scale,
            "cluster_ids": self.ids,
            "centroids": self.centroids,
        }

    # The dead zone (|r| < Δ/2 -> 0) shrinks values to the centroid 0, the outer codes round
    # outward: both error types at once, so s is measured at commit (jbkv_cli.quant.noise).
    noise_model: ClassVar[str] = MIXED

    @property
    def step(self) -> torch.Tensor:
        return self.scale.float()

    @property
    def steps_fp8(self) -> bool:
        return self.scale.dtype == torch.float8_e4m3fn

    @property
    def stages(self) -> int:
        return self.ids.shape[-2]

    @property
    def num_centroids(self) -> int:
        """``K_eff``, the centroids stored per stage and (batch, head)."""
        return self.centroids.shape[-2]

    def smoothing(self) -> torch.Tensor:
        """``Σ_s bf16(c^s)[a^s]`` ``[..., L, D]`` (float32): what the centroids contribute."""
        dim = self.shape[-1]
        if self.stages == 0:
            return torch.zeros(self.shape, dtype=torch.float32, device=self.codes.device)
        index = self.ids.long().unsqueeze(-1).expand(*self.ids.shape, dim)  # [..., S, L, D]
        return self.centroids.float().gather(-2, index).sum(-3)

    def residual(self) -> torch.Tensor:
        """The dequantized residual ``c · Δ`` ``[..., L, D]`` (float32)."""
        m = symmetric_levels(self.bits)
        codes = unpack_codes(self.codes, self.bits, self.shape[-1]).float() - m
        groups = codes.unflatten(-1, (self.scale.shape[-1], self.group_size))
        return (groups * self.scale.float().unsqueeze(-1)).flatten(-2)

    def dequantize(self) -> torch.Tensor:
        return (self.smoothing() + self.residual()).to(self.dtype)


MAX_STAGES = 8
MAX_SPAN_CHUNKS = 4096


@dataclass(frozen=True)
class QVG(KVMethod):
    """``group_size`` is QVG's ``B`` (channels per FP8 scale); ``stages`` S, ``centroids`` K
    (≤ 256), ``iters`` of k-means, ``seed`` of its init, ``tokens_per_centroid`` the K cap
    (None: the K rule; ``K_eff = min(K, L // tokens_per_centroid)``, 0: no cap); the cache
    policy ``span_chunks``, ``keep_recent_chunks``, ``sink_keep_chunks`` and ``layout``
    (None: as upstream runs the model). See the module docstring."""

    name: ClassVar[str] = "qvg"
    summary: ClassVar[str] = (
        "after QuantVideoGen: seeded k-means over spans of chunks (S stages, K = 256, or L/64 "
        "for small chunks, BF16), symmetric residual codes, FP8 scales per B channels; spans, "
        "guards and pre-RoPE keys as its integrations"
    )
    SUPPORTED_BITS: ClassVar[tuple[int, ...]] = (2, 4)
    noise_model: ClassVar[str] = MIXED

    group_size: int = option(64, "int", lo=1, hi=MAX_GROUP_SIZE, cli=False)
    stages: int = option(1, "int", lo=0, hi=MAX_STAGES)
    centroids: int = option(256, "int", lo=1, hi=MAX_CENTROIDS, note="uint8 cluster ids")
    iters: int = option(2, "int", lo=1, hi=MAX_ITERS)
    seed: int = option(0, "int", lo=0, hi=MAX_SEED)
    tokens_per_centroid: int | None = option(
        None, "int", lo=0, hi=MAX_TOKENS_PER_CENTROID, optional=True, note="none: the K rule"
    )
    span_chunks: int | None = option(
        None, "int", lo=1, hi=MAX_SPAN_CHUNKS, optional=True, note="chunks per codebook"
    )
    keep_recent_chunks: int | None = option(None, "int", lo=0, hi=MAX_SPAN_CHUNKS, optional=True)
    sink_keep_chunks: int | None = option(
        None, "int", lo=0, hi=MAX_SPAN_CHUNKS, optional=True, note="none: every sink chunk"
    )
    layout: str | None = option(None, "str", choices=LAYOUTS, optional=True, note="keys")

    def check(self, head_dim: int) -> None:
        check_group_size(head_dim, self.group_size)
        per_byte = 8 // self.bits
        if head_dim % per_byte:
            raise ValueError(f"INT{self.bits} packing needs a head dim divisible by {per_byte}")

    def effective_centroids(self, tokens: int) -> int:
        """``K_eff`` for a span of ``tokens`` tokens (the K rule, or the cap asked for)."""
        return effective_centroids(self.centroids, tokens, self.tokens_per_centroid)

    def cache_policy(self) -> SpanPolicy:
        """Spans, keep-recent and sink-keep (module docstring); per chunk where None."""
        return SpanPolicy(
            self.span_chunks or 1, self.keep_recent_chunks or 0, self.sink_keep_chunks
        )

    def key_layout(self) -> str:
        return self.layout or "post-rope"

    def for_model(
        self, model: str, chunk_tokens: int | None = None, *, pruned: bool = False
    ) -> QVG:
        """The options left None filled in as upstream runs ``model`` (``name`` or
        ``name:config``; :mod:`~jbkv_cli.quant.qvg_policy`), and the K rule resolved for spans
        of ``chunk_tokens``-token chunks. A pruned cache is stored per chunk: no policy."""
        fill: dict = {}
        found = None if pruned else integration(model)
        if found is not None:
            fill = {
                "span_chunks": found.span_chunks,
                "keep_recent_chunks": found.keep_recent_chunks,
                "sink_keep_chunks": found.sink_keep_chunks,
                "layout": found.key_layout,
            }
        out = replace(self, **{k: v for k, v in fill.items() if getattr(self, k) is None})
        if chunk_tokens is not None and out.tokens_per_centroid is None:
            span = chunk_tokens * (out.span_chunks or 1)
            out = replace(out, tokens_per_centroid=resolved_cap(out.centroids, span))
        return out

    def _quantize(self, x: torch.Tensor, role: Role) -> QVGTensor:
        lead, (length, dim) = x.shape[:-2], x.shape[-2:]
        k = self.effective_centroids(length)
        residual = x.float().reshape(-1, length, dim)  # [N, L, D], N = batch · heads
        draws = Draws(self.seed)
        ids, cents = [], []
        for _ in range(self.stages):
            a, c = kmeans(residual, k, self.iters, draws, DEFAULT_MAX_ELEMENTS)
            stored = c.to(CENTROID_DTYPE)
            index = a.unsqueeze(-1).expand(-1, -1, dim)
            residual = residual - stored.float().gather(1, index)
            ids.append(a.to(torch.uint8))
            cents.append(stored)
        codes, scale = quantize_symmetric(residual, self.bits, self.group_size)
        n = residual.shape[0]
        id_t = torch.stack(ids, 1) if ids else residual.new_empty(n, 0, length, dtype=torch.uint8)
        c_t = torch.stack(cents, 1) if cents else residual.new_empty(n, 0, k, dim).bfloat16()
        return QVGTensor(
            codes=pack_codes(codes, self.bits).reshape(*lead, length, -1),
            scale=scale.reshape(*lead, length, -1),
            ids=id_t.reshape(*lead, self.stages, length),
            centroids=c_t.reshape(*lead, self.stages, k, dim),
            shape=x.shape,
            dtype=x.dtype,
            bits=self.bits,
            group_size=self.group_size,
        )

    def extra_id(self) -> list[str]:
        """Variant-id parts: non-default quantizer options, then every policy option set (a
        resolved one included, so two specs never share an id); ``tpc64`` is left out (the
        embedded model's runs made before the K rule keep their ids)."""
        parts = [f"s{self.stages}"] if self.stages != 1 else []
        parts += [f"k{self.centroids}"] if self.centroids != 256 else []
        parts += [f"it{self.iters}"] if self.iters != 2 else []
        parts += [f"ks{self.seed}"] if self.seed else []
        tpc = self.tokens_per_centroid
        parts += [f"tpc{tpc}"] if tpc is not None and tpc != 64 else []
        return parts + self._policy_parts(id_form=True)

    def _policy_parts(self, id_form: bool) -> list[str]:
        n, recent, sink = self.span_chunks, self.keep_recent_chunks, self.sink_keep_chunks
        layout = self.layout
        if id_form:
            return (
                ([f"n{n}"] if n is not None else [])
                + ([f"kr{recent}"] if recent is not None else [])
                + ([f"sk{sink}"] if sink is not None else [])
                + ([layout.replace("-", "")] if layout is not None else [])
            )
        return (
            ([f"N{n}"] if n is not None else [])
            + ([f"recent{recent}"] if recent else [])
            + ([f"sink-keep{sink}"] if sink else [])
            + (["pre-RoPE"] if layout == "pre-rope" else [])
        )

    @property
    def label(self) -> str:
        """e.g. ``INT2 qvg g64 K256 N8 pre-RoPE``: the K rule that applies (when resolved) and
        the policy, after the quantizer's options."""
        tpc = self.tokens_per_centroid
        k = [] if tpc is None else [f"K{self.centroids}" if tpc == 0 else f"K≤L/{tpc}"]
        parts = [f"s{self.stages}"] if self.stages != 1 else []
        parts += [f"it{self.iters}"] if self.iters != 2 else []
        parts += [f"ks{self.seed}"] if self.seed else []
        if tpc is None and self.centroids != 256:
            parts.append(f"k{self.centroids}")
        head = [f"INT{self.bits}", self.name, f"g{self.group_size}", *parts]
        return " ".join(head + k + self._policy_parts(id_form=False))
